"""Service notices about findings: a web notice (shown in the UI), e-mail, a chat webhook.

When and to whom
    For every finding of a host whose policy is ``notify`` or ``terminate`` that is still
    ``open``/``notified``, at most one round of service notices per
    ``Host.notice_interval_seconds`` (the agent rate-limits its terminal notices the same way,
    separately). A round is: one ``web`` notice row (the UI lists it; status ``sent``); an
    ``email`` to the offender (``User.email`` of the user whose ``unix_name`` is the process
    owner) and, for ``foreign``, to the rightful holder; for ``unattributed`` and
    ``unknown_uid`` (nobody to name as the offender) an ``email`` to every active admin and to
    the device's holder, if any; one ``webhook`` POST
    (``settings.webhook_url``) with ``{"text": ...}``, which Slack and Mattermost incoming
    webhooks accept. E-mail needs ``settings.smtp_host``, the webhook ``settings.webhook_url``;
    without them those channels are not used. A user without an e-mail address gets a
    ``skipped`` row saying so. Hosts that replay captures (``Host.source == "replay"``) get web
    notices only: their users belong to another machine.

Delivery: after the commit, in the background (a transactional outbox)
    :func:`queue_notices` runs inside the ingest transaction and only writes rows: e-mail and
    webhook rows start ``pending``. After that transaction commits, a background worker
    thread claims them (``pending -> sending`` with ``sent_at`` set to the claim time, an
    atomic conditional UPDATE, so two app replicas never send the same row), sends with short timeouts (SMTP 10 s, webhook 5 s) and
    records ``sent`` or ``failed`` with the error in ``detail``. Sending therefore never delays
    nor fails ingest, and a rolled-back ingest sends nothing. Rows left ``pending`` (process
    died before the commit hook ran) or ``sending`` for over 10 minutes (died mid-send) are
    picked up by the next delivery run on any replica. A ``failed`` notice is not retried; the
    next round (after the interval) tries again. :func:`wait_idle` lets tests (and a clean
    shutdown) wait for deliveries in flight.
"""

from __future__ import annotations

import logging
import smtplib
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from urllib.parse import urlsplit

from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, event, func, or_, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.models import Device, Finding, Host, Notice, NotifyTarget, User, utcnow
from app.models.states import LIVE_FINDING_STATES
from app.sanitize import email_header
from app.i18n import use_locale
from app.services import channels, notice_text
from app.services.notice_text import ADMIN_KINDS
from app.services.notice_text import clean as _clean

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

SERVICE_CHANNELS = ("web", "email", "webhook")
ACTIVE_STATES = LIVE_FINDING_STATES
SMTP_TIMEOUT_S = 10.0
WEBHOOK_TIMEOUT_S = 5.0
STUCK_AFTER = timedelta(minutes=10)
ORPHAN_AFTER = timedelta(minutes=1)

#: Transport for webhook POSTs; ``None`` is the network. Tests put an ``httpx.MockTransport`` here.
WEBHOOK_TRANSPORT: httpx.BaseTransport | None = None

_PENDING = "gpuroster.pending_notices"
_HOOKED = "gpuroster.notice_hook"
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_inflight: set[Future] = set()


# ------------------------------------------------------------------------------------------
# queueing (inside the ingest transaction)


