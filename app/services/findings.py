"""Findings reported by agents: stored once per (host, key), updated on every snapshot.

:func:`record_findings` is called by snapshot ingest inside its write transaction:

* upsert by ``(host_id, key)``; the device is mapped by UUID *among this host's devices* and
  the reservation id is kept only if it is a reservation of this host (an agent cannot point
  a finding at another host's rows, and a stale id never breaks the foreign key);
* the latest report wins for state and last-seen; an older report (a spooled snapshot
  replayed after a newer one) never moves a finding back, but its notices and actions are
  still recorded; a key reported again after it ended (the agent starts a new finding with
  the same key) reopens the row;
* ``resolved_at`` is when the agent last saw a finding that then ended (``last_seen``);
* terminal notices (:class:`~agent.schema.NoticeReport`) become ``notices`` rows (channel
  ``terminal``; status ``sent`` if at least one terminal got it, ``dry_run`` for a dry run,
  else ``undelivered``); actions (:class:`~agent.schema.ActionReport`) become ``audit_log``
  rows with actor ``host:<name>`` and action ``finding.<sigterm|sigkill|skipped|dry_run>``.
  Both are skipped when already present (same finding, channel/action, time), so a snapshot
  delivered twice under another seq records them once.

With ``settings`` given, service notices (web, e-mail, webhook) are queued for the findings
that need one (see :mod:`app.services.notices`) and sent after the commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from agent.schema import FindingReport
from app.config import Settings
from app.models import AuditLog, Device, Finding, Host, Notice, Reservation, User
from app.models.states import LIVE_FINDING_STATES
from app.schemas.finding import ActionRead, FindingRead, NoticeRead
from app.services import disclosure
from app.services.audit import record_audit

FINAL_STATES = ("terminated", "resolved")
ACTIVE_STATES = LIVE_FINDING_STATES


def _notice_status(delivered: int, detail: str | None) -> str:
    if delivered > 0:
        return "sent"
    if detail and detail.startswith("dry run"):
        return "dry_run"
    return "undelivered"


def record_findings(
    session: Session,
    *,
    host: Host,
    reports: Sequence[FindingReport],
    now: datetime,
    settings: Settings | None = None,
) -> list[Finding]:
    """Upsert the agent's findings of ``host``; returns the rows touched, in report order.

    Never commits; flushes so the rows have ids. With ``settings``, queues service notices
    (:func:`app.services.notices.queue_notices`) to be delivered after the commit.
    """
    if not reports:
        return []
    keys = list(dict.fromkeys(r.key for r in reports))
    existing = {
        f.key: f for f in session.scalars(select(Finding).where(Finding.host_id == host.id, Finding.key.in_(keys)))
    }
    uuids = {r.device_uuid for r in reports}
    dev_ids = dict(
        session.execute(select(Device.uuid, Device.id).where(Device.host_id == host.id, Device.uuid.in_(uuids))).all()
    )
    rids = {r.reservation_id for r in reports if r.reservation_id is not None}
    known_rids = (
        set(session.scalars(select(Reservation.id).where(Reservation.host_id == host.id, Reservation.id.in_(rids))))
        if rids
        else set()
    )
    touched: dict[str, Finding] = {}
    pending_notices: list[tuple[Finding, FindingReport]] = []
    for rep in reports:
        f = existing.get(rep.key)
        if f is None:
            f = Finding(host_id=host.id, key=rep.key, kind=rep.kind, state=rep.state,
                        first_seen_at=rep.first_seen, last_seen_at=rep.last_seen)
            session.add(f)
            existing[rep.key] = f
            newest = True
        else:
            # the newest report wins; this also reopens a key the agent reports again after it ended
            newest = rep.last_seen >= f.last_seen_at
        if newest:
            f.kind = rep.kind
            f.device_id = dev_ids.get(rep.device_uuid)
            f.pid = rep.pid
            f.create_time = rep.create_time
            f.unix_user = rep.unix_user
            f.uid = rep.uid
            f.command = rep.command
            f.container_id = rep.container_id
            f.container_name = rep.container_name
            f.container_image = rep.container_image
            f.reservation_id = rep.reservation_id if rep.reservation_id in known_rids else None
            f.holder = rep.holder
            f.message = rep.message
            f.first_seen_at = min(f.first_seen_at, rep.first_seen)
            f.last_seen_at = rep.last_seen
            f.state = rep.state
            f.resolved_at = rep.last_seen if rep.state in FINAL_STATES else None
        pending_notices.append((f, rep))
        touched[rep.key] = f
    session.flush()
    for f, rep in pending_notices:
        _record_terminal_notices(session, f, rep)
        _record_actions(session, host, f, rep)
    session.flush()
    rows = list(touched.values())
    if settings is not None:
        from app.services import notices as notice_service

        notice_service.queue_notices(session, host=host, findings=rows, settings=settings, now=now)
    return rows


def _record_terminal_notices(session: Session, f: Finding, rep: FindingReport) -> None:
    if not rep.notices:
        return
    have = {
        (r, t)
        for r, t in session.execute(
            select(Notice.recipient, Notice.sent_at).where(Notice.finding_id == f.id, Notice.channel == "terminal")
        )
    }
    for n in rep.notices:
        if (n.recipient, n.at) in have:
            continue
        have.add((n.recipient, n.at))
        detail = f"{n.delivered} terminal(s)" + (f": {n.detail}" if n.detail else "")
        session.add(Notice(finding_id=f.id, channel="terminal", recipient=n.recipient, sent_at=n.at,
                           status=_notice_status(n.delivered, n.detail), detail=detail[:2048]))


def _record_actions(session: Session, host: Host, f: Finding, rep: FindingReport) -> None:
    if not rep.actions:
        return
    actor = f"host:{host.name}"[:160]
    target = f"finding:{f.id}"
    have = {
        (a, t)
        for a, t in session.execute(
            select(AuditLog.action, AuditLog.at).where(AuditLog.actor == actor, AuditLog.target == target)
        )
    }
    for a in rep.actions:
        action = f"finding.{a.action}"
        if (action, a.at) in have:
            continue
        have.add((action, a.at))
        record_audit(session, at=a.at, actor=actor, action=action, target=target,
                     detail={"key": f.key, "kind": f.kind, "pid": a.pid, "create_time": a.create_time, "reason": a.reason,
                             "unix_user": f.unix_user, "device_uuid": rep.device_uuid})


# ------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class FindingFilter:
    """Filters of ``GET /api/v1/findings``; ``since``/``until`` select findings whose
    ``[first_seen, last_seen]`` overlaps ``[since, until)``."""

    host: str | None = None
    user: str | None = None
    kind: str | None = None
    state: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _filtered(flt: FindingFilter) -> Select:
    q = select(Finding)
    if flt.host:
        q = q.join(Host, Host.id == Finding.host_id).where(Host.name == flt.host)
    if flt.user:
        q = q.where(Finding.unix_user == flt.user)
    if flt.kind:
        q = q.where(Finding.kind == flt.kind)
    if flt.state:
        q = q.where(Finding.state == flt.state)
    if flt.since:
        q = q.where(Finding.last_seen_at >= flt.since)
    if flt.until:
        q = q.where(Finding.first_seen_at < flt.until)
    return q


def list_findings(session: Session, *, flt: FindingFilter, limit: int, offset: int) -> tuple[list[Finding], int]:
    """A page of findings, most recently seen first, and the total count."""
    q = _filtered(flt)
    total = session.scalar(select(func.count()).select_from(q.order_by(None).subquery())) or 0
    rows = list(session.scalars(q.order_by(Finding.last_seen_at.desc(), Finding.id.desc()).limit(limit).offset(offset)))
    return rows, total


def get_finding(session: Session, finding_id: int) -> Finding:
    """One finding; raises :class:`~app.errors.NotFound`."""
    from app.errors import NotFound

    f = session.get(Finding, finding_id)
    if f is None:
        raise NotFound(f"finding {finding_id} not found")
    return f


def details(session: Session, findings: Sequence[Finding]) -> tuple[
    dict[int, Host], dict[int, Device], dict[int, list[Notice]], dict[int, list[AuditLog]]
]:
    """Hosts, devices, notices and enforcement actions of ``findings`` in four queries."""
    if not findings:
        return {}, {}, {}, {}
    ids = [f.id for f in findings]
    hosts = {h.id: h for h in session.scalars(select(Host).where(Host.id.in_({f.host_id for f in findings})))}
    dev_ids = {f.device_id for f in findings if f.device_id is not None}
    devices = {d.id: d for d in session.scalars(select(Device).where(Device.id.in_(dev_ids)))} if dev_ids else {}
    notices: dict[int, list[Notice]] = {}
    for n in session.scalars(select(Notice).where(Notice.finding_id.in_(ids)).order_by(Notice.sent_at, Notice.id)):
        notices.setdefault(n.finding_id, []).append(n)
    actions: dict[int, list[AuditLog]] = {}
    targets = {f"finding:{i}": i for i in ids}
    for a in session.scalars(
        select(AuditLog).where(AuditLog.target.in_(targets), AuditLog.action.like("finding.%")).order_by(AuditLog.at, AuditLog.id)
    ):
        actions.setdefault(targets[a.target], []).append(a)
    return hosts, devices, notices, actions


def to_reads(session: Session, findings: Sequence[Finding], *, viewer: User) -> list[FindingRead]:
    """API views of ``findings`` for ``viewer``: notice recipients as
    :func:`app.services.disclosure.visible_recipient` allows (e-mail addresses only for
    admins and their owner; others see the username)."""
    hosts, devices, notices, actions = details(session, findings)
    names = disclosure.usernames_by_email(session, (n for ns in notices.values() for n in ns))
    out = []
    for f in findings:
        d = devices.get(f.device_id) if f.device_id is not None else None
        out.append(FindingRead(
            id=f.id, host=hosts[f.host_id].name, key=f.key, kind=f.kind, state=f.state,  # type: ignore[arg-type]
            device_uuid=d.uuid if d else None, device_index=d.index if d else None,
            device_pci_bus_id=d.pci_bus_id if d else None, pid=f.pid, create_time=f.create_time,
            unix_user=f.unix_user, uid=f.uid, command=f.command, container_id=f.container_id,
            container_name=f.container_name, container_image=f.container_image,
            reservation_id=f.reservation_id, holder=f.holder, message=f.message, first_seen_at=f.first_seen_at,
            last_seen_at=f.last_seen_at, resolved_at=f.resolved_at,
            notices=[NoticeRead(channel=n.channel, recipient=disclosure.visible_recipient(n, finding=f, viewer=viewer, names=names), sent_at=n.sent_at,  # type: ignore[arg-type]
                                status=n.status, detail=n.detail) for n in notices.get(f.id, [])],
            actions=[ActionRead(action=a.action.removeprefix("finding."), at=a.at, actor=a.actor, detail=a.detail)
                     for a in actions.get(f.id, [])],
        ))
    return out


__all__ = ["FindingFilter", "details", "get_finding", "list_findings", "record_findings", "to_reads"]
