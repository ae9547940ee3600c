"""Booking through the form, the availability check and the errors, on both databases."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import func, select

from app.models import AuditLog, Reservation, ReservationDevice
from tests.web.conftest import count

HX = {"HX-Request": "true"}


def _local(dt: datetime, settings) -> str:
    return dt.astimezone(settings.tz).strftime("%Y-%m-%dT%H:%M")


def _form(weblab, *devices: int, when: str = "now", start: str = "", length: str = "2", note: str = "") -> dict:
    return {"mode": "devices", "host": "node-01", "devices": [weblab.devices[i] for i in devices], "when": when,
            "start": start, "length": length, "note": note}


def test_booking_two_devices_redirects_to_the_export_lines(weblab, session_factory):
    r = weblab.alice.post("/book", _form(weblab, 2, 0, note="bert"))
    assert r.status_code == 303
    m = re.fullmatch(r"/me/reservations/(\d+)\?booked=1", r.headers["location"])
    assert m
    page = weblab.alice.get(r.headers["location"]).text
    assert f"export CUDA_VISIBLE_DEVICES={weblab.devices[0]},{weblab.devices[2]}\nexport CUDA_DEVICE_ORDER=PCI_BUS_ID" in page
    assert "Booked." in page and "bert" in page
    with session_factory() as s:
        r_ = s.get(Reservation, int(m.group(1)))
        assert r_.note == "bert" and (r_.end_at - r_.start_at) == timedelta(hours=2)


def test_wall_time_start_is_read_in_the_lab_zone(weblab, session_factory, settings):
    start = (datetime.now(UTC) + timedelta(days=2)).astimezone(settings.tz).replace(hour=9, minute=30, second=0, microsecond=0)
    r = weblab.alice.post("/book", _form(weblab, 1, when="at", start=start.strftime("%Y-%m-%dT%H:%M"), length="1.5"))
    assert r.status_code == 303, r.text
    with session_factory() as s:
        res = s.query(Reservation).one()
        assert res.start_at == start.astimezone(UTC)
        assert res.end_at - res.start_at == timedelta(minutes=90)


def test_same_slot_again_names_the_conflicting_reservation(weblab, session_factory, settings):
    start = _local(datetime.now(UTC) + timedelta(hours=5), settings)
    assert weblab.alice.post("/book", _form(weblab, 0, 1, when="at", start=start)).status_code == 303
    r = weblab.bob.post("/book", _form(weblab, 1, 2, when="at", start=start))
    assert r.status_code == 409
    flash = r.text.split('id="flash"', 1)[1].split("</div>", 2)[0] + r.text.split('id="flash"', 1)[1].split("</div>", 2)[1]
    assert "Reservation conflict" in flash
    assert re.search(r"#\d+</a> by <strong>alice</strong> on GPU 1, <time", flash)  # the one of hers in the way of his
    assert start[11:] in flash  # the interval, in the lab zone
    assert "next free for this length from" in flash
    assert count(session_factory, Reservation) == 1
    assert count(session_factory, ReservationDevice) == 2
    assert 'value="' + weblab.devices[2] + '" checked' in r.text  # the form keeps what bob chose
    with session_factory() as s:  # the refusal counts in /metrics like an API 409
        assert s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == "reservation.conflict")) == 1


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"length": "abc"}, "length", "length: 'abc' is not a number of hours"),
        ({"length": "0"}, "length", "length: must be more than 0"),
        ({"when": "at", "start": ""}, "start", "start: give a start date and time"),
        ({"when": "at", "start": "2001-01-01T10:00"}, "start", "is in the past"),
        ({"when": "at", "start": "tomorrow"}, "start", "start: not an ISO 8601 date-time"),
        ({"devices": []}, "devices", "devices: choose at least one device"),
        ({"devices": ["GPU-nope"]}, "devices", "devices: 'GPU-nope' is not a device of host"),
        ({"host": ""}, "host", "host: choose a host"),
        ({"note": "x" * 2000}, "note", "note:"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(weblab, session_factory, change, field, message):
    r = weblab.alice.post("/book", {**_form(weblab, 0), **change})
    assert r.status_code == 422, r.text
    assert message in html.unescape(r.text)
    assert re.search(rf'(name="{field}"[^>]*aria-invalid="true"|aria-invalid="true"[^>]*name="{field}"|<fieldset aria-invalid="true">)', r.text)
    assert count(session_factory, Reservation) == 0
    assert count(session_factory, AuditLog, AuditLog.action == "reservation.create") == 0


def test_unknown_host_is_a_404_message_not_a_500(weblab, session_factory):
    r = weblab.alice.post("/book", {**_form(weblab, 0), "host": "nowhere"})
    assert r.status_code == 404 and "host 'nowhere' not found" in html.unescape(r.text)
    assert count(session_factory, Reservation) == 0


def test_check_shows_free_or_conflicts_and_next_free_time(weblab, settings):
    start = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(hours=3)
    params = {**_form(weblab, 0, when="at", start=_local(start, settings), length="2")}
    r = weblab.bob.get("/book/check", params=params, headers=HX)
    assert r.status_code == 200 and "HX-Request" in r.headers["vary"]
    assert "<html" not in r.text and "<strong>Free.</strong> GPU 0: no reservation" in r.text
    assert weblab.alice.post("/book", _form(weblab, 0, when="at", start=_local(start + timedelta(hours=1), settings))).status_code == 303
    r = weblab.bob.get("/book/check", params=params, headers=HX)
    assert "<strong>Not free.</strong>" in r.text and "by <strong>alice</strong> on GPU 0" in r.text
    # alice holds [start+1h, start+3h): bob's 2 hours fit first at start+3h
    free = start + timedelta(hours=3)
    assert f'<time datetime="{free.isoformat().replace("+00:00", "Z")}"' in r.text
    link = re.search(r'<a href="(/book\?[^"]+)">Start then</a>', r.text).group(1).replace("&amp;", "&")
    q = parse_qs(urlsplit(link).query)
    assert q["start"] == [_local(free, settings)] and q["devices"] == [weblab.devices[0]] and q["when"] == ["at"]


def test_check_without_devices_is_a_hint_and_bad_input_a_message(weblab):
    r = weblab.bob.get("/book/check", params={"mode": "devices", "host": "node-01"}, headers=HX)
    assert r.status_code == 200 and "Choose devices, a start and a length" in r.text
    r = weblab.bob.get("/book/check", params={**_form(weblab, 0), "length": "-3"}, headers=HX)
    assert r.status_code == 200 and "length: must be more than 0" in r.text


def test_check_without_htmx_renders_the_whole_form(weblab):
    r = weblab.bob.get("/book/check", params=_form(weblab, 0, 1))
    assert "<html" in r.text and "<strong>Free.</strong> GPU 0, GPU 1" in r.text
    assert f'value="{weblab.devices[1]}" checked' in r.text


def test_book_page_is_prefilled_from_the_query(weblab):
    r = weblab.alice.get("/book", params={"host": "node-01", "devices": weblab.devices[3], "when": "at",
                                          "start": "2031-05-04T10:15", "length": "3"})
    assert f'value="{weblab.devices[3]}" checked' in r.text
    assert 'value="2031-05-04T10:15"' in r.text and 'name="length" type="number"' in r.text and 'value="3"' in r.text
    assert 'name="when" value="at" checked' in r.text


def test_the_form_offers_first_a_host_whose_agent_reports(weblab, make_host, session_factory):
    from app.db import transaction
    from app.models import Host

    make_host("aaa-never")  # registered, its agent never reported
    make_host("aab-stale")
    with transaction(session_factory, write=True) as s:  # its agent last reported an hour ago
        s.scalar(select(Host).where(Host.name == "aab-stale")).last_seen_at = datetime.now(UTC) - timedelta(hours=1)
    r = weblab.alice.get("/book", params={"mode": "devices"})
    assert r.status_code == 200
    assert '<option value="node-01" selected>' in r.text, re.findall(r"<option[^>]*>", r.text)
    assert '<option value="aaa-never" >' in r.text  # still offered, not first


def test_device_list_fragment_for_a_host(weblab):
    r = weblab.alice.get("/book", params={"host": "node-01"}, headers=HX)
    assert "<html" not in r.text and r.text.count('name="devices"') == 4
    assert "HX-Request" in r.headers["vary"]


def test_count_mode_offered_when_placement_is_installed(weblab, session_factory):
    from app.web.book import placement_available

    page = weblab.alice.get("/book").text
    if not placement_available():
        assert 'value="count"' not in page
        return
    assert 'name="mode" value="count"' in page
    check = weblab.alice.get("/book/check", params={"mode": "count", "count": "2", "when": "now", "length": "1"}, headers=HX)
    assert check.status_code == 200 and "Placement picks the devices" in check.text
    r = weblab.alice.post("/book", {"mode": "count", "count": "2", "host": "node-01", "when": "now", "length": "1"})
    assert r.status_code == 303, r.text
    with session_factory() as s:
        assert s.query(ReservationDevice).count() == 2
    r = weblab.alice.post("/book", {"mode": "count", "count": "x", "when": "now", "length": "1"})
    assert r.status_code == 422 and "count: 'x' is not a whole number" in html.unescape(r.text)
