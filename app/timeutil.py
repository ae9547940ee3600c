"""Parsing and formatting of instants: always timezone-aware, stored in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.errors import InvalidInput
from app.i18n import gettext as _


def zone(name: str, *, field: str = "tz") -> ZoneInfo:
    """The IANA zone ``name``; raises :class:`InvalidInput` naming ``field`` if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"{field}: unknown time zone {name!r}", field=field) from None


# The latest instant the service stores or computes with (the end of year 9999, UTC, what
# ``datetime`` can represent). An open-ended reservation ends here; arithmetic near it saturates.
MAX_INSTANT = datetime.max.replace(tzinfo=UTC)


def add_capped(t: datetime, delta: timedelta) -> datetime:
    """``t + delta``, saturated at :data:`MAX_INSTANT` instead of raising OverflowError."""
    try:
        return min(t + delta, MAX_INSTANT)
    except OverflowError:
        return MAX_INSTANT


def fmt_local(dt: datetime, tz: ZoneInfo) -> str:
    """An instant as people read it in zone ``tz``: ``2026-10-25 02:30 CEST (UTC+02:00)``;
    in UTC itself ``2026-10-25 00:30 UTC``.

    The abbreviation and the offset make the two instants of a repeated wall time (the
    autumn DST night) distinguishable in messages; UTC has none, and "UTC (UTC+00:00)" says
    the same thing twice. An instant so late that the zone's offset would carry it past
    year 9999 is printed in UTC.
    """
    try:
        local = dt.astimezone(tz)
    except OverflowError:
        local = dt.astimezone(UTC)
    off = local.strftime("%z")
    if local.tzname() == "UTC" and off == "+0000":
        return f"{local:%Y-%m-%d %H:%M} UTC"
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()} (UTC{off[:3]}:{off[3:]})"


def fmt_hours(seconds: float) -> str:
    """Elapsed time in hours for messages: ``25 h``, ``1.5 h``, ``0.25 h``."""
    h = seconds / 3600
    text = f"{h:.2f}".rstrip("0").rstrip(".")
    return f"{text} h"


def resolve_wall_time(naive: datetime, zi: ZoneInfo, *, field: str, fold: int | None = None) -> datetime:
    """The instant (aware, in ``zi``) a wall-clock time means in zone ``zi``.

    A time in the spring-forward gap does not exist: InvalidInput naming ``field`` and the
    jump. A time in the autumn fall-back hour occurs twice: InvalidInput naming both
    instants (``extra['choices']``: ``fold`` 0, the earlier, and 1, the later) unless
    ``fold`` says which, as in :pep:`495`.
    """
    first, second = naive.replace(tzinfo=zi, fold=0), naive.replace(tzinfo=zi, fold=1)
    roundtrip = first.astimezone(UTC).astimezone(zi)
    if roundtrip.replace(tzinfo=None) != naive:
        before, after = (t.astimezone(zi) for t in sorted((first.astimezone(UTC), second.astimezone(UTC))))
        raise InvalidInput(
            f"{field}: {naive:%Y-%m-%d %H:%M} does not exist in {zi.key}: that night the clocks jump from "
            f"{before.tzname()} to {after.tzname()} (a DST gap); choose a time outside it",
            field=field,
        )
    if first.utcoffset() == second.utcoffset():
        return first
    if fold in (0, 1):
        return second if fold else first
    choices = [
        {"fold": 0, "instant": first.astimezone(UTC).isoformat(), "label": fmt_local(first, zi)},
        {"fold": 1, "instant": second.astimezone(UTC).isoformat(), "label": fmt_local(second, zi)},
    ]
    raise InvalidInput(
        f"{field}: {naive:%Y-%m-%d %H:%M} occurs twice in {zi.key} (clocks go back that night): "
        f"{choices[0]['label']} = {choices[0]['instant']} or {choices[1]['label']} = {choices[1]['instant']}; "
        f"give an offset ({first:%H:%M}{_offset(first)} or {second:%H:%M}{_offset(second)}) "
        f"or 'fold' (0: the earlier, 1: the later)",
        field=field, choices=choices,
    )


def _offset(dt: datetime) -> str:
    off = dt.strftime("%z")
    return f"{off[:3]}:{off[3:]}"


def parse_instant(
    value: str, *, tz: str | None = None, field: str, now: datetime | None = None, fold: int | None = None
) -> datetime:
    """Parse an ISO 8601 instant into aware UTC.

    Accepts an offset (``2026-10-26T09:00:00+01:00``, ``…Z``), or wall time with ``tz``
    (``2026-10-26T09:00`` + ``Europe/Berlin``, resolved with that day's offset, so DST is
    right), or ``"now"``. A wall time that does not exist in ``tz`` (spring gap) is refused;
    one that occurs twice (autumn) is refused naming both instants unless ``fold`` (0 the
    earlier, 1 the later) says which; see :func:`resolve_wall_time`. Raises
    :class:`InvalidInput` naming ``field`` for anything else, including wall time without ``tz``.
    """
    text = value.strip()
    if text.lower() == "now":
        return (now or datetime.now(UTC)).astimezone(UTC)
    try:
        dt = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{field}: not an ISO 8601 date-time: {value!r}", field=field) from None
    if dt.tzinfo is None:
        if not tz:
            raise InvalidInput(
                f"{field}: {value!r} has no UTC offset; add one (e.g. +02:00 or Z) or give 'tz'", field=field
            )
        dt = resolve_wall_time(dt, zone(tz), field=field, fold=fold)
    return dt.astimezone(UTC)


def fmt_duration(seconds: float) -> str:
    """Human duration in the current locale (:mod:`app.i18n`): ``4h``, ``1h30m``, ``2d3h``,
    ``45s`` in English; ``4小时``, ``1小时30分``, ``2天3小时``, ``45秒`` in Chinese."""
    day, hour, minute, second = (_("%(n)sd"), _("%(n)sh"), _("%(n)sm"), _("%(n)ss"))
    s = int(round(seconds))
    if s < 60:
        return second % {"n": s}
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m = s // 60
    out = (day % {"n": d} if d else "") + (hour % {"n": h} if h else "") + (minute % {"n": m} if m and not d else "")
    return out or minute % {"n": 0}


def ceil_minute(dt: datetime) -> datetime:
    if dt.second or dt.microsecond:
        return dt.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return dt