def queue_notices(
    session: Session, *, host: Host, findings: Sequence[Finding], settings: Settings, now: datetime
) -> list[Notice]:
    """Write the notice rows due for ``findings`` of ``host`` (see the module docstring) and
    arrange delivery after the commit. Returns the new rows. Never sends anything itself."""
    if host.policy == "observe" or not findings:
        return []
    active = [f for f in findings if f.state in ACTIVE_STATES]
    if not active:
        return []
    ids = [f.id for f in active]
    last = dict(
        session.execute(
            select(Notice.finding_id, func.max(Notice.sent_at))
            .where(Notice.finding_id.in_(ids), Notice.channel == "web")  # one web row per round
            .group_by(Notice.finding_id)
        ).all()
    )
    interval = timedelta(seconds=host.notice_interval_seconds)
    due = [f for f in active if last.get(f.id) is None or now - last[f.id] >= interval]
    if not due:
        return []
    remote = host.source != "replay"
    wanted = {u for f in due for u in (f.unix_user, f.holder) if u}
    users = {u.unix_name: u for u in session.scalars(select(User).where(User.unix_name.in_(wanted)))} if wanted else {}
    admins: list[User] = []
    if any(f.kind in ADMIN_KINDS for f in due):
        admins = list(session.scalars(select(User).where(User.role == "admin", User.active.is_(True)).order_by(User.id)))
    rows: list[Notice] = []
    for f in due:
        rows.append(Notice(finding_id=f.id, channel="web", recipient=f.unix_user, sent_at=now, status="sent",
                           detail=_clean(f"{f.kind}: {f.message or ''}", 2048)))
        if not remote:
            continue
        if settings.smtp_host:
            recipients = [("offender", f.unix_user)] if f.kind not in ADMIN_KINDS else []
            if f.kind in ("foreign", *ADMIN_KINDS) and f.holder and f.holder != f.unix_user:
                recipients.append(("holder", f.holder))
            if f.kind in ADMIN_KINDS:
                for a in admins:
                    if a.email:
                        rows.append(Notice(finding_id=f.id, channel="email", recipient=a.email, sent_at=now,
                                           status="pending", detail="admin"))
                if not any(a.email for a in admins):
                    rows.append(Notice(finding_id=f.id, channel="email", recipient=None, sent_at=now, status="skipped",
                                       detail="admin: no active admin with an e-mail address"))
            for role, unix in recipients:
                if not unix:
                    continue
                user = users.get(unix)
                if user is None or not user.email or not user.active:
                    rows.append(Notice(finding_id=f.id, channel="email", recipient=unix, sent_at=now, status="skipped",
                                       detail=f"{role}: no active user with an e-mail address for unix user {unix}"))
                else:
                    rows.append(Notice(finding_id=f.id, channel="email", recipient=user.email, sent_at=now,
                                       status="pending", detail=role))
        if settings.webhook_url:
            rows.append(Notice(finding_id=f.id, channel="webhook", recipient=urlsplit(settings.webhook_url).hostname or "webhook",
                               sent_at=now, status="pending", detail="webhook"))
        rows.extend(_chat_rows(session, f, users, settings, now))
    session.add_all(rows)
    session.flush()
    pending = [n.id for n in rows if n.status == "pending"]
    if pending:
        _deliver_after_commit(session, pending, settings)
    return rows


def _chat_rows(session: Session, f: Finding, users: dict[str, User], settings: Settings, now: datetime) -> list[Notice]:
    """Pending rows for the apprise targets of a finding (see app.services.channels): the
    deployment's, the offender's groups', and the offender's (and, for ``foreign``, the
    holder's) own if they want to hear about findings. ``detail`` names the target until sent."""
    about = [users[u] for u in dict.fromkeys((f.unix_user, f.holder if f.kind == "foreign" else None)) if u in users]
    rows = [Notice(finding_id=f.id, channel="webhook", recipient=channels.redact(url)[:254], sent_at=now,
                   status="pending", detail=f"deployment:{i}") for i, url in enumerate(settings.notify_urls)]
    for t in channels.targets_for(session, users=[u for u in about if u.active], kind="findings"):
        rows.append(Notice(finding_id=f.id, channel="webhook", recipient=(t.label or channels.redact(t.url))[:254],
                           sent_at=now, status="pending", detail=f"target:{t.id}"))
    return rows


