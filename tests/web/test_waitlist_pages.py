"""Waitlist pages (both databases): a taken slot on the Book page offers "wait for it";
the entry shows under "My waitlist" with its place in line, is booked when the holder
releases, can be left, and bad input or someone else's entry is refused with a message."""

from __future__ import annotations

import re

from app.models import WaitlistEntry
from tests.web.conftest import count

OFFER_RE = re.compile(r'<form method="post" action="/me/waitlist".*?</form>', re.S)
HIDDEN_RE = re.compile(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">')


def _hold_all(weblab, who) -> int:
    key = re.search(r'name="idempotency_key" value="([^"]+)"', who.get("/book").text).group(1)
    r = who.post("/book", {"mode": "devices", "host": "node-01", "devices": weblab.devices, "when": "now",
                           "length": "4", "idempotency_key": key})
    assert r.status_code == 303, r.text
    return int(r.headers["location"].split("/")[3].split("?")[0])


def _offer(weblab) -> dict:
    """Alice asks for GPU 0 now for 2 h on the Book page; the 409 page offers to wait."""
    key = re.search(r'name="idempotency_key" value="([^"]+)"', weblab.alice.get("/book").text).group(1)
    r = weblab.alice.post("/book", {"mode": "devices", "host": "node-01", "devices": [weblab.devices[0]], "when": "now",
                                    "length": "2", "idempotency_key": key})
    assert r.status_code == 409, r.text
    form = OFFER_RE.search(r.text)
    assert form, "the 409 page offers no waitlist form"
    assert "Wait for it?" in form.group(0) and 'name="book" value="1" checked' in form.group(0)
    return dict(HIDDEN_RE.findall(form.group(0)))


def test_taken_slot_offers_wait_then_booked_when_the_holder_releases(weblab, session_factory):
    held = _hold_all(weblab, weblab.bob)
    fields = _offer(weblab)
    assert fields["count"] == "1" and fields["host"] == "node-01" and fields["length"] == "2"
    r = weblab.alice.post("/me/waitlist", {**fields, "within": "5", "book": "1"})
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=waiting#waitlist", r.text
    again = weblab.alice.post("/me/waitlist", {**fields, "within": "5", "book": "1"})  # a double click
    assert again.headers["location"] == r.headers["location"] and count(session_factory, WaitlistEntry) == 1
    page = weblab.alice.get("/me/reservations?done=waiting").text
    assert "Added to your waitlist" in page and "My waitlist" in page
    assert "#1 in line" in page and "Leave the waitlist" in page and "book for me" in page
    assert weblab.bob.post(f"/me/reservations/{held}/end").status_code == 303
    page = weblab.alice.get("/me/reservations").text
    assert re.search(r'Booked: <a href="/me/reservations/\d+">reservation #\d+</a>', page), page
    assert "Leave the waitlist" not in page


def test_leave_the_waitlist_and_refusals_name_the_problem(weblab, session_factory):
    _hold_all(weblab, weblab.bob)
    fields = _offer(weblab)
    bad = weblab.alice.post("/me/waitlist", {**fields, "within": "soon", "idempotency_key": "k" * 32})
    assert bad.status_code == 422 and "within: &#39;soon&#39; is not a number of hours" in bad.text
    short = weblab.alice.post("/me/waitlist", {**fields, "within": "1", "idempotency_key": "s" * 32})
    assert short.status_code == 422 and "shorter than the 2h wanted" in short.text
    far = weblab.alice.post("/me/waitlist", {**fields, "when": "at", "start": "9999-12-31T23:00", "within": "24",
                                             "idempotency_key": "f" * 32})
    assert far.status_code == 422 and "start: at most 366 days ahead" in far.text
    assert count(session_factory, WaitlistEntry) == 0
    assert weblab.alice.post("/me/waitlist", {**fields, "within": "5", "book": "0"}).status_code == 303
    with session_factory() as s:
        eid = s.query(WaitlistEntry.id).scalar()
    other = weblab.bob.post(f"/me/waitlist/{eid}/cancel")
    assert other.status_code == 403 and "belongs to alice" in other.text
    r = weblab.alice.post(f"/me/waitlist/{eid}/cancel")
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=wait-cancelled#waitlist"
    page = weblab.alice.get("/me/reservations?done=wait-cancelled").text
    assert "Waitlist entry cancelled." in page and "st-cancelled" in page
    twice = weblab.alice.post(f"/me/waitlist/{eid}/cancel")
    assert twice.status_code == 409 and "only a waiting entry can be cancelled" in twice.text


def test_free_already_tells_at_once_with_a_book_now_link(weblab):
    key = re.search(r'name="idempotency_key" value="([^"]+)"', weblab.alice.get("/book").text).group(1)
    r = weblab.alice.post("/me/waitlist", {"count": "2", "host": "node-01", "when": "now", "length": "1.5",
                                           "within": "3", "book": "0", "idempotency_key": key})
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=wait-notified#waitlist"
    page = weblab.alice.get("/me/reservations?done=wait-notified").text
    assert "book them from your waitlist below" in page and "st-notified" in page and "nothing is held for you" in page
    assert 'href="/book?mode=count&amp;count=2&amp;host=node-01&amp;length=1.5"' in page
