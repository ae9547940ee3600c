"""Credentials follow the account: password resets and changes, deactivation and loss of the
admin role end web sessions; deactivation suspends API tokens; re-activation revives no
session. Pages, API and the server CLI."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from app.models import ApiToken, AuditLog, User, WebSession
from tests.web.conftest import PASSWORD, count

NEW_PASSWORD = "a new long passphrase"


def _user_id(session_factory, name: str) -> int:
    with session_factory() as s:
        return s.scalar(select(User.id).where(User.username == name))


def _sessions(session_factory, name: str) -> int:
    return count(session_factory, WebSession, WebSession.user_id == _user_id(session_factory, name))


def test_b44_admin_password_reset_ends_sessions_and_old_cookie_creates_nothing(weblab, session_factory):
    alice = weblab.alice
    assert alice.get("/profile").status_code == 200
    r = weblab.admin.post("/admin/users/alice/password", {"password": NEW_PASSWORD})
    assert r.status_code == 303 and "password-set" in r.headers["location"]
    assert _sessions(session_factory, "alice") == 0
    # the old cookie goes to sign-in, and cannot create an API token from Profile
    assert alice.get("/profile", follow_redirects=False).status_code == 303
    tokens_before = count(session_factory, ApiToken, ApiToken.user_id == _user_id(session_factory, "alice"))
    r = alice.post("/profile/tokens", {"name": "stolen"})
    assert r.status_code in (303, 401) and "/login" in r.headers.get("location", "/login")
    assert count(session_factory, ApiToken, ApiToken.user_id == _user_id(session_factory, "alice")) == tokens_before
    # the new password works, the old one does not
    from fastapi.testclient import TestClient

    from tests.web.conftest import sign_in

    with TestClient(alice.client.app) as fresh:
        sign_in(fresh, "alice", NEW_PASSWORD)
    with session_factory() as s:
        actions = set(s.scalars(select(AuditLog.action).where(AuditLog.target == "user:alice")))
    assert {"user.password_set", "user.sessions_ended"} <= actions


def test_admin_password_too_short_is_refused_and_keeps_sessions(weblab, session_factory):
    r = weblab.admin.post("/admin/users/alice/password", {"password": "short"})
    assert r.status_code == 422 and "password: at least 8" in r.text
    assert _sessions(session_factory, "alice") == 1


def test_api_password_reset_by_admin_ends_sessions(weblab, client, session_factory, make_user):
    admin = make_user("chief", admin=True)
    r = client.patch("/api/v1/users/alice", json={"password": NEW_PASSWORD}, headers=admin.headers)
    assert r.status_code == 200, r.text
    assert _sessions(session_factory, "alice") == 0
    assert weblab.alice.get("/", follow_redirects=False).status_code == 303


def test_d12_deactivation_ends_sessions_suspends_tokens_and_reactivation_revives_no_session(
    weblab, client, session_factory, make_user
):
    carol = make_user("carol", password=PASSWORD)
    from tests.web.conftest import sign_in

    from fastapi.testclient import TestClient

    with TestClient(client.app) as browser:
        sign_in(browser, "carol")
        assert browser.get("/profile").status_code == 200
        assert client.get("/api/v1/me", headers=carol.headers).status_code == 200
        assert weblab.admin.post("/admin/users/carol", {"active": "0"}).status_code == 303
        assert _sessions(session_factory, "carol") == 0
        assert client.get("/api/v1/me", headers=carol.headers).status_code == 401  # suspended
        assert weblab.admin.post("/admin/users/carol", {"active": "1"}).status_code == 303
        # the old browser session stays ended; the token was only suspended and works again
        assert browser.get("/profile", follow_redirects=False).status_code == 303
        assert client.get("/api/v1/me", headers=carol.headers).status_code == 200


def test_losing_admin_role_ends_sessions(weblab, client, session_factory, make_user):
    make_user("deputy", admin=True, password=PASSWORD)
    from fastapi.testclient import TestClient

    from tests.web.conftest import sign_in

    with TestClient(client.app) as browser:
        sign_in(browser, "deputy")
        assert browser.get("/admin").status_code == 200
        assert weblab.admin.post("/admin/users/deputy", {"role": "member", "unix_name": "deputy"}).status_code == 303
        assert browser.get("/admin", follow_redirects=False).status_code == 303
    assert _sessions(session_factory, "deputy") == 0
    # a change that takes nothing away (unix name only) keeps sessions
    assert weblab.admin.post("/admin/users/bob", {"role": "member", "unix_name": "bobby"}).status_code == 303
    assert _sessions(session_factory, "bob") == 1


def test_member_changes_own_password_in_profile_other_sessions_end(weblab, browser_for, session_factory):
    other = browser_for("alice")  # a second browser of alice
    assert _sessions(session_factory, "alice") == 2
    r = weblab.alice.post("/profile/password", {"current_password": "wrong one here", "new_password": NEW_PASSWORD,
                                                 "confirm_password": NEW_PASSWORD})
    assert r.status_code == 403 and "current_password" in r.text
    assert _sessions(session_factory, "alice") == 2
    r = weblab.alice.post("/profile/password", {"current_password": PASSWORD, "new_password": NEW_PASSWORD,
                                                 "confirm_password": "different"})
    assert r.status_code == 422 and "confirm_password" in r.text
    r = weblab.alice.post("/profile/password", {"current_password": PASSWORD, "new_password": NEW_PASSWORD,
                                                 "confirm_password": NEW_PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/profile?done=password"
    assert weblab.alice.get("/profile").status_code == 200  # this browser stays signed in
    assert other.get("/profile", follow_redirects=False).status_code == 303
    assert _sessions(session_factory, "alice") == 1


def test_member_changes_password_over_api(weblab, client, make_user, session_factory):
    dave = make_user("dave", password=PASSWORD)
    r = client.post("/api/v1/me/password", json={"current_password": "nope nope", "new_password": NEW_PASSWORD},
                    headers=dave.headers)
    assert r.status_code == 403 and "current_password" in r.json()["detail"]
    r = client.post("/api/v1/me/password", json={"current_password": PASSWORD, "new_password": "short"},
                    headers=dave.headers)
    assert r.status_code == 422
    r = client.post("/api/v1/me/password", json={"current_password": PASSWORD, "new_password": NEW_PASSWORD},
                    headers=dave.headers)
    assert r.status_code == 200 and r.json() == {"sessions_ended": 0}
    assert client.get("/api/v1/me", headers=dave.headers).status_code == 200  # tokens keep working


@pytest.mark.commits  # a CLI command reads what the test committed
def test_admin_set_password_cli_ends_sessions(weblab, settings, session_factory, tmp_path):
    env = {"GPUROSTER_DATABASE_URL": settings.database_url, "GPUROSTER_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    gpuroster = str(Path(sys.executable).parent / "gpuroster")
    out = subprocess.run([gpuroster, "admin", "set-password", "alice", "--password-stdin"], input=NEW_PASSWORD + "\n",
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "1 web session(s) signed out" in out.stdout
    assert weblab.alice.get("/", follow_redirects=False).status_code == 303
    bad = subprocess.run([gpuroster, "admin", "set-password", "nobody", "--password-stdin"], input=NEW_PASSWORD + "\n",
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not found" in bad.stderr