def _deliver_after_commit(session: Session, ids: list[int], settings: Settings) -> None:
    session.info.setdefault(_PENDING, []).extend(ids)
    session.info[f"{_PENDING}.settings"] = settings
    if session.info.get(_HOOKED):
        return
    session.info[_HOOKED] = True

    def after_commit(s: Session) -> None:
        todo = s.info.pop(_PENDING, [])
        conf = s.info.pop(f"{_PENDING}.settings", settings)
        if not todo:
            return
        bind = s.get_bind()
        if isinstance(bind, Connection):
            # a session bound to one connection (a transaction its owner will roll back, as the
            # test suite's are) has no pool to deliver from beside it: deliver here, on it
            _deliver_logged(bind, conf, todo)  # type: ignore[arg-type]
        else:
            submit(bind, conf, todo)

    def after_rollback(s: Session) -> None:
        s.info.pop(_PENDING, None)

    event.listen(session, "after_commit", after_commit)
    event.listen(session, "after_rollback", after_rollback)


def submit(engine: Engine, settings: Settings, ids: list[int] | None = None) -> Future:
    """Deliver the pending notices ``ids`` (and any orphaned ones) on the background worker."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpuroster-notices")
        fut = _executor.submit(_deliver_logged, engine, settings, ids)
        _inflight.add(fut)
    fut.add_done_callback(lambda f: _inflight.discard(f))
    return fut


def wait_idle(timeout: float = 30.0) -> bool:
    """Wait until no delivery is in flight; True if idle within ``timeout`` seconds."""
    with _lock:
        futures = set(_inflight)
    if not futures:
        return True
    done, not_done = wait_futures(futures, timeout=timeout)
    return not not_done


# ------------------------------------------------------------------------------------------
# delivery (after the commit, own transactions)


@dataclass
class Outgoing:
    id: int
    channel: str
    recipient: str
    subject: str
    body: str
    status: str = "failed"
    detail: str = ""
    target: str | None = None  # an apprise URL: sent through app.services.channels


def _claim(session: Session, ids: list[int] | None, now: datetime, settings: Settings) -> list[Outgoing]:
    conds = [Notice.status == "pending", Notice.channel.in_(("email", "webhook"))]
    if ids is not None:  # these, plus orphans another process queued but never sent
        conds.append(or_(Notice.id.in_(ids), Notice.sent_at < now - ORPHAN_AFTER))
    candidates = list(session.scalars(select(Notice).where(*conds).order_by(Notice.id)))
    stuck = list(session.scalars(select(Notice).where(Notice.status == "sending", Notice.sent_at < now - STUCK_AFTER)))
    out: list[Outgoing] = []
    for n in candidates + stuck:
        claimed = session.execute(
            update(Notice).where(Notice.id == n.id, Notice.status == n.status).values(status="sending", sent_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount
        if claimed != 1:
            continue
        f = session.get(Finding, n.finding_id)
        if f is None:
            continue
        host = session.get(Host, f.host_id)
        device = session.get(Device, f.device_id) if f.device_id else None
        with use_locale(notice_text.recipient_language(session, n)):  # the recipient's chosen language
            subject, body = notice_text.compose(n, f, host, device, settings)
        out.append(Outgoing(n.id, n.channel, n.recipient or "", subject, body, target=_target_url(session, n, settings)))
    return out


def _target_url(session: Session, n: Notice, settings: Settings) -> str | None:
    ref = n.detail or ""
    if ref.startswith("deployment:") and ref[11:].isdigit() and int(ref[11:]) < len(settings.notify_urls):
        return settings.notify_urls[int(ref[11:])]
    if ref.startswith("target:") and ref[7:].isdigit():
        t = session.get(NotifyTarget, int(ref[7:]))
        return t.url if t is not None else "removed:"
    return None


def _send_chats(items: list[Outgoing], settings: Settings) -> None:
    link = settings.base_url.rstrip("/") + "/findings"
    for it in items:
        if it.target == "removed:":
            it.detail = "the notification URL was removed before sending"
            continue
        sent = channels.send(it.target or "", title=it.subject, body=f"{it.body}\n{link}")
        it.status, it.detail = ("sent" if sent.ok else "failed"), sent.detail


def _send_emails(items: list[Outgoing], settings: Settings) -> None:
    if not items:
        return
    try:
        smtp = smtplib.SMTP(settings.smtp_host or "localhost", settings.smtp_port, timeout=SMTP_TIMEOUT_S)
    except (OSError, smtplib.SMTPException) as e:
        for it in items:
            it.detail = f"SMTP {settings.smtp_host}:{settings.smtp_port} unreachable: {e}"
        return
    try:
        if settings.smtp_starttls:
            smtp.starttls()
        if settings.smtp_username:
            smtp.login(settings.smtp_username, settings.smtp_password or "")
        for it in items:
            try:
                msg = EmailMessage()
                msg["From"] = settings.smtp_from
                msg["To"] = email_header(it.recipient)
                msg["Subject"] = email_header(it.subject)
                msg.set_content(it.body)
            except (ValueError, TypeError) as e:  # one unusable value fails its own notice, not the batch
                it.detail = f"notice could not be composed: {e}"[:500]
                continue
            try:
                refused = smtp.send_message(msg)
            except (OSError, smtplib.SMTPException) as e:
                it.detail = f"SMTP refused: {e}"
                continue
            if refused:
                it.detail = f"SMTP refused: {refused}"
            else:
                it.status, it.detail = "sent", f"via {settings.smtp_host}:{settings.smtp_port}"
    except (OSError, smtplib.SMTPException) as e:
        for it in items:
            if it.status != "sent":
                it.detail = it.detail or f"SMTP session failed: {e}"
    finally:
        try:
            smtp.quit()
        except (OSError, smtplib.SMTPException):
            pass


def _send_webhooks(items: list[Outgoing], settings: Settings) -> None:
    if not items or not settings.webhook_url:
        for it in items:
            it.detail = "no webhook URL configured"
        return
    import httpx  # here, not at module level: only a deployment with a webhook pays its import

    with httpx.Client(timeout=WEBHOOK_TIMEOUT_S, transport=WEBHOOK_TRANSPORT, follow_redirects=False) as client:
        for it in items:
            try:
                r = client.post(settings.webhook_url, json={"text": it.body})
            except httpx.HTTPError as e:
                it.detail = f"webhook unreachable: {type(e).__name__}: {e}"
                continue
            if 200 <= r.status_code < 300:
                it.status, it.detail = "sent", f"HTTP {r.status_code}"
            else:
                it.detail = f"webhook answered HTTP {r.status_code}: {r.text[:200]}"


def deliver(engine: Engine, settings: Settings, ids: list[int] | None = None, *, now: datetime | None = None) -> list[Outgoing]:
    """Claim and send pending notices and record the outcome: ``ids`` plus orphaned (pending
    over a minute) and stuck (sending over 10 minutes) ones; ``ids=None``: every pending one.

    Returns what was attempted. Never raises for a failed send (recorded as ``failed``);
    database errors propagate (the caller logs them).
    """
    from app.db import build_session_factory, run_in_transaction

    factory = build_session_factory(engine)
    now = now or utcnow()
    items = run_in_transaction(factory, lambda s: _claim(s, ids, now, settings))
    if not items:
        return []
    _send_emails([i for i in items if i.channel == "email"], settings)
    _send_webhooks([i for i in items if i.channel == "webhook" and i.target is None], settings)
    _send_chats([i for i in items if i.target is not None], settings)

    def finish(s: Session) -> None:
        for it in items:
            s.execute(update(Notice).where(Notice.id == it.id).values(status=it.status, detail=it.detail[:2048])
                      .execution_options(synchronize_session=False))

    run_in_transaction(factory, finish)
    for it in items:
        (log.info if it.status == "sent" else log.warning)("notice %s %s to %s: %s %s", it.id, it.channel, it.recipient, it.status, it.detail)
    return items


def _deliver_logged(engine: Engine, settings: Settings, ids: list[int] | None) -> None:
    try:
        deliver(engine, settings, ids)
    except Exception:  # noqa: BLE001 - a background worker must not die silently
        log.exception("notice delivery failed; pending notices stay queued for the next run")


__all__ = ["SERVICE_CHANNELS", "WEBHOOK_TRANSPORT", "deliver", "queue_notices", "submit", "wait_idle"]
