"""Reservation intervals: ``[start, end)`` in UTC parsed from a request and checked.

Kept apart from :mod:`app.services.reservations` so that automatic placement, which
reservations call, can use the same type without importing them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from app.config import Settings
from app.errors import InvalidInput
from app.schemas.reservation import ReservationCreate
from app.timeutil import fmt_duration, fmt_local, parse_instant

# A start this far in the past is still "now": a request takes time to arrive.
PAST_SLACK = timedelta(seconds=60)


@dataclass(frozen=True)
class Interval:
    """A half-open interval ``[start, end)`` of aware UTC datetimes."""

    start: datetime
    end: datetime


def parse_interval(data: ReservationCreate, *, now: datetime) -> Interval:
    """``[start, end)`` in UTC from a create request; raises InvalidInput naming the field
    (``duration`` as well when start plus duration falls after year 9999)."""
    if data.start.strip().lower() == "asap":
        start = now
    else:
        start = parse_instant(data.start, tz=data.tz, field="start", now=now, fold=data.fold)
    if data.end is not None:
        end = parse_instant(data.end, tz=data.tz, field="end", now=now, fold=data.fold)
    else:
        assert data.duration is not None
        if data.duration <= timedelta(0):
            raise InvalidInput("duration: must be positive", field="duration")
        try:
            end = start + data.duration
        except OverflowError:  # past datetime.max: no calendar, database or feed could hold it
            raise InvalidInput(f"duration: {fmt_duration(data.duration.total_seconds())} from the start ends after year 9999",
                               field="duration") from None
    return Interval(start, end)


def validate_interval(start: datetime, end: datetime, *, now: datetime, settings: Settings, field: str = "end") -> None:
    """Refuse zero-length, inverted, too short and past intervals (422 naming the field, times
    in the lab's zone)."""
    if end <= start:
        raise InvalidInput(
            f"{field}: must be after start ({fmt_local(end, settings.tz)} is not after {fmt_local(start, settings.tz)})",
            field=field,
        )
    if (end - start).total_seconds() < settings.min_reservation_seconds:
        raise InvalidInput(
            f"{field}: a reservation lasts at least {settings.min_reservation_seconds} s", field=field
        )
    if start < now - PAST_SLACK:
        raise InvalidInput(f"start: {fmt_local(start, settings.tz)} is in the past", field="start")
