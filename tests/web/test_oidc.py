"""OIDC sign-in against a real OpenID provider process on loopback (oidc-provider-mock)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

pytestmark = pytest.mark.commits  # the provider and each signed-in app of a test read users through their own connections

oidc_provider_mock = pytest.importorskip("oidc_provider_mock")

CLAIMS = {
    "carol": {"preferred_username": "carol", "email": "carol@lab.test", "name": "Carol Chen",
              "groups": ["/vision", "nlp"]},
    "mallory@x": {"preferred_username": "mallory@x", "email": "m@x.test"},
}


TOKEN_REQUESTS: list[dict[str, list[str]]] = []


@pytest.fixture(scope="module")
def provider():
    """The provider's Flask app served by werkzeug on a free port; its token requests are recorded
    (the mock does not enforce PKCE itself, so the test checks what we send)."""
    import threading

    from werkzeug.serving import make_server

    users = [oidc_provider_mock.User(sub=sub, claims=claims) for sub, claims in CLAIMS.items()]
    flask_app = oidc_provider_mock.app(require_nonce=True, user_claims=users)
    inner = flask_app.wsgi_app

    def recording(environ, start_response):
        if environ.get("PATH_INFO") == "/oauth2/token":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            TOKEN_REQUESTS.append(parse_qs(body.decode()))
            import io

            environ["wsgi.input"] = io.BytesIO(body)
        return inner(environ, start_response)

    flask_app.wsgi_app = recording
    server = make_server("localhost", 0, flask_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_port}"
    server.shutdown()


def oidc_settings(settings, issuer: str):
    return settings.model_copy(update={
        "oidc_discovery_url": issuer + "/.well-known/openid-configuration", "oidc_client_id": "gpuroster",
        "oidc_client_secret": "client-secret", "oidc_label": "Lab SSO", "oidc_groups": {"vision": "vision-lab"},
        "oidc_manager_groups": {"nlp": "nlp-lab"},
    })


@pytest.fixture
def sso(settings, provider):
    from app.main import create_app

    with TestClient(create_app(oidc_settings(settings, provider))) as c:
        yield c


def through_provider(c: TestClient, sub: str, *, next_url: str = "/profile") -> httpx.Response:
    """Start at /login/oidc, sign in on the provider's own form as ``sub``, return our callback's answer."""
    start = c.get(f"/login/oidc?next={next_url}", follow_redirects=False)
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    q = parse_qs(urlsplit(authorize).query)
    assert q["code_challenge_method"] == ["S256"] and q["code_challenge"] and q["nonce"] and q["state"]
    form = httpx.get(authorize)
    assert form.status_code == 200 and 'name="sub"' in form.text
    back = httpx.post(authorize, data={"sub": sub}, follow_redirects=False)
    assert back.status_code == 302, back.text
    callback = urlsplit(back.headers["location"])
    assert callback.path == "/login/oidc/callback"
    return c.get(f"{callback.path}?{callback.query}", follow_redirects=False)


def test_sign_in_page_shows_the_configured_methods(sso):
    page = sso.get("/login").text
    assert "Sign in with Lab SSO" in page and 'href="/login/oidc?next=' in page


def test_oidc_code_flow_with_pkce_provisions_the_account_and_maps_groups(sso):
    from app.models import Group, GroupMember, User

    r = through_provider(sso, "carol")
    assert r.status_code == 303 and r.headers["location"] == "/profile"
    profile = sso.get("/profile")
    assert profile.status_code == 200 and "carol@lab.test" in profile.text and "vision-lab" in profile.text
    with sso.app.state.session_factory() as s:
        carol = s.scalar(select(User).where(User.username == "carol"))
        assert (carol.email, carol.display_name, carol.auth_source, carol.password_hash) == (
            "carol@lab.test", "Carol Chen", "oidc", None)
        groups = dict(s.execute(select(Group.name, GroupMember.is_manager).join(GroupMember)
                                .where(GroupMember.user_id == carol.id)).all())
    assert groups == {"vision-lab": False, "nlp-lab": True}  # the provider's nlp group manages nlp-lab
    # a second sign-in reuses the account
    assert through_provider(TestClient(sso.app), "carol").status_code == 303


def test_callback_with_a_foreign_state_is_refused(sso):
    r = through_provider(sso, "carol")
    assert r.status_code == 303
    stranger = TestClient(sso.app)  # no flow cookie: a forged or replayed callback
    again = stranger.get("/login/oidc/callback?code=abc&state=xyz", follow_redirects=False)
    assert again.status_code == 403 and "matching state" in again.text


def test_a_reused_code_is_refused_by_the_provider(sso):
    start = sso.get("/login/oidc", follow_redirects=False)
    authorize = start.headers["location"]
    back = urlsplit(httpx.post(authorize, data={"sub": "carol"}, follow_redirects=False).headers["location"])
    first = sso.get(f"{back.path}?{back.query}", follow_redirects=False)
    assert first.status_code == 303
    # the flow cookie is gone after use: replaying the same callback is refused
    second = sso.get(f"{back.path}?{back.query}", follow_redirects=False)
    assert second.status_code == 403


def test_username_claim_that_is_no_account_name_is_a_clear_422(sso):
    r = through_provider(sso, "mallory@x")
    assert r.status_code == 422 and "not a valid account name" in r.text


def test_provider_error_is_shown(sso):
    sso.get("/login/oidc", follow_redirects=False)
    state = parse_qs(urlsplit(sso.get("/login/oidc", follow_redirects=False).headers["location"]).query)["state"][0]
    r = sso.get(f"/login/oidc/callback?error=access_denied&state={state}", follow_redirects=False)
    assert r.status_code == 401 and "access_denied" in r.text


def test_provider_down_is_a_503_and_the_password_form_still_works(settings, make_user):
    from app.main import create_app
    from testkit.live import free_port

    down = oidc_settings(settings, f"http://127.0.0.1:{free_port()}").model_copy(update={"oidc_timeout_seconds": 2})
    with TestClient(create_app(down)) as c:
        r = c.get("/login/oidc", follow_redirects=False)
        assert r.status_code == 503 and "Sign-in provider unavailable" in r.text
        assert 'name="password"' in r.text


def test_logout_ends_the_provider_session_too(sso, provider):
    assert through_provider(sso, "carol").status_code == 303
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', sso.get("/profile").text).group(1)
    r = sso.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303
    loc = urlsplit(r.headers["location"])
    assert f"{loc.scheme}://{loc.netloc}" == provider and loc.path == "/oauth2/end_session"
    assert parse_qs(loc.query)["post_logout_redirect_uri"] == ["http://testserver/login"]
    assert sso.get("/profile", follow_redirects=False).status_code == 303  # our session is gone


def test_api_tokens_keep_working_with_oidc_configured(sso, make_user):
    alice = make_user("alice")
    r = sso.get("/api/v1/me", headers=alice.headers)
    assert r.status_code == 200 and r.json()["username"] == "alice"



def test_token_request_carries_the_verifier_of_the_s256_challenge(sso):
    import base64
    import hashlib

    start = sso.get("/login/oidc", follow_redirects=False)
    authorize = start.headers["location"]
    challenge = parse_qs(urlsplit(authorize).query)["code_challenge"][0]
    back = urlsplit(httpx.post(authorize, data={"sub": "carol"}, follow_redirects=False).headers["location"])
    TOKEN_REQUESTS.clear()
    assert sso.get(f"{back.path}?{back.query}", follow_redirects=False).status_code == 303
    (sent,) = TOKEN_REQUESTS
    verifier = sent["code_verifier"][0]
    assert len(verifier) >= 43 and sent["grant_type"] == ["authorization_code"]
    assert base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode() == challenge


def test_id_token_with_another_nonce_is_refused(settings, provider):
    from app.services import oidc as oidc_service

    conf = oidc_settings(settings, provider)
    started = oidc_service.begin(conf, redirect_uri="http://testserver/login/oidc/callback")
    back = urlsplit(httpx.post(started.url, data={"sub": "carol"}, follow_redirects=False).headers["location"])
    with pytest.raises(oidc_service.OidcRefused, match="did not verify"):
        oidc_service.finish(conf, code=parse_qs(back.query)["code"][0], redirect_uri="http://testserver/login/oidc/callback",
                            nonce="not-the-one-sent", code_verifier=started.code_verifier)


def test_the_service_imports_its_oidc_client_without_a_deprecation_warning():
    """Authlib warns at import that its plain-httpx client is deprecated; that notice is for
    this project, and it opened every service log, where admins took it for an error."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-W", "default", "-c", "import app.services.oidc"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "deprecated" not in out.stderr, out.stderr[-2000:]
