"""A quarantined device on the pages: Now, Timeline and Book show it with its reason (Book
refuses it), and the admin page clears it. Both databases."""

from __future__ import annotations

import html

from tests.conftest import gpu, snapshot_body


def quarantine(client, weblab, index=1, checks=None):
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    devices[index]["health_checks"] = checks or [{"kind": "retired_pages_pending", "state": "bad"}]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text


def test_now_timeline_and_book_show_the_reason_and_book_refuses(client, weblab):
    quarantine(client, weblab)
    reason = "retired memory pages pending (GPU reset needed)"
    now = html.unescape(weblab.alice.get("/").text)
    assert "quarantined" in now and reason in now and "an admin clears it" in now
    assert reason in html.unescape(weblab.alice.get("/timeline").text)
    book = html.unescape(weblab.alice.get("/book?host=node-01").text)
    assert reason in book and f'value="{weblab.devices[1]}"  disabled' in book
    r = weblab.alice.post("/book", {"host": "node-01", "devices": weblab.devices[1], "start": "", "duration": "1h"})
    assert r.status_code in (409, 422) and weblab.devices[1] in html.unescape(r.text)


def test_admin_page_lists_and_clears_a_quarantine(client, weblab):
    quarantine(client, weblab, 2, [{"kind": "xid", "state": "bad", "value": 48}])
    page = html.unescape(weblab.admin.get("/admin").text)
    assert "Health quarantine" in page and "XID 48 error" in page and "Clear quarantine" in page
    assert weblab.alice.post("/admin/devices/clear-quarantine", {"uuid": weblab.devices[2]}).status_code == 403
    r = weblab.admin.post("/admin/devices/clear-quarantine", {"uuid": weblab.devices[2], "note": "GPU reset"})
    assert r.status_code == 303 and r.headers["location"] == "/admin?done=quarantine-cleared#quarantines"
    page = html.unescape(weblab.admin.get(r.headers["location"]).text)
    assert "Quarantine cleared" in page and "by user:boss: GPU reset" in page
    again = weblab.admin.post("/admin/devices/clear-quarantine", {"uuid": weblab.devices[2]})
    assert again.status_code == 409 and "is not quarantined" in html.unescape(again.text)


def test_a_quarantined_free_device_is_not_called_free(client, weblab):
    quarantine(client, weblab, 3, [{"kind": "xid", "state": "bad", "value": 79}])
    now = weblab.alice.get("/").text
    card = now[now.index(weblab.devices[3][:12]):]
    card = card[:card.index("No processes")] if "No processes" in card else card[:2000]
    assert "not bookable" in card and ">free<" not in card
    timeline = weblab.alice.get("/timeline").text
    assert '<span class="warn small">quarantined: XID 79 error</span></div>' in timeline  # no markup inside an attribute


def test_a_quarantined_device_booked_later_says_not_bookable_not_until_then(client, weblab):
    """Its badge reads "quarantined", so "until 18:00 (then bob)" beside it would read as the
    quarantine's end; it lasts until an admin clears it."""
    from tests.conftest import future

    r = weblab.bob.client.post("/api/v1/reservations", headers={"X-CSRF-Token": weblab.bob.csrf},
                               json={"host": "node-01", "devices": [3], "start": future(3).isoformat(), "duration": "PT2H"})
    assert r.status_code == 201, r.text
    quarantine(client, weblab, 3, [{"kind": "xid", "state": "bad", "value": 79}])
    now = weblab.alice.get("/").text
    card = now[now.index(weblab.devices[3][:12]):]
    holder = card[card.index('<div class="dev-holder">'):]
    holder = holder[:holder.index("</div>")]
    assert ">quarantined<" in holder and "not bookable" in holder and "until" not in holder, holder
