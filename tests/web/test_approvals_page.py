"""The Approvals page: request -> pending -> an admin approves on the page -> the member sees
it upcoming on My reservations; a late second decision is a 409 page naming the first; a
member without a managed group sees nothing to decide (both databases)."""

from __future__ import annotations

from tests.conftest import future


def _api(b, method, path, **kw):
    return b.client.request(method, "/api/v1" + path, headers={"X-CSRF-Token": b.csrf}, **kw)


def test_request_pending_admin_approves_on_the_page_member_sees_it(weblab):
    assert _api(weblab.admin, "POST", "/rules", json={"scope": "default", "approval_above_devices": 1}).status_code == 201
    r = _api(weblab.alice, "POST", "/reservations", json={"host": "node-01", "devices": [0, 1],
                                                          "start": future(30).isoformat(), "duration": "PT2H"})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    rid = r.json()["id"]
    mine = weblab.alice.get("/me/reservations").text
    assert f"#{rid}" in mine and "st-pending" in mine and "Withdraw request" in mine
    assert "Nothing awaits your approval" in weblab.bob.get("/approvals").text
    page = weblab.admin.get("/approvals")
    assert page.status_code == 200 and f'action="/approvals/{rid}"' in page.text
    done = weblab.admin.post(f"/approvals/{rid}", {"decision": "approve", "reason": "go ahead"})
    assert done.status_code == 303 and done.headers["location"] == "/approvals?done=approve"
    assert "Nothing awaits your approval" in weblab.admin.get("/approvals").text
    mine = weblab.alice.get("/me/reservations").text
    assert "st-upcoming" in mine and "st-pending" not in mine
    late = weblab.admin.post(f"/approvals/{rid}", {"decision": "deny"})
    assert late.status_code == 409 and "approve by boss" in late.text
    assert weblab.bob.post(f"/approvals/{rid}", {"decision": "deny"}).status_code == 403
