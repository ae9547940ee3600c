"""Limit resolution: each limit's effective value for a user and the rule (or boost) it
comes from. The most specific scope that *sets* a limit wins, user over group over default;
``None`` in a rule means "this rule does not set that limit" (it is inherited from a less
specific scope). A member of several groups gets the most generous group value: the largest
number (or, where larger is not more generous, as :data:`_GENEROSITY` says), the union of
the allowed lists. :mod:`app.services.rules` checks requests against these limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.orm import Session

from app.models import Group, GroupMember, SharingRule, User
from app.services.boost_limits import apply_boosts

NUMERIC_LIMITS = (
    "max_devices",
    "max_duration_seconds",
    "max_ahead_seconds",
    "max_gpu_hours_7d",
    "max_concurrent_reservations",
    "max_gpu_hours_day",
    "max_gpu_hours_week",
    "max_gpu_hours_month",
)
LIST_LIMITS = ("allowed_hosts", "allowed_models")
# Thresholds above which a booking awaits approval (resolved like numeric limits: the larger
# group value is the more generous); :mod:`app.services.approvals` applies them.
APPROVAL_FIELDS = ("approval_above_devices", "approval_above_seconds", "approval_above_ahead_seconds",
                   "approval_above_gpu_hours")
# Check-in and idle-holder settings (resolved like the limits; applied by app.services.checkin):
# minutes, a percent and the silence policy. Unset: no check-in, no idle question.
CHECKIN_FIELDS = ("checkin_minutes", "checkin_min_booking_minutes", "checkin_grace_minutes", "idle_below_percent",
                  "idle_after_minutes", "idle_grace_minutes", "idle_silence")
IDLE_SILENCES = ("nothing", "release_idle_devices", "release")  # the most generous first
LIMIT_FIELDS = NUMERIC_LIMITS + LIST_LIMITS + APPROVAL_FIELDS + CHECKIN_FIELDS
# Where the larger value is not the more generous one for a member of several groups: a lower
# idle threshold flags less, and a milder silence policy releases less.
_GENEROSITY = {"idle_below_percent": lambda v: -v, "idle_silence": lambda v: -IDLE_SILENCES.index(v)}
SCOPES = ("default", "group", "user")


@dataclass(frozen=True)
class Limit:
    """One effective limit: its value (``None`` = unlimited) and where it comes from."""

    name: str
    value: Any
    scope: str | None = None  # "user", "group:<name>", "default", "boost:<id>"; None when no rule sets it
    rule_id: int | None = None
    base: Any = None  # under a boost: the value the rules give
    boost_id: int | None = None
    boost_until: datetime | None = None


# One statement, built once (every booking reads it): only the rules that apply to the user
# ``user_id``, with their group's name.
_USER_ID = bindparam("user_id")
_RULES_OF_USER = (
    select(SharingRule, Group.name)
    .outerjoin(Group, Group.id == SharingRule.group_id)
    .where(or_(
        SharingRule.scope == "default",
        and_(SharingRule.scope == "user", SharingRule.user_id == _USER_ID),
        and_(SharingRule.scope == "group",
             SharingRule.group_id.in_(select(GroupMember.group_id).where(GroupMember.user_id == _USER_ID))),
    ))
    .order_by(SharingRule.id)
)


def resolve_limits(session: Session, user: User, *, now: datetime | None = None,
                   until: datetime | None = None) -> dict[str, Limit]:
    """Each limit's effective value for ``user`` with its source (see the module docstring).

    With ``now``, the user's approved boosts that last past ``now`` (and, with ``until``, the
    end of the request, to or past ``until``) raise the limits they name.
    """
    found = session.execute(_RULES_OF_USER, {"user_id": user.id}).all()
    rules = [r for r, _name in found]
    group_names = {r.group_id: name for r, name in found if r.scope == "group"}
    user_rules = [r for r in rules if r.scope == "user" and r.user_id == user.id]
    group_rules = [r for r in rules if r.scope == "group" and r.group_id in group_names]
    default_rules = [r for r in rules if r.scope == "default"]
    out: dict[str, Limit] = {}
    for f in LIMIT_FIELDS:
        limit = Limit(f, None)
        for r in reversed(user_rules):
            if getattr(r, f) is not None:
                limit = Limit(f, _copy(getattr(r, f)), "user", r.id)
                break
        else:
            setting = [r for r in group_rules if getattr(r, f) is not None]
            if setting:
                if f in LIST_LIMITS:
                    merged: list[str] = []
                    for r in setting:
                        merged += [v for v in getattr(r, f) if v not in merged]
                    best = max(setting, key=lambda r: len(getattr(r, f)))
                    limit = Limit(f, merged, f"group:{group_names.get(best.group_id, best.group_id)}", best.id)
                else:
                    rank = _GENEROSITY.get(f, lambda v: v)
                    best = max(setting, key=lambda r: rank(getattr(r, f)))
                    limit = Limit(f, getattr(best, f), f"group:{group_names.get(best.group_id, best.group_id)}", best.id)
            else:
                for r in reversed(default_rules):
                    if getattr(r, f) is not None:
                        limit = Limit(f, _copy(getattr(r, f)), "default", r.id)
                        break
        out[f] = limit
    if now is not None and user.boost_until is not None and user.boost_until > now:
        apply_boosts(session, user, out, now=now, until=until)
    return out


def _copy(v: Any) -> Any:
    return list(v) if isinstance(v, list) else v


def effective_limits(session: Session, user: User) -> dict[str, object]:
    """Each limit's value for ``user`` (``None`` = unlimited); see :func:`resolve_limits`."""
    return {name: lim.value for name, lim in resolve_limits(session, user).items()}
