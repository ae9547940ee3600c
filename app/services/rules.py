"""Sharing rules: resolution per user and the one validator for create and change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import RuleViolation
from app.models import Device, GroupMember, Host, Reservation, SharingRule, User
from app.timeutil import fmt_duration


def effective_limits(session: Session, user: User) -> dict[str, object]:
    """Each limit's value for ``user``: user scope wins over group over default; among
    groups the most generous value (``None`` = unlimited is the most generous)."""
    rules = list(session.scalars(select(SharingRule)))
    group_ids = set(session.scalars(select(GroupMember.group_id).where(GroupMember.user_id == user.id)))
    fields = ("max_devices", "max_duration_seconds", "max_ahead_seconds")
    out: dict[str, object] = {}
    for f in fields:
        user_vals = [getattr(r, f) for r in rules if r.scope == "user" and r.user_id == user.id]
        group_rules = [r for r in rules if r.scope == "group" and r.group_id in group_ids]
        default_vals = [getattr(r, f) for r in rules if r.scope == "default"]
        if user_vals:
            out[f] = user_vals[-1]
        elif group_rules:
            vals = [getattr(r, f) for r in group_rules]
            out[f] = None if any(v is None for v in vals) else max(vals)
        elif default_vals:
            out[f] = default_vals[-1]
        else:
            out[f] = None
    return out


def validate_reservation(
    session: Session,
    *,
    owner: User,
    actor: User,
    host: Host,
    devices: Sequence[Device],
    start: datetime,
    end: datetime,
    existing: Reservation | None,
    override_reason: str | None,
    now: datetime,
) -> None:
    """Check the sharing rules for a new or changed reservation; raises RuleViolation (403).

    Admins acting with ``override_reason`` skip the rules (the reason is recorded by the
    caller). Limits of fields the change does not touch are not re-applied.
    """
    if actor.is_admin and (override_reason or actor.id != owner.id):
        return
    limits = effective_limits(session, owner)
    max_len = limits.get("max_duration_seconds")
    if max_len is not None and (end - start).total_seconds() > float(max_len):  # type: ignore[arg-type]
        raise RuleViolation(
            f"reservation length {fmt_duration((end - start).total_seconds())} exceeds the limit of {fmt_duration(float(max_len))}",  # type: ignore[arg-type]
            rule="max_duration_seconds",
            limit=max_len,
        )
    max_ahead = limits.get("max_ahead_seconds")
    if existing is None and max_ahead is not None and (start - now).total_seconds() > float(max_ahead):  # type: ignore[arg-type]
        raise RuleViolation(
            f"start is more than {fmt_duration(float(max_ahead))} ahead",  # type: ignore[arg-type]
            rule="max_ahead_seconds",
            limit=max_ahead,
        )
    max_dev = limits.get("max_devices")
    if max_dev is not None and len(devices) > int(max_dev):  # type: ignore[arg-type]
        raise RuleViolation(
            f"{len(devices)} devices requested; the limit is {max_dev} at once", rule="max_devices", limit=max_dev
        )
