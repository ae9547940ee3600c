"""What a member has used of each of their limits now (``GET /api/v1/me/usage``,
``gpuroster usage``, the Usage page): held devices and reservations at an instant, GPU-hours
over the rolling quota window and over the current calendar day, ISO week and month, and the
plain limits, each with the scope it comes from (:func:`app.services.limits.resolve_limits`,
``boost:<id>`` while a quota boost raises it), and the member's pending and active boosts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.models import User
from app.services import boosts as boost_service
from app.services.calendar_quotas import CALENDAR_LIMITS, CalendarWindow, window_of
from app.services.quotas import WINDOW_DAYS, fmt_hours, owner_rows, quota_window, window_hours
from app.services.limits import LIST_LIMITS, resolve_limits
from app.i18n import N_, current_locale, format_day, format_local, gettext, when_text
from app.timeutil import fmt_duration


@dataclass
class UsageItem:
    rule: str
    limit: Any
    used: Any
    left: Any
    unit: str
    scope: str | None
    detail: str
    boosted_from: Any = None
    boost_until: datetime | None = None


def _day(d: date) -> str:
    # "Tue 01 Dec" in English, as before; the reader's own form in other languages
    return f"{d:%a %d %b}" if current_locale() == "en" else format_local(datetime(d.year, d.month, d.day, tzinfo=UTC), UTC, "weekday_day")


def _window(w: CalendarWindow, today: date) -> str:
    # the window's label (calendar_quotas.window_of) in the current locale
    if w.kind == "day":
        return gettext("day %(day)s", day=f"{today:%a} {today.isoformat()}" if current_locale() == "en" else format_day(today))
    if w.kind == "week":
        return gettext("ISO week %(week)s", week=w.label.rsplit(" ", 1)[-1])
    return gettext("month %(month)s", month=w.label.rsplit(" ", 1)[-1])


def usage(session: Session, *, user: User, now: datetime, tz: ZoneInfo) -> dict[str, Any]:
    """Each limit of ``user``: its value, what is used now and what is left.

    Devices and reservations count what is held at ``now``; GPU-hours count the seven lab
    days ending today (booked hours, future parts of today included) and the whole calendar
    day, ISO week and month holding ``now`` (booked hours, future ones included). A limit
    raised by an active boost says so (``scope`` ``boost:<id>``, ``boosted_from``, ``boost_until``).
    """
    limits = resolve_limits(session, user, now=now)
    today = now.astimezone(tz).date()
    ws, we = quota_window(today - timedelta(days=WINDOW_DAYS - 1), tz)
    rows_now = owner_rows(session, owner_id=user.id, start=now, end=now + timedelta(microseconds=1), exclude_id=None)
    held = len(rows_now)
    until = min((e for _r, _s, e in rows_now), default=None)
    res_now = len({rid for rid, _s, _e in rows_now})
    calendar = {name: window_of(kind, today, tz) for name, kind in CALENDAR_LIMITS.items()}
    # the rolling window and the calendar ones in one statement, as the validator reads them
    booked = window_hours(session, owner_id=user.id, windows=[(ws, we)] + [(w.start, w.end) for w in calendar.values()],
                          exclude_id=None)
    hours = booked[(ws, we)]

    def left(lim: Any, used: float) -> Any:
        return None if lim is None else max(0, lim - used)

    items: list[UsageItem] = []
    lim = limits["max_devices"]
    items.append(UsageItem("max_devices", lim.value, held, left(lim.value, held), "devices", lim.scope,
                           gettext("%(n)s device(s) held now, the first until %(end)s", n=held, end=when_text(until, tz, now=now))
                           if until else gettext("%(n)s device(s) held now", n=held)))
    lim = limits["max_concurrent_reservations"]
    items.append(UsageItem("max_concurrent_reservations", lim.value, res_now, left(lim.value, res_now), "reservations",
                           lim.scope, gettext("%(n)s reservation(s) active now", n=res_now)))
    lim = limits["max_gpu_hours_7d"]
    items.append(UsageItem("max_gpu_hours_7d", lim.value, round(hours, 4),
                           None if lim.value is None else round(max(0.0, lim.value - hours), 4), "GPU-hours", lim.scope,
                           gettext("%(hours)s GPU-hours booked %(start)s – %(end)s (%(zone)s)", hours=fmt_hours(hours),
                                   start=_day(ws.astimezone(tz).date()), end=_day((we - timedelta(seconds=1)).astimezone(tz).date()),
                                   zone=tz.key)))
    for name, w in calendar.items():
        lim = limits[name]
        used = booked[(w.start, w.end)]
        items.append(UsageItem(name, lim.value, round(used, 4), None if lim.value is None else
                               round(max(0.0, lim.value - used), 4), "GPU-hours", lim.scope,
                               gettext("%(hours)s GPU-hours booked in %(window)s (%(length)s h long)", hours=fmt_hours(used),
                                       window=_window(w, today), length=fmt_hours(w.hours))))
    for name, unit, what in (("max_duration_seconds", "seconds", N_("longest reservation")),
                             ("max_ahead_seconds", "seconds", N_("how far ahead a reservation may start"))):
        lim = limits[name]
        items.append(UsageItem(name, lim.value, None, None, unit, lim.scope, "%s: %s" % (
            gettext(what), fmt_duration(lim.value) if lim.value is not None else gettext("unlimited"))))
    for name in LIST_LIMITS:
        lim = limits[name]
        items.append(UsageItem(name, lim.value, None, None, "names", lim.scope,
                               gettext("any") if lim.value is None else ", ".join(lim.value)))
    for item in items:
        lim = limits[item.rule]
        if lim.boost_id is not None:
            item.boosted_from, item.boost_until = lim.base, lim.boost_until
            item.detail += gettext("; raised by boost %(id)s until %(end)s", id=lim.boost_id, end=when_text(lim.boost_until, tz, now=now))
    return {
        "boosts": boost_service.of_user(session, user=user, now=now),
        "user": user.username,
        "timezone": tz.key,
        "now": now,
        "window": {"start": ws, "end": we},
        "limits": items,
    }
