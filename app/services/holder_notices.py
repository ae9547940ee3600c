"""Telling a user about their reservations, boosts and waitlist entries: approved, denied,
expired, cancelled or shortened by a maintenance, checked for a no-show or an idle holder,
on a quarantined device, booked from the waitlist.

Each message is recorded in the audit log (``notice.reservation``, target ``user:<name>``,
with the text), which the holder's reservations page links. After the commit it is e-mailed
through the same SMTP sender as finding notices (:mod:`app.services.notices`) when
``settings.smtp_host`` is set and the user has an address, and sent to the user's own
notification URLs (apprise, escaped per channel by :mod:`app.services.channels`). A notice
of a kind the user turned off (``NOTICE_KINDS``) is recorded but neither e-mailed nor sent.
A rolled-back change sends nothing; a failed delivery is logged, never fails the change.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.models import NOTICE_KINDS, AuditLog, NotifyTarget, User
from app.sanitize import email_header
from app.services import channels, notices
from app.services.audit import record_audit

log = logging.getLogger(__name__)
_KEY = "gpuroster.holder_mail"
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuroster-holder-mail")


def tell(session: Session, *, user: User, reservation_id: int | None, subject: str, text: str, settings: Settings,
         actor: str, boost_id: int | None = None, kind: str | None = None) -> dict:
    """Record ``text`` for ``user`` about reservation ``reservation_id``, or with
    ``reservation_id=None`` about quota boost ``boost_id``, or about no one reservation or
    boost when both are ``None`` (an admin told of a quarantined device, a free slot a waitlist
    entry waited for); ``actor`` is ``user:<name>`` or ``system``.

    ``kind`` (one of ``NOTICE_KINDS``; ``None``: always delivered, e.g. an admin's
    maintenance cutting the booking) is checked against the user's choices. Queues the
    e-mail and the user's own notification URLs for after the commit; returns the audit
    entry's ``detail`` (what was queued: ``email``, ``chats``)."""
    if kind is not None and kind not in NOTICE_KINDS:
        raise ValueError(f"not a notice kind: {kind!r}")
    wanted = kind is None or bool(channels.wanting(session, [user], kind))
    about: dict = ({"reservation": reservation_id} if reservation_id is not None
                   else {"boost": boost_id} if boost_id is not None else {"reservation": None})
    page = "/reports/usage" if reservation_id is None and boost_id is not None else "/me/reservations"
    body = f"{text}\n\n{settings.base_url.rstrip('/')}{page}\n"
    if not wanted:
        mail, chats = "not wanted", []
    else:
        mail = "queued" if settings.smtp_host and user.email else ("no address" if settings.smtp_host else "no SMTP")
        chats = list(session.scalars(select(NotifyTarget).where(NotifyTarget.user_id == user.id).order_by(NotifyTarget.id)))
    detail = {**about, "subject": subject, "text": text, "email": mail, "chats": len(chats), **({"kind": kind} if kind else {})}
    record_audit(session, actor=actor, action="notice.reservation", target=f"user:{user.username}", detail=detail)
    if mail == "queued":
        _after_commit(session, settings, notices.Outgoing(0, "email", user.email or "", email_header(subject), body))
    for t in chats:
        _after_commit(session, settings, notices.Outgoing(0, "chat", t.label or channels.redact(t.url), subject, body,
                                                          target=t.url))
    return detail


def _after_commit(session: Session, settings: Settings, item: notices.Outgoing) -> None:
    queued = session.info.setdefault(_KEY, [])
    queued.append(item)
    if len(queued) > 1:
        return

    def after_commit(s: Session) -> None:
        todo = s.info.pop(_KEY, [])
        if todo:
            _executor.submit(_send, todo, settings)

    def after_rollback(s: Session) -> None:
        s.info.pop(_KEY, None)

    event.listen(session, "after_commit", after_commit, once=True)
    event.listen(session, "after_rollback", after_rollback, once=True)


def _send(items: list[notices.Outgoing], settings: Settings) -> None:
    notices._send_emails([it for it in items if it.channel == "email"], settings)  # noqa: SLF001 - one SMTP sender
    for it in items:
        if it.channel == "chat":
            sent = channels.send(it.target or "", title=it.subject, body=it.body)
            it.status, it.detail = ("sent" if sent.ok else "failed"), sent.detail
        if it.status != "sent":
            log.warning("%s notice to %s not sent: %s", it.channel, it.recipient, it.detail)


def told(session: Session, username: str, limit: int = 20) -> list[AuditLog]:
    """The latest reservation notices for ``username``, newest first."""
    return list(session.scalars(select(AuditLog).where(AuditLog.action == "notice.reservation",
                                                       AuditLog.target == f"user:{username}")
                                .order_by(AuditLog.id.desc()).limit(limit)))


__all__ = ["tell", "told"]
