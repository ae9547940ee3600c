"""GPU-hour limits per calendar window: a day, an ISO week (Monday 00:00 to Monday 00:00)
and a calendar month, with boundaries at midnight in the lab time zone.

A window is real elapsed time between two lab midnights, so a day is 23 h or 25 h on a DST
change and the week or month holding it is one hour shorter or longer. A booking that spans
a boundary is charged to each window by the device-hours that fall inside it. Every window
a request touches must stay within its limit (:func:`windows`); :func:`breaches` names the
first one that does not, per limit, with what is used in it (the owner's device-hours there,
:func:`app.services.quotas.window_hours`) and what is left.

Used by :func:`app.services.rules.check_limits` (refusals) and
:mod:`app.services.limit_usage` (the current window of each limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from app.services.quotas import fmt_hours, lab_midnight, overfills, requested_hours

#: rule field -> window kind
CALENDAR_LIMITS = {"max_gpu_hours_day": "day", "max_gpu_hours_week": "week", "max_gpu_hours_month": "month"}


@dataclass(frozen=True)
class CalendarWindow:
    """One calendar window: ``kind`` (day, week, month), ``[start, end)`` as UTC instants and
    a ``label`` people read (``day Tue 2026-12-01``, ``ISO week 2026-W49``, ``month 2026-12``)."""

    kind: str
    start: datetime
    end: datetime
    label: str

    @property
    def hours(self) -> float:
        """Its real length in hours (a DST day is 23 or 25)."""
        return (self.end - self.start).total_seconds() / 3600.0

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.label, "start": self.start.isoformat(), "end": self.end.isoformat()}


def window_of(kind: str, day: date, tz: ZoneInfo) -> CalendarWindow:
    """The ``kind`` window (``day``, ``week``, ``month``) holding the lab date ``day``."""
    if kind == "day":
        first, nxt, label = day, day + timedelta(days=1), f"day {day:%a} {day.isoformat()}"
    elif kind == "week":
        first = day - timedelta(days=day.weekday())
        nxt = first + timedelta(days=7)
        year, week, _ = first.isocalendar()
        label = f"ISO week {year}-W{week:02d}"
    elif kind == "month":
        first = day.replace(day=1)
        nxt = (first + timedelta(days=32)).replace(day=1)
        label = f"month {first:%Y-%m}"
    else:
        raise ValueError(f"unknown calendar window kind {kind!r}")
    return CalendarWindow(kind, lab_midnight(first, tz), lab_midnight(nxt, tz), label)


def windows_touching(kind: str, start: datetime, end: datetime, tz: ZoneInfo) -> list[CalendarWindow]:
    """The ``kind`` windows that ``[start, end)`` overlaps, in order (``[]`` when empty)."""
    if end <= start:
        return []
    out = [window_of(kind, start.astimezone(tz).date(), tz)]
    while out[-1].end < end:
        out.append(window_of(kind, out[-1].end.astimezone(tz).date(), tz))
    return out


@dataclass(frozen=True)
class Breach:
    """A calendar window a request would overfill: the rule field, its ``limit``, the
    device-hours already ``used`` in the window and what the request adds there (``needed``)."""

    rule: str
    window: CalendarWindow
    limit: float
    used: float
    needed: float

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used)

    def sentence(self, tz: ZoneInfo) -> str:
        return (f"{self.window.label} ({tz.key}): this needs {fmt_hours(self.needed)} GPU-hours in it; you have "
                f"{fmt_hours(self.used)} of {fmt_hours(self.limit)} GPU-hours booked there, "
                f"{fmt_hours(self.left)} left")


def windows(limits: dict[str, float | None], added: datetime, end: datetime,
            tz: ZoneInfo) -> dict[str, list[CalendarWindow]]:
    """Per calendar limit set in ``limits`` (field -> GPU-hours, ``None`` = not set), the windows
    that the added time ``[added, end)`` touches, in order: those a request must be checked in."""
    return {name: windows_touching(CALENDAR_LIMITS[name], added, end, tz) for name, v in limits.items() if v is not None}


def breaches(
    used: Mapping[tuple[datetime, datetime], float],
    *,
    touched: Mapping[str, list[CalendarWindow]],
    limits: dict[str, float | None],
    devices: int,
    start: datetime,
    end: datetime,
) -> list[Breach]:
    """The first overfilled window of each calendar limit in ``limits`` (field -> GPU-hours)
    for a request of ``devices`` over ``[start, end)``.

    ``touched`` is :func:`windows` of the request (the windows its new time touches, per limit
    set; windows the added time does not touch are not re-checked); ``used`` holds the owner's
    other reservations' device-hours in each of them (keyed by ``(window start, window end)``,
    UTC; :func:`app.services.quotas.window_hours`).
    """
    out: list[Breach] = []
    for name, ws in touched.items():
        limit = limits[name]
        assert limit is not None
        for w in ws:
            needed = requested_hours(devices, start, end, w.start, w.end)
            u = used[(w.start, w.end)]
            if overfills(u, needed, limit):
                out.append(Breach(name, w, float(limit), round(u, 4), round(needed, 4)))
                break
    return out


__all__ = ["Breach", "CALENDAR_LIMITS", "CalendarWindow", "breaches", "window_of", "windows", "windows_touching"]
