"""The timeline (``/timeline``): devices as rows, time as columns, reservations as bars.

A day (hourly columns) or 7 days (daily columns) in the lab's time zone. Free stretches
are links to the booking form, prefilled with the device, the start and a length; a
vertical line marks now. A whole-GPU reservation also blocks the GPU's MIG instances and
a MIG reservation blocks its whole GPU, as the service decides (``find_conflicts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Literal
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from fastapi import Query, Request
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app import i18n
from app.i18n import _
from app.api.deps import SessionDep, SettingsDep
from app.errors import InvalidInput
from app.models import Device, DeviceQuarantine, utcnow
from app.services import conflicts as conflict_service
from app.services import hosts as host_service
from app.services.device_names import device_label
from app.services.quarantined import open_by_device, quarantine_of
from app.web.deps import PageViewer
from app.web.render import page, page_locale
from app.web.routing import page_router

router = page_router()

View = Literal["day", "week"]
MIN_FREE = timedelta(minutes=5)


@dataclass
class Column:
    """A labelled column of the time axis (``left``/``width`` in % of the window)."""

    left: float
    width: float
    label: str
    start: datetime


def fmt_end(end: datetime, tz: ZoneInfo) -> str:
    """A bar's end in ``tz``; ``open-ended`` for an end the zone cannot show (end of year 9999 UTC)."""
    try:
        return i18n.format_local(end, tz, "datetime")
    except OverflowError:
        return _("open-ended")


@dataclass
class Bar:
    """A reservation drawn on a device's row."""

    left: float
    width: float
    label: str
    title: str
    href: str
    mine: bool
    released: bool
    lane: int = 0


@dataclass
class FreeSlot:
    """A free stretch of a device's row, linking to the prefilled booking form."""

    left: float
    width: float
    href: str
    title: str


@dataclass
class Row:
    """One device's row."""

    device: Device
    label: str
    model: str
    bars: list[Bar] = field(default_factory=list)
    free: list[FreeSlot] = field(default_factory=list)
    lanes: int = 1
    quarantine: DeviceQuarantine | None = None  # the open health quarantine keeping it from booking


def stack(bars: list[Bar]) -> int:
    """Give overlapping bars separate lanes (first fit, in the given order) and return how
    many lanes the row needs: a whole GPU's row carries the bookings of all its MIG slices,
    which may run at the same time and would otherwise be drawn on top of each other."""
    ends: list[float] = []  # right edge (%) of the last bar in each lane
    for b in bars:
        for lane, right in enumerate(ends):
            if b.left >= right:
                b.lane, ends[lane] = lane, b.left + b.width
                break
        else:
            b.lane = len(ends)
            ends.append(b.left + b.width)
    return max(1, len(ends))


@dataclass
class Timeline:
    """Everything the timeline template draws."""

    view: View
    day: date
    start: datetime
    end: datetime
    columns: list[Column]
    hosts: list[tuple[str, list[Row]]]
    replay: frozenset[str]  # host names whose telemetry is replayed from captures
    now_left: float | None
    past_width: float
    prev_day: date
    next_day: date
    today: date


def parse_day(value: str | None, *, tz: ZoneInfo, now: datetime) -> date:
    """``YYYY-MM-DD`` (the lab's today when empty); raises InvalidInput naming ``day``."""
    if not value:
        return now.astimezone(tz).date()
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"day: {value!r} is not a date (YYYY-MM-DD)", field="day") from None


