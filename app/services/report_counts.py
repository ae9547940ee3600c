"""Counts of the booked-versus-used report beside the GPU-hours (:mod:`app.services.reports`):
findings per user and kind, and the check-in figures: no-shows released, releases after
"still using it?" (by the sweep or by the holder: consent releases), and the idle GPU-hours
of reservations after their check-in (:mod:`app.services.checkin`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from app.models import Finding, Reservation, User

CONSENT_RELEASES = ("idle", "idle_devices", "idle_consent")


def spans(r: Reservation, a: datetime, b: datetime) -> list[tuple[datetime, datetime, bool]]:
    """``[a, b)`` of reservation ``r`` cut at its check-in: ``(lo, hi, checked_in)`` pieces,
    empty when ``b <= a``."""
    if b <= a:
        return []
    c = r.checked_in_at
    if c is None or c >= b:
        return [(a, b, False)]
    if c <= a:
        return [(a, b, True)]
    return [(a, c, False), (c, b, True)]


@dataclass
class CheckinFigures:
    """One user's (or the totals') check-in figures: counts, and idle seconds after check-in."""

    no_shows: int = 0
    consent_releases: int = 0
    checked_in_idle_s: float = 0.0

    def add(self, r: Reservation, idle_checked_in_s: float) -> dict:
        """Count reservation ``r`` (``idle_checked_in_s``: its idle seconds after check-in in
        the period); returns its own figures for the per-reservation row."""
        self.no_shows += r.auto_release == "no_show"
        self.consent_releases += r.auto_release in CONSENT_RELEASES
        self.checked_in_idle_s += idle_checked_in_s
        return {"checked_in_at": r.checked_in_at, "auto_release": r.auto_release,
                "checked_in_idle_gpu_hours": round(idle_checked_in_s / 3600, 4)}

    def figures(self) -> dict:
        """The fields of :class:`app.schemas.report.UserUsage` these figures fill."""
        return {"no_shows": self.no_shows, "consent_releases": self.consent_releases,
                "checked_in_idle_gpu_hours": round(self.checked_in_idle_s / 3600, 4)}

    @classmethod
    def total(cls, parts: Iterable["CheckinFigures"]) -> "CheckinFigures":
        out = cls()
        for p in parts:
            out.no_shows += p.no_shows
            out.consent_releases += p.consent_releases
            out.checked_in_idle_s += p.checked_in_idle_s
        return out


def finding_counts(
    session: Session, *, users: list[User], reservation_ids: list[int], start: datetime, until: datetime
) -> dict[int, dict[str, int]]:
    """Findings seen in ``[start, until)`` per user id and kind: the user's own processes,
    plus ``idle`` findings about the user's reservations."""
    if not users:
        return {}
    by_unix = {u.unix_name: u.id for u in users}
    cond = Finding.unix_user.in_(list(by_unix))
    if reservation_ids:
        cond = or_(cond, and_(Finding.kind == "idle", Finding.reservation_id.in_(reservation_ids)))
    owner_of = {}
    if reservation_ids:
        owner_of = dict(session.execute(
            select(Reservation.id, Reservation.user_id).where(Reservation.id.in_(reservation_ids))
        ).all())
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for unix_user, kind, rid in session.execute(
        select(Finding.unix_user, Finding.kind, Finding.reservation_id)
        .where(cond, Finding.first_seen_at < until, Finding.last_seen_at >= start)
    ):
        uid = owner_of[rid] if kind == "idle" and rid in owner_of else by_unix.get(unix_user)
        if uid is not None:
            out[uid][kind] += 1
    return {uid: dict(kinds) for uid, kinds in out.items()}


__all__ = ["CONSENT_RELEASES", "CheckinFigures", "finding_counts", "spans"]
