"""The timeline page and its window arithmetic, on both databases."""

from __future__ import annotations

import html
import re
from datetime import UTC, date, datetime, timedelta
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

from app.web.timeline import window

HX = {"HX-Request": "true"}


def _book(who, weblab, devices: list[int], start: datetime | str, hours: float, note: str):
    body = {"host": "node-01", "devices": devices, "start": start if isinstance(start, str) else start.isoformat(), "duration": f"PT{int(hours * 60)}M", "note": note}
    r = who.client.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": who.csrf})
    assert r.status_code == 201, r.text
    return r.json()


def _row(page: str, uuid: str) -> str:
    for part in page.split('<div class="tl-row">')[1:]:
        if f'title="UUID {uuid}"' in part:
            return part.split('<div class="tl-row', 1)[0]
    raise AssertionError(f"no timeline row for {uuid}")


def test_window_is_the_lab_day_also_across_dst():
    berlin = ZoneInfo("Europe/Berlin")
    s, e = window(date(2026, 10, 25), "day", berlin)  # clocks go back: a 25-hour day
    assert s == datetime(2026, 10, 24, 22, tzinfo=UTC) and e - s == timedelta(hours=25)
    s, e = window(date(2026, 3, 29), "week", berlin)
    assert s == datetime(2026, 3, 28, 23, tzinfo=UTC) and e == datetime(2026, 4, 4, 22, tzinfo=UTC)


def test_reservation_is_a_bar_labelled_user_and_note_with_a_now_line(weblab, settings):
    now = datetime.now(UTC)
    res = _book(weblab.alice, weblab, [0, 1], "now", 1, "bert-run")
    page = weblab.bob.get("/timeline").text
    for uuid in weblab.devices[:2]:
        row = _row(page, uuid)
        bar = re.search(r'<a class="tl-bar[^"]*" style="left: ([\d.]+)%; width: ([\d.]+)%" href="/me/reservations/(\d+)" title="([^"]+)">([^<]+)</a>', row)
        assert bar, row
        assert bar.group(3) == str(res["id"]) and html.unescape(bar.group(5)) == "alice · bert-run"
        start = datetime.fromisoformat(res["start"])
        day_start, _ = window(now.astimezone(settings.tz).date(), "day", settings.tz)
        expected_left = (start - day_start).total_seconds() * 100 / (24 * 3600)
        assert abs(float(bar.group(1)) - expected_left) < 0.2
        assert abs(float(bar.group(2)) - 100 / 24) < 0.2 or float(bar.group(1)) + float(bar.group(2)) >= 99.9
        assert 'class="tl-now"' in row
    assert "tl-bar" not in _row(page, weblab.devices[2])
    mine = weblab.alice.get("/timeline").text
    assert 'class="tl-bar mine"' in _row(mine, weblab.devices[0])


def test_free_stretch_links_to_the_booking_form_prefilled(weblab, settings):
    tomorrow = datetime.now(UTC).astimezone(settings.tz).date() + timedelta(days=1)
    nine = datetime(tomorrow.year, tomorrow.month, tomorrow.day, 9, tzinfo=settings.tz)
    _book(weblab.alice, weblab, [2], nine.astimezone(UTC), 2, "")
    page = weblab.bob.get(f"/timeline?day={tomorrow.isoformat()}").text
    row = _row(page, weblab.devices[2])
    links = [html.unescape(h) for h in re.findall(r'<a class="tl-free"[^>]* href="([^"]+)"', row)]
    starts = [parse_qs(urlsplit(h).query)["start"][0] for h in links]
    assert f"{tomorrow.isoformat()}T08:00" in starts and f"{tomorrow.isoformat()}T11:00" in starts
    assert f"{tomorrow.isoformat()}T09:00" not in starts and f"{tomorrow.isoformat()}T10:00" not in starts
    q = parse_qs(urlsplit(links[starts.index(f"{tomorrow.isoformat()}T08:00")]).query)
    assert q["devices"] == [weblab.devices[2]] and q["host"] == ["node-01"] and q["when"] == ["at"] and q["length"] == ["1"]
    # following the link gives the prefilled form
    form = weblab.bob.get(links[0]).text
    assert f'value="{weblab.devices[2]}" checked' in form


def test_past_is_not_bookable(weblab, settings):
    yesterday = datetime.now(UTC).astimezone(settings.tz).date() - timedelta(days=1)
    page = weblab.bob.get(f"/timeline?day={yesterday.isoformat()}").text
    assert "tl-free" not in page and "tl-now" not in page


def test_week_view_and_htmx_navigation(weblab, settings):
    start = datetime.now(UTC) + timedelta(days=3)
    _book(weblab.alice, weblab, [3], start, 4, "later")
    page = weblab.bob.get("/timeline?view=week").text
    assert "alice · later" in _row(page, weblab.devices[3])
    assert page.count('class="tl-col"') == 7
    frag = weblab.bob.get("/timeline?view=week", headers=HX)
    assert "HX-Request" in frag.headers["vary"] and "<html" not in frag.text and "alice · later" in frag.text
    restore = weblab.bob.get("/timeline?view=week", headers={**HX, "HX-History-Restore-Request": "true"})
    assert "<html" in restore.text


def test_bad_day_or_view_is_a_page_naming_the_field(weblab):
    r = weblab.bob.get("/timeline?day=31.12.2026")
    assert r.status_code == 422 and "day: &#39;31.12.2026&#39; is not a date" in r.text and "<html" in r.text
    r = weblab.bob.get("/timeline?view=month")
    assert r.status_code == 422 and "view" in r.text and "<html" in r.text


def test_a_replayed_host_is_marked_replay_on_the_timeline_and_in_the_book_form(weblab, client, make_host):
    from tests.conftest import FRESH_FOR, gpu, snapshot_body

    replay = make_host("replay-01")
    body = snapshot_body("replay-01", 1, [gpu("GPU-9999cccc-0000-0000-0000-000000000009", 0)], source="replay",
                         interval_seconds=FRESH_FOR)
    assert client.post("/api/v1/agent/snapshots", json=body, headers=replay.headers).status_code == 200
    page = weblab.alice.get("/timeline").text
    heads = {m.group(1): m.group(2) for m in re.finditer(r'<div class="tl-row tl-host"><div>([^<\s]+)(.*?)</div>', page)}
    assert 'class="badge replay"' in heads["replay-01"] and "badge" not in heads["node-01"]
    book = weblab.alice.get("/book").text
    assert re.search(r'<option value="replay-01"[^>]*>replay-01 \(replay\)</option>', book)
    assert re.search(r'<option value="node-01"[^>]*>node-01</option>', book)
