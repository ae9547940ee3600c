"""Parsing and formatting of instants: always timezone-aware, stored in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.errors import InvalidInput


def zone(name: str, *, field: str = "tz") -> ZoneInfo:
    """The IANA zone ``name``; raises :class:`InvalidInput` naming ``field`` if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"{field}: unknown time zone {name!r}", field=field) from None


def parse_instant(value: str, *, tz: str | None = None, field: str, now: datetime | None = None) -> datetime:
    """Parse an ISO 8601 instant into aware UTC.

    Accepts an offset (``2026-10-26T09:00:00+01:00``, ``…Z``), or wall time with ``tz``
    (``2026-10-26T09:00`` + ``Europe/Berlin``, resolved with that day's offset, so DST is
    right), or ``"now"``. Raises :class:`InvalidInput` naming ``field`` for anything else,
    including wall time without ``tz``.
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
        zi = zone(tz)
        dt = dt.replace(tzinfo=zi)
        # A wall time that does not exist (spring-forward gap) is refused, not silently moved.
        roundtrip = dt.astimezone(UTC).astimezone(zi)
        if roundtrip.replace(tzinfo=None) != dt.replace(tzinfo=None):
            raise InvalidInput(f"{field}: {value} does not exist in {tz} (DST gap)", field=field)
    return dt.astimezone(UTC)


def fmt_duration(seconds: float) -> str:
    """Human duration: ``4h``, ``1h30m``, ``2d3h``, ``45s``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m = s // 60
    out = (f"{d}d" if d else "") + (f"{h}h" if h else "") + (f"{m}m" if m and not d else "")
    return out or "0m"


def ceil_minute(dt: datetime) -> datetime:
    if dt.second or dt.microsecond:
        return dt.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return dt
