"""How an approved quota boost raises a limit (applied by
:func:`app.services.limits.resolve_limits`, the one place limits are resolved)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import QuotaBoost, User

#: limits counted in whole units (devices, seconds, reservations); the others are GPU-hours
INT_LIMITS = ("max_devices", "max_duration_seconds", "max_ahead_seconds", "max_concurrent_reservations")


def apply_boosts(session: Session, user: User, limits: dict[str, Any], *, now: datetime,
                 until: datetime | None) -> None:
    """Raise, in place, each limit of ``limits`` (name -> ``limits.Limit``) that an approved
    boost of ``user`` lasting past ``now`` (and, with ``until``, to or past ``until``) sets
    higher. A boost never lowers a limit and an unlimited one stays unlimited. The raised
    limit's ``scope`` is ``boost:<id>``, ``base`` the rules' value, ``boost_until`` its end."""
    q = select(QuotaBoost).where(QuotaBoost.user_id == user.id, QuotaBoost.status == "approved",
                                 QuotaBoost.ends_at > now)
    if until is not None:
        q = q.where(QuotaBoost.ends_at >= until)
    for b in session.scalars(q.order_by(QuotaBoost.id)):
        cur = limits.get(b.limit_name)
        if cur is None or cur.value is None:
            continue
        value = int(b.value) if b.limit_name in INT_LIMITS else float(b.value)
        if value > cur.value:
            limits[b.limit_name] = replace(cur, value=value, scope=f"boost:{b.id}",
                                           base=cur.base if cur.boost_id else cur.value, boost_id=b.id,
                                           boost_until=b.ends_at)


__all__ = ["INT_LIMITS", "apply_boosts"]
