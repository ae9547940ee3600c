"""Profile: API tokens created (shown once) and revoked by their owner; on both databases."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from sqlalchemy import select

from app.models import ApiToken


def test_token_is_shown_once_and_works_until_revoked(weblab, app, session_factory):
    r = weblab.alice.post("/profile/tokens", {"name": "laptop", "expires_days": "30"})
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    token = re.search(r'<pre class="copy" id="new-token">(gpr_[^<]+)</pre>', r.text).group(1)
    api = TestClient(app)
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()["username"] == "alice"
    page = weblab.alice.get("/profile").text
    assert token not in page and "laptop" in page and token[:10] in page
    with session_factory() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.name == "laptop"))
    r = weblab.bob.post(f"/profile/tokens/{row.id}/revoke")
    assert r.status_code == 404
    r = weblab.alice.post(f"/profile/tokens/{row.id}/revoke")
    assert r.status_code == 303 and r.headers["location"] == "/profile?done=revoked"
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert "revoked" in weblab.alice.get("/profile").text


def test_bad_expiry_is_named_and_no_token_is_made(weblab, session_factory):
    with session_factory() as s:
        before = len(list(s.scalars(select(ApiToken))))
    for value in ("soon", "0", "99999"):
        r = weblab.alice.post("/profile/tokens", {"name": "x", "expires_days": value})
        assert r.status_code == 422 and "expires_days:" in r.text and 'id="token-expires" name="expires_days" type="number" min="1" max="3650" aria-invalid="true"' in r.text
    with session_factory() as s:
        assert len(list(s.scalars(select(ApiToken)))) == before
