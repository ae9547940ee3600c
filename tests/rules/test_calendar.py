"""ICS feeds: B34 instants in UTC, stable UIDs, cancelled occurrences, CRLF and folding, a
round trip through ``icalendar`` in a process whose zone is Asia/Tokyo, and the feed URLs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from icalendar import Calendar
from sqlalchemy import select

from app.db import lock_for_write, transaction
from app.models import User
from app.schemas.reservation import ReservationCreate, ReservationUpdate
from app.schemas.series import SeriesCreate
from app.services import calendar as calendar_service
from app.services import reservations as reservation_service
from app.services import series as series_service
from tests.conftest import future
from tests.rules.helpers import book

NOW = datetime(2026, 8, 1, 12, 0, tzinfo=UTC)

ROUND_TRIP = r"""
import json, sys, time
from icalendar import Calendar
assert time.localtime().tm_gmtoff == 9 * 3600, time.localtime()
cal = Calendar.from_ical(open(sys.argv[1], "rb").read())
out = []
for ev in cal.walk("VEVENT"):
    s, e = ev.decoded("dtstart"), ev.decoded("dtend")
    out.append([str(ev["uid"]), s.timestamp(), e.timestamp(), str(ev.get("status")), int(ev.get("sequence", 0))])
print(json.dumps(out))
"""


def _b34_data(session_factory, settings):
    """alice: 2026-08-20 16:00–18:30 Madrid, and a weekly NY series with its 2nd occurrence cancelled."""
    with session_factory() as s:
        lock_for_write(s)
        alice = s.scalar(select(User).where(User.username == "alice"))
        single = reservation_service.create_reservation(s, actor=alice, settings=settings, now=NOW, data=ReservationCreate(
            host="node-01", devices=[0], start="2026-08-20T16:00", end="2026-08-20T18:30", tz="Europe/Madrid", note="thesis runs"))
        series = series_service.create_series(s, actor=alice, settings=settings, now=NOW, data=SeriesCreate(
            host="node-01", devices=[1], freq="weekly", weekdays=["TH"], start_date="2026-10-22", start_time="18:00",
            duration="PT2H", tz="America/New_York", count=4))
        cancelled = series.occurrences[1].id
        reservation_service.end_reservation(s, actor=alice, reservation_id=cancelled, now=NOW)
        token = calendar_service.user_feed_token(s, user=alice)  # plain once; only its hash is stored
        s.commit()
        return single.id, [o.id for o in series.occurrences], cancelled, token


def _feed(session_factory, settings, token):
    with session_factory() as s:
        return calendar_service.user_feed(s, token=token, settings=settings, now=NOW)


def test_b34_instants_in_utc_real_end_stable_uid_cancelled_occurrence(client, lab, session_factory, settings):
    single, occurrences, cancelled, token = _b34_data(session_factory, settings)
    body = _feed(session_factory, settings, token)
    text = body.decode("utf-8")
    assert "DTSTART:20260820T140000Z\r\n" in text and "DTEND:20260820T163000Z\r\n" in text
    # CRLF everywhere and folded at 75 octets
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    assert all(len(line.encode()) <= 75 for line in text.split("\r\n"))
    cal = Calendar.from_ical(body)
    events = {str(e["uid"]): e for e in cal.walk("VEVENT")}
    assert set(events) == {f"reservation-{i}@testserver" for i in [single, *occurrences]}
    for e in events.values():
        assert e["dtstamp"].to_ical().endswith(b"Z")
        assert e["dtstart"].to_ical().endswith(b"Z") and e["dtend"].to_ical().endswith(b"Z")
    starts = sorted(e.decoded("dtstart") for uid, e in events.items() if uid != f"reservation-{single}@testserver")
    assert [t.hour for t in starts] == [22, 22, 23, 23]  # Thursdays 18:00 New York across 1 November
    gone = events[f"reservation-{cancelled}@testserver"]
    assert (str(gone["status"]), int(gone["sequence"])) == ("CANCELLED", 1)
    kept = events[f"reservation-{occurrences[0]}@testserver"]
    assert (str(kept["status"]), int(kept["sequence"])) == ("CONFIRMED", 0)
    assert "thesis runs" in str(events[f"reservation-{single}@testserver"]["summary"])

    # a change bumps SEQUENCE under the same UID
    with transaction(session_factory, write=True) as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        reservation_service.update_reservation(s, actor=alice, reservation_id=single, settings=settings, now=NOW,
                                               data=ReservationUpdate(end="2026-08-20T19:00:00+02:00"))
    ev = {str(e["uid"]): e for e in Calendar.from_ical(_feed(session_factory, settings, token)).walk("VEVENT")}
    changed = ev[f"reservation-{single}@testserver"]
    assert int(changed["sequence"]) == 1 and changed.decoded("dtend") == datetime(2026, 8, 20, 17, 0, tzinfo=UTC)


def test_b34_round_trip_under_asia_tokyo_gives_the_same_instants(client, lab, session_factory, settings, tmp_path):
    single, occurrences, cancelled, token = _b34_data(session_factory, settings)
    path = tmp_path / "alice.ics"
    path.write_bytes(_feed(session_factory, settings, token))
    env = {**os.environ, "TZ": "Asia/Tokyo"}
    out = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(path)], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    parsed = {uid: (s, e, st, seq) for uid, s, e, st, seq in json.loads(out.stdout)}
    with session_factory() as s:
        from app.models import Reservation

        rows = list(s.scalars(select(Reservation).order_by(Reservation.id)))
    assert len(parsed) == len(rows) == 5
    for r in rows:
        s_, e_, status, seq = parsed[f"reservation-{r.id}@testserver"]
        assert (s_, e_) == (r.start_at.timestamp(), r.end_at.timestamp())
        assert status == ("CANCELLED" if r.status == "cancelled" else "CONFIRMED") and seq == r.sequence
    assert parsed[f"reservation-{single}@testserver"][:2] == (datetime(2026, 8, 20, 14, 0, tzinfo=UTC).timestamp(),
                                                              datetime(2026, 8, 20, 16, 30, tzinfo=UTC).timestamp())


def test_feed_urls_need_no_header_and_rotate(client, lab):
    s = future(30)
    mine = book(client, lab.alice, [0], s, duration="PT2H").json()
    book(client, lab.bob, [1], s, duration="PT1H", share_with=["alice"])
    book(client, lab.bob, [2], s, duration="PT1H")
    url = client.get("/api/v1/me/feed", headers=lab.alice.headers).json()["url"]
    assert url.startswith("http://testserver/api/v1/feeds/users/") and url.endswith(".ics")
    r = client.get(urlsplit(url).path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/calendar")
    events = Calendar.from_ical(r.content).walk("VEVENT")
    assert len(events) == 2  # her own and the one shared with her, not bob's other one
    assert {str(e["uid"]) for e in events} >= {f"reservation-{mine['id']}@testserver"}
    assert any("(bob)" in str(e["summary"]) for e in events)
    host_url = client.get("/api/v1/hosts/node-01/feed", headers=lab.bob.headers).json()["url"]
    assert len(Calendar.from_ical(client.get(urlsplit(host_url).path).content).walk("VEVENT")) == 3
    assert client.get("/api/v1/hosts/nope/feed", headers=lab.bob.headers).status_code == 404
    new = client.post("/api/v1/me/feed/rotate", headers=lab.alice.headers).json()["url"]
    assert new != url
    assert client.get(urlsplit(url).path).status_code == 404
    assert client.get(urlsplit(new).path).status_code == 200
    assert client.get("/api/v1/feeds/users/not-a-token.ics").status_code == 404
    assert client.get("/api/v1/me/feed").status_code == 401


def test_released_reservation_shows_its_real_end(client, lab):
    r = book(client, lab.alice, [3], "now", duration="PT4H").json()
    released = client.post(f"/api/v1/reservations/{r['id']}/release", headers=lab.alice.headers).json()
    url = client.get("/api/v1/me/feed", headers=lab.alice.headers).json()["url"]
    [ev] = Calendar.from_ical(client.get(urlsplit(url).path).content).walk("VEVENT")
    end = ev.decoded("dtend")
    assert abs(end - datetime.fromisoformat(released["end"])) < timedelta(seconds=1)
    assert end - ev.decoded("dtstart") < timedelta(hours=1)
