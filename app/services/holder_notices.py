"""Telling a reservation's holder that someone else changed it: approved, denied, expired,
cancelled or shortened by a maintenance.

Each message is recorded in the audit log (``notice.reservation``, target ``user:<name>``,
with the text), which the holder's reservations page links, and e-mailed after the commit through
the same SMTP sender as finding notices (:mod:`app.services.notices`) when
``settings.smtp_host`` is set and the holder has an address. A rolled-back change sends
nothing; a failed e-mail is logged, never fails the change.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.models import AuditLog, User
from app.sanitize import email_header
from app.services import notices

log = logging.getLogger(__name__)
_KEY = "gpuroster.holder_mail"
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuroster-holder-mail")


def tell(session: Session, *, user: User, reservation_id: int | None, subject: str, text: str, settings: Settings,
         actor: str, boost_id: int | None = None) -> AuditLog:
    """Record ``text`` for ``user`` about reservation ``reservation_id``, or with
    ``reservation_id=None`` about quota boost ``boost_id``, or about no one reservation or
    boost when both are ``None`` (an admin told of a quarantined device, a free slot a waitlist
    entry waited for); ``actor`` is
    ``user:<name>`` or ``system``. Queues its e-mail for after the commit; returns the audit
    row."""
    mail = "queued" if settings.smtp_host and user.email else ("no address" if settings.smtp_host else "no SMTP")
    about: dict = ({"reservation": reservation_id} if reservation_id is not None
                   else {"boost": boost_id} if boost_id is not None else {"reservation": None})
    row = AuditLog(actor=actor, action="notice.reservation", target=f"user:{user.username}",
                   detail={**about, "subject": subject, "text": text, "email": mail})
    session.add(row)
    page = "/reports/usage" if reservation_id is None and boost_id is not None else "/me/reservations"
    if mail == "queued":
        _after_commit(session, settings, notices.Outgoing(0, "email", user.email or "", email_header(subject),
                                                          f"{text}\n\n{settings.base_url.rstrip('/')}{page}\n"))
    return row


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
    notices._send_emails(items, settings)  # noqa: SLF001 - one SMTP sender for every notice
    for it in items:
        if it.status != "sent":
            log.warning("reservation notice to %s not sent: %s", it.recipient, it.detail)


def told(session: Session, username: str, limit: int = 20) -> list[AuditLog]:
    """The latest reservation notices for ``username``, newest first."""
    return list(session.scalars(select(AuditLog).where(AuditLog.action == "notice.reservation",
                                                       AuditLog.target == f"user:{username}")
                                .order_by(AuditLog.id.desc()).limit(limit)))


__all__ = ["tell", "told"]
