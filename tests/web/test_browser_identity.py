"""Browser tests for directory sign-in: real headless Chromium against ``gpuroster serve``,
signing in through LDAP (a real slapd) and through the OpenID provider's own login page."""

from __future__ import annotations

import threading

import pytest

from tests.web.test_browser import chromium  # noqa: F401 - the module's Chromium fixture
from tests.web.test_ldap import DIRECTORY, SERVICE_DN, slapd  # noqa: F401 - the slapd fixture
from testkit.live import free_port, gpuroster_env, live_server
from testkit.slapd import SUFFIX

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def provider_url():
    oidc_provider_mock = pytest.importorskip("oidc_provider_mock")
    from werkzeug.serving import make_server

    users = [oidc_provider_mock.User(sub="carol", claims={"preferred_username": "carol", "email": "carol@lab.test",
                                                          "groups": ["vision"]})]
    server = make_server("localhost", 0, oidc_provider_mock.app(require_nonce=True, user_claims=users), threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    yield f"http://localhost:{server.server_port}"
    server.shutdown()


def test_sign_in_through_ldap_in_chromium(chromium, slapd, db_url, tmp_path):  # noqa: F811
    env = gpuroster_env(db_url, tmp_path / "data", GPUROSTER_LDAP_URL=slapd.url, GPUROSTER_LDAP_BIND_DN=SERVICE_DN,
                        GPUROSTER_LDAP_BIND_PASSWORD="svc-secret", GPUROSTER_LDAP_USER_BASE=f"ou=people,{SUFFIX}",
                        GPUROSTER_LDAP_GROUP_BASE=f"ou=groups,{SUFFIX}", GPUROSTER_LDAP_GROUPS='{"vision": "vision-lab"}')
    with live_server(env, migrate=False) as url:
        page = chromium.new_page()
        try:
            page.goto(url + "/profile")
            assert "/login" in page.url and "directory (LDAP) account" in page.content()
            page.fill("#username", "lina")
            page.fill("#password", "wrong-password")
            page.click("button[type=submit]")
            assert "wrong username or password" in page.content()
            page.fill("#password", "lina-password")
            page.click("button[type=submit]")
            page.wait_for_url(url + "/profile")
            body = page.content()
            assert "lina@lab.test" in body and "vision-lab" in body
        finally:
            page.close()


def test_sign_in_through_the_oidc_providers_login_page_in_chromium(chromium, provider_url, db_url, tmp_path):  # noqa: F811
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = gpuroster_env(db_url, tmp_path / "data", GPUROSTER_BASE_URL=base,
                        GPUROSTER_OIDC_DISCOVERY_URL=provider_url + "/.well-known/openid-configuration",
                        GPUROSTER_OIDC_CLIENT_ID="gpuroster", GPUROSTER_OIDC_CLIENT_SECRET="client-secret",
                        GPUROSTER_OIDC_LABEL="Lab SSO", GPUROSTER_OIDC_GROUPS='{"vision": "vision-lab"}')
    with live_server(env, migrate=False, port=port) as url:
        page = chromium.new_page()
        try:
            page.goto(url + "/login?next=/profile")
            page.click("#oidc-sign-in")
            page.wait_for_url(provider_url + "/oauth2/authorize*")
            assert "Authorize Client" in page.content()
            page.fill("input[name=sub]", "carol")
            page.click("button:has-text('Authorize')")
            page.wait_for_url(url + "/profile")
            body = page.content()
            assert "carol@lab.test" in body and "vision-lab" in body
            page.click("button:has-text('Sign out')")
            page.wait_for_url(provider_url + "/oauth2/end_session*")
        finally:
            page.close()
