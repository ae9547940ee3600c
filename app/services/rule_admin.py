"""Administration of sharing rules and open devices: create, read, change and delete rules
(one per scope target), and mark devices open (usable without a reservation).

What the rules mean and how they are enforced is :mod:`app.services.rules`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import advisory_xact_lock
from app.errors import Conflict, InvalidInput, NotFound
from app.models import Device, Group, Host, ReservationDevice, SharingRule, User, utcnow
from app.services.limits import LIMIT_FIELDS, LIST_LIMITS, SCOPES
from app.services.rules import RULES_LOCK_KEY
from app.services.audit import record_audit


# ---------------------------------------------------------------------------- rule administration


def _target(session: Session, *, scope: str, user: str | None, group: str | None) -> tuple[int | None, int | None]:
    if scope not in SCOPES:
        raise InvalidInput(f"scope: one of {', '.join(SCOPES)}", field="scope")
    if scope == "default":
        if user or group:
            raise InvalidInput("scope: a default rule names no user or group", field="scope")
        return None, None
    if scope == "group":
        if user or not group:
            raise InvalidInput("group: a group rule names a group (and no user)", field="group")
        gid = session.scalar(select(Group.id).where(Group.name == group))
        if gid is None:
            raise InvalidInput(f"group: no group {group!r}", field="group")
        return None, gid
    if group or not user:
        raise InvalidInput("user: a user rule names a user (and no group)", field="user")
    uid = session.scalar(select(User.id).where(User.username == user))
    if uid is None:
        raise InvalidInput(f"user: no user {user!r}", field="user")
    return uid, None


def _check_values(values: dict[str, Any]) -> None:
    for f in LIST_LIMITS:
        if f in values and values[f] is not None:
            items = [str(x).strip() for x in values[f]]
            if not items or any(not x for x in items):
                raise InvalidInput(f"{f}: list at least one non-empty name, or null to inherit", field=f)
            values[f] = list(dict.fromkeys(items))


def create_rule(session: Session, *, scope: str, user: str | None, group: str | None, values: dict[str, Any],
                actor: User) -> SharingRule:
    """Create the rule of one scope target (default, a group, a user).

    Raises InvalidInput (422) naming the field for a bad scope/target or value, Conflict
    (409) when that target already has a rule (change it with PATCH instead).
    """
    advisory_xact_lock(session, RULES_LOCK_KEY)
    uid, gid = _target(session, scope=scope, user=user, group=group)
    _check_values(values)
    existing = session.scalar(select(SharingRule.id).where(
        SharingRule.scope == scope,
        SharingRule.user_id.is_(None) if uid is None else SharingRule.user_id == uid,
        SharingRule.group_id.is_(None) if gid is None else SharingRule.group_id == gid,
    ))
    if existing is not None:
        raise Conflict(f"scope: rule {existing} already covers this {scope}; change it with PATCH /api/v1/rules/{existing}",
                       field="scope", rule_id=existing)
    now = utcnow()
    rule = SharingRule(scope=scope, user_id=uid, group_id=gid, created_at=now, updated_at=now,
                       **{k: v for k, v in values.items() if k in LIMIT_FIELDS or k == "note"})
    session.add(rule)
    session.flush()
    record_audit(session, actor=f"user:{actor.username}", action="rule.create", target=f"rule:{rule.id}",
                 detail={"scope": scope, "user": user, "group": group, **values})
    return rule


def get_rule(session: Session, rule_id: int) -> SharingRule:
    rule = session.get(SharingRule, rule_id)
    if rule is None:
        raise NotFound(f"rule {rule_id} not found", field="id")
    return rule


def list_rules(session: Session) -> list[SharingRule]:
    """All rules: default first, then groups, then users."""
    rules = list(session.scalars(select(SharingRule).order_by(SharingRule.id)))
    return sorted(rules, key=lambda r: (SCOPES.index(r.scope), r.id))


def update_rule(session: Session, *, rule_id: int, changes: dict[str, Any], actor: User) -> SharingRule:
    """Set (or clear with ``None``) limits and the note of a rule; its scope target is fixed.

    Raises NotFound (404), InvalidInput (422) naming the field.
    """
    rule = get_rule(session, rule_id)
    _check_values(changes)
    for k, v in changes.items():
        if k not in LIMIT_FIELDS and k != "note":
            raise InvalidInput(f"{k}: cannot be changed; delete the rule and create another", field=k)
        setattr(rule, k, v)
    rule.updated_at = utcnow()
    record_audit(session, actor=f"user:{actor.username}", action="rule.update", target=f"rule:{rule.id}", detail=changes)
    session.flush()
    return rule


def delete_rule(session: Session, *, rule_id: int, actor: User) -> SharingRule:
    """Delete a rule (its limits fall back to the less specific scopes); raises NotFound."""
    rule = get_rule(session, rule_id)
    session.delete(rule)
    record_audit(session, actor=f"user:{actor.username}", action="rule.delete", target=f"rule:{rule_id}",
                 detail={"scope": rule.scope})
    session.flush()
    return rule


def rule_target_names(session: Session, rules: Sequence[SharingRule]) -> dict[int, str]:
    """rule id → username or group name of its target."""
    uids = {r.user_id for r in rules if r.user_id}
    gids = {r.group_id for r in rules if r.group_id}
    users = dict(session.execute(select(User.id, User.username).where(User.id.in_(uids))).all()) if uids else {}
    groups = dict(session.execute(select(Group.id, Group.name).where(Group.id.in_(gids))).all()) if gids else {}
    out: dict[int, str] = {}
    for r in rules:
        if r.user_id:
            out[r.id] = users.get(r.user_id, "")
        elif r.group_id:
            out[r.id] = groups.get(r.group_id, "")
    return out


# ---------------------------------------------------------------------------- open devices


def list_open_devices(session: Session) -> list[Device]:
    """Devices anyone may use without a reservation (not retired), by host and index."""
    q = select(Device).join(Host, Host.id == Device.host_id).where(Device.is_open.is_(True), Device.retired_at.is_(None))
    return list(session.scalars(q.order_by(Host.name, Device.index, Device.uuid)))


def set_open(
    session: Session, *, uuids: Sequence[str], is_open: bool, actor: User, now: datetime
) -> list[tuple[Device, int]]:
    """Open (or close) devices by UUID; the agent learns it from its next snapshot ack.

    Raises NotFound naming the first unknown UUID; nothing is changed then. Returns each
    device with the number of its current and upcoming reservations, which opening does
    not cancel.
    """
    wanted = [u.strip() for u in uuids]
    devices = {d.uuid: d for d in session.scalars(select(Device).where(Device.uuid.in_(wanted)))}
    for u in wanted:
        if u not in devices:
            raise NotFound(f"devices: no device {u!r}", field="devices")
    out = []
    counts: dict[int, int] = defaultdict(int)
    ids = [d.id for d in devices.values()]
    for dev_id in session.scalars(select(ReservationDevice.device_id).where(
            ReservationDevice.device_id.in_(ids), ReservationDevice.active.is_(True), ReservationDevice.end_at > now)):
        counts[dev_id] += 1
    for u in dict.fromkeys(wanted):
        d = devices[u]
        d.is_open = is_open
        out.append((d, counts[d.id]))
    record_audit(session, actor=f"user:{actor.username}", action="device.open" if is_open else "device.close",
                 target="devices", detail={"devices": list(dict.fromkeys(wanted))})
    session.flush()
    return out
