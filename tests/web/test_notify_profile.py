"""The profile's notice settings: choose kinds, add and remove own apprise URLs."""

from __future__ import annotations


def test_member_chooses_kinds_and_manages_own_urls_on_the_profile(weblab, client):
    alice = weblab.alice
    page = alice.get("/profile").text
    assert 'name="kind" value="waitlist" checked' in page
    r = alice.post("/profile/notices", data={"kind": ["findings", "approvals"]})
    assert r.status_code == 303
    page = alice.get("/profile").text
    assert 'value="findings" checked' in page and 'value="waitlist" checked' not in page
    prefs = alice.client.get("/api/v1/me/notice-preferences").json()
    assert prefs == {"findings": True, "approvals": True, "waitlist": False, "no_shows": False, "quarantine": False}

    bad = alice.post("/profile/notify-targets", data={"url": "nonsense://x"})
    assert bad.status_code == 422 and "apprise does not accept" in bad.text
    assert alice.post("/profile/notify-targets", data={"url": "dingtalk://secret0123456789", "label": "my bot"}).status_code == 303
    page = alice.get("/profile").text
    assert "dingtalk://…/…" in page and "my bot" in page and "secret0123456789" not in page
    target_id = alice.client.get("/api/v1/notify-targets").json()[0]["id"]
    assert weblab.bob.post(f"/profile/notify-targets/{target_id}/remove").status_code == 404
    assert alice.post(f"/profile/notify-targets/{target_id}/remove").status_code == 303
    assert "dingtalk://" not in alice.get("/profile").text.split('id="notices"')[1].split("<form")[0]
