"""My reservations: upcoming, active and past; cancel, release now, extend; on both databases."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

from app.models import Reservation
from tests.conftest import future


def _book(who, devices, start, hours=1, note=None):
    body = {"host": "node-01", "devices": devices, "start": start if isinstance(start, str) else start.isoformat(),
            "duration": f"PT{hours}H", "note": note}
    r = who.client.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": who.csrf})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _section(page: str, title: str) -> str:
    return page.split(f"<h2>{title}", 1)[1].split("</section>", 1)[0]


def _local(dt: datetime, settings) -> str:
    return dt.astimezone(settings.tz).strftime("%Y-%m-%dT%H:%M")


def test_lists_active_upcoming_and_past_with_actions(weblab, session_factory):
    active = _book(weblab.alice, [0], "now", note="now-job")
    upcoming = _book(weblab.alice, [1], future(5))
    past = _book(weblab.alice, [2], "now")
    weblab.alice.post(f"/me/reservations/{past}/end")
    _book(weblab.bob, [3], future(5))  # not alice's
    page = weblab.alice.get("/me/reservations").text
    act, up, old = _section(page, "Active"), _section(page, "Upcoming"), _section(page, "Past")
    assert f"#{active}</strong>" in act and "Release now" in act and "now-job" in act
    assert f"CUDA_VISIBLE_DEVICES={weblab.devices[0]}" in act
    assert f"#{upcoming}</strong>" in up and ">Cancel<" in up and "Change end" in up
    assert f"#{past}</strong>" in old and ">released<" in old and "Release now" not in old
    assert "bob" not in page.split("<main", 1)[1]


def test_cancel_upcoming_keeps_the_row_and_frees_the_slot(weblab, session_factory):
    start = future(6)
    rid = _book(weblab.alice, [1], start)
    r = weblab.alice.post(f"/me/reservations/{rid}/end")
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=cancelled"
    assert "Reservation cancelled." in weblab.alice.get(r.headers["location"]).text
    with session_factory() as s:
        assert s.get(Reservation, rid).status == "cancelled"
    _book(weblab.bob, [1], start)


def test_release_active_ends_it_now(weblab, session_factory):
    rid = _book(weblab.alice, [0], "now", hours=3)
    r = weblab.alice.post(f"/me/reservations/{rid}/end")
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=released"
    with session_factory() as s:
        res = s.get(Reservation, rid)
        assert res.status == "released" and res.end_at <= datetime.now(UTC)


def test_extend_moves_the_end_and_a_conflict_is_named(weblab, session_factory, settings):
    start = future(10)
    rid = _book(weblab.alice, [2], start, hours=1)
    other = _book(weblab.bob, [2], start + timedelta(hours=2), hours=1)
    r = weblab.alice.post(f"/me/reservations/{rid}/extend", {"end": _local(start + timedelta(hours=2), settings)})
    assert r.status_code == 303
    with session_factory() as s:
        assert s.get(Reservation, rid).end_at == start + timedelta(hours=2)
    r = weblab.alice.post(f"/me/reservations/{rid}/extend", {"end": _local(start + timedelta(hours=2, minutes=30), settings)})
    assert r.status_code == 409
    item = r.text.split(f'id="r{rid}"', 1)[1].split("</article>", 1)[0]
    assert "Reservation conflict" in item
    assert re.search(rf"#{other} by <strong>bob</strong> on GPU 2, <time", item)
    with session_factory() as s:
        assert s.get(Reservation, rid).end_at == start + timedelta(hours=2)


def test_bad_end_is_named_and_history_is_refused(weblab, session_factory):
    rid = _book(weblab.alice, [3], future(4))
    r = weblab.alice.post(f"/me/reservations/{rid}/extend", {"end": "soon"})
    assert r.status_code == 422 and "end: not an ISO 8601 date-time" in html.unescape(r.text)
    r = weblab.alice.post(f"/me/reservations/{rid}/extend", {"end": ""})
    assert r.status_code == 422 and "end: give the new end" in r.text
    weblab.alice.post(f"/me/reservations/{rid}/end")
    r = weblab.alice.post(f"/me/reservations/{rid}/end")
    assert r.status_code == 409 and "history cannot be changed" in r.text


def test_others_reservations_are_visible_but_not_changeable(weblab, session_factory):
    rid = _book(weblab.alice, [0], future(2))
    page = weblab.bob.get(f"/me/reservations/{rid}").text
    assert "alice" in page and "Cancel" not in page and f"export CUDA_VISIBLE_DEVICES={weblab.devices[0]}" in page
    r = weblab.bob.post(f"/me/reservations/{rid}/end")
    assert r.status_code == 403 and "belongs to alice" in r.text
    with session_factory() as s:
        assert s.get(Reservation, rid).status == "confirmed"


def test_unknown_reservation_is_a_404_page(weblab):
    r = weblab.bob.get("/me/reservations/999999")
    assert r.status_code == 404 and "<html" in r.text and "reservation 999999 not found" in r.text
    r = weblab.bob.get("/me/reservations/abc")
    assert r.status_code == 422 and "<html" in r.text and "reservation_id" in r.text