def window(day: date, view: View, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC: the lab-zone midnight of ``day`` and 1 or 7 days later."""
    days = 1 if view == "day" else 7
    start = datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=days), time(0), tzinfo=tz).astimezone(UTC)
    return start, end


def _cells(day: date, view: View, tz: ZoneInfo, start: datetime, end: datetime) -> tuple[list[datetime], list[datetime]]:
    """(column starts, booking-cell starts) in UTC. Day: hours; week: days, cells of 6 h."""
    if view == "day":
        hours = []
        t = start
        while t < end:
            hours.append(t)
            t += timedelta(hours=1)
        return hours, hours
    days = [datetime.combine(day + timedelta(days=i), time(0), tzinfo=tz).astimezone(UTC) for i in range(7)]
    cells = [
        datetime.combine(day + timedelta(days=i), time(h), tzinfo=tz).astimezone(UTC) for i in range(7) for h in (0, 6, 12, 18)
    ]
    return days, cells


def _merge(intervals: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _round_up(t: datetime) -> datetime:
    """``t`` rounded up to the next 5-minute mark (unchanged when already on one)."""
    base = t.replace(second=0, microsecond=0)
    if base < t:
        base += timedelta(minutes=1)
    rem = base.minute % 5
    return base + timedelta(minutes=5 - rem) if rem else base


def _free_slots(
    *, host: str, device: Device, busy: list[tuple[datetime, datetime]], start: datetime, end: datetime, now: datetime,
    cells: list[datetime], max_length: timedelta, tz: ZoneInfo, pct,
) -> list[FreeSlot]:
    lo = max(start, now)
    if lo >= end:
        return []
    stretches: list[tuple[datetime, datetime]] = []
    t = lo
    for s, e in _merge([(max(s, lo), min(e, end)) for s, e in busy if e > lo and s < end]):
        if s > t:
            stretches.append((t, s))
        t = max(t, e)
    if t < end:
        stretches.append((t, end))
    bounds = sorted(set(cells[1:] + [end]))
    slots: list[FreeSlot] = []
    for s, e in stretches:
        piece = s
        while piece < e:
            cut = next((b for b in bounds if b > piece), end)
            piece_end = min(cut, e)
            begin = _round_up(piece)
            if piece_end - begin >= MIN_FREE:
                length = min(e - begin, max_length)
                hours = max(0.25, int(length.total_seconds() / 900) / 4)
                local = begin.astimezone(tz)
                query = urlencode({
                    "host": host, "devices": device.uuid, "when": "at",
                    "start": local.strftime("%Y-%m-%dT%H:%M"), "length": f"{hours:g}",
                })
                slots.append(FreeSlot(
                    left=pct(piece), width=pct(piece_end) - pct(piece), href=f"/book?{query}",
                    title=_("Book GPU %(index)s from %(start)s", index=device.index if device.index is not None else "?",
                          start=i18n.format_local(local, tz, "datetime")),
                ))
            piece = piece_end
    return slots


def _via(h: conflict_service.Holding, device: Device) -> str:
    """What a bar on ``device``'s row adds to the holder's name when the reservation names
    another device: ``" · MIG 4"`` (a slice of this GPU, so several slices' bookings on the
    whole-GPU row stay apart) or ``" (whole GPU)"`` on a slice's row."""
    if h.via is None:
        return ""
    if device.parent_id is None:
        return " · " + device_label(h.via, device).split(" · ", 1)[-1]
    return " (whole GPU)"


def timeline_view(
    session: Session, *, day: date, view: View, tz: ZoneInfo, now: datetime, viewer_id: int
) -> Timeline:
    """The timeline of all non-retired devices for the window of ``day`` and ``view``."""
    start, end = window(day, view, tz)
    span = (end - start).total_seconds()

    def pct(t: datetime) -> float:
        return max(0.0, min(100.0, (t - start).total_seconds() * 100.0 / span))

    devices = list(session.scalars(select(Device).where(Device.retired_at.is_(None)).options(selectinload(Device.host))))
    by_id = {d.id: d for d in devices}
    # the rule the booking check applies: a whole GPU and its MIG slices hold each other
    held = conflict_service.holdings(session, devices=devices, start=start, end=end)

    col_starts, cells = _cells(day, view, tz, start, end)
    style = "hour" if view == "day" else "weekday_day"
    columns = [
        Column(left=pct(c), width=pct(col_starts[i + 1] if i + 1 < len(col_starts) else end) - pct(c),
               label=i18n.format_local(c, tz, style), start=c)
        for i, c in enumerate(col_starts)
    ]
    max_length = timedelta(hours=1) if view == "day" else timedelta(hours=6)

    def sort_key(d: Device):
        parent = by_id.get(d.parent_id) if d.parent_id else None
        idx = (parent or d).index
        return (d.host.name, idx if idx is not None else 1 << 30, d.parent_id is not None, d.gpu_instance_id or 0, d.uuid)

    quarantines = open_by_device(session, {d.id for d in devices} | {d.parent_id for d in devices})
    hosts: dict[str, list[Row]] = {}
    for d in sorted(devices, key=sort_key):
        label = device_label(d, by_id.get(d.parent_id) if d.parent_id else None)
        row = Row(device=d, label=label, model=d.name or _("unknown model"), quarantine=quarantine_of(quarantines, d))
        seen: set[int] = set()
        for h in held.get(d.id, []):
            r = h.reservation
            if r.id in seen:
                continue
            seen.add(r.id)
            s, e = max(r.start_at, start), min(r.end_at, end)
            local_s = r.start_at.astimezone(tz)
            local_e = fmt_end(r.end_at, tz)
            kind = _("maintenance: ") if r.kind == "maintenance" else ""
            text = kind + r.user.username + _via(h, d) + (f" · {r.note}" if r.note else "")
            row.bars.append(Bar(
                left=pct(s), width=max(pct(e) - pct(s), 0.3), label=text,
                title=f"#{r.id} {text}: {i18n.format_local(local_s, tz, 'datetime')} – {local_e} ({_(r.status)})",
                href=f"/me/reservations/{r.id}", mine=r.user_id == viewer_id, released=r.status == "released",
            ))
        row.lanes = stack(row.bars)
        busy = [(h.reservation.start_at, h.reservation.end_at) for h in held.get(d.id, [])]
        row.free = _free_slots(host=d.host.name, device=d, busy=busy, start=start, end=end, now=now, cells=cells,
                               max_length=max_length, tz=tz, pct=pct)
        hosts.setdefault(d.host.name, []).append(row)

    names, replay = host_service.host_names(session)
    host_names = sorted(set(names) | set(hosts))
    step = timedelta(days=1 if view == "day" else 7)
    return Timeline(
        view=view, day=day, start=start, end=end, columns=columns,
        hosts=[(name, hosts.get(name, [])) for name in host_names],
        replay=replay,
        now_left=pct(now) if start <= now < end else None,
        past_width=pct(now),
        prev_day=day - step, next_day=day + step, today=now.astimezone(tz).date(),
    )


@router.get("/timeline")
def timeline_page(
    request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep,
    view: Annotated[View, Query()] = "day",
    day: Annotated[str | None, Query(max_length=10)] = None,
) -> Response:
    """Reservations of every device for a day or a week; htmx navigation swaps the ``timeline`` block."""
    now = utcnow()
    with i18n.use_locale(page_locale(request, {"viewer": viewer})):  # labels and titles are built here
        tl = timeline_view(session, day=parse_day(day, tz=settings.tz, now=now), view=view, tz=settings.tz, now=now,
                           viewer_id=viewer.user.id)
    return page(request, "timeline.html", {"viewer": viewer, "active": "timeline", "tl": tl, "now": now}, block="timeline")
