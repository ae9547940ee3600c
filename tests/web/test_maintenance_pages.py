"""An open-ended maintenance shows on Now and Timeline (labelled, ending "open-ended"), and
the pages of a lab with a year-9999 hold render (both databases)."""

from __future__ import annotations

from tests.conftest import future


def test_open_ended_maintenance_on_now_and_timeline(client, weblab):
    r = weblab.admin.client.post("/api/v1/maintenance", json={"host": "node-01", "devices": [2], "reason": "fan swap"},
                                 headers={"X-CSRF-Token": weblab.admin.csrf})
    assert r.status_code == 201, r.text
    now = weblab.alice.get("/")
    assert now.status_code == 200, now.text
    block = now.text.split(weblab.devices[2], 1)[1].split("</article>", 1)[0]
    assert "maintenance</strong> by <strong>boss</strong> until" in block and "open-ended" in block
    tl = weblab.alice.get("/timeline", params={"host": "node-01", "day": future(48).date().isoformat()})
    assert tl.status_code == 200, tl.text
    assert "maintenance: boss" in tl.text and "open-ended" in tl.text
    mine = weblab.admin.get("/me/reservations")
    assert mine.status_code == 200 and "open-ended" in mine.text
