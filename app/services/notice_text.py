"""The words of a finding's service notices (e-mail, chat), in the recipient's language.

:func:`compose` returns ``(subject, body)`` in the current locale (:mod:`app.i18n`);
:func:`recipient_language` says which locale a notice's recipient chose (the ``language``
of the user the e-mail address or the notification target belongs to; English for lab-wide
and group channels and for addresses no user has). The delivery in
:mod:`app.services.notices` composes each notice inside ``use_locale`` of that language.

Every value a lab member or a process chose (command lines, notes, host names) goes through
the channel's escape for a raw webhook, as before: translation changes only the fixed words.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.i18n import N_, _
from app.models import Device, Finding, Host, Notice, NotifyTarget, User
from app.models.states import FindingKind
from app.sanitize import chat_text

#: Findings about a process nobody can be named for: the admins are told.
ADMIN_KINDS = (FindingKind.UNATTRIBUTED, FindingKind.UNKNOWN_UID)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# kinds as notices name them (``unknown_uid`` with a space), marked for the catalog
KIND_WORDS = (N_("unknown uid"),)


def clean(text: str | None, limit: int = 300) -> str:
    """One line of at most ``limit`` characters: control characters become ``?``, a newline a
    space, and a cut is marked with an ellipsis."""
    t = _CONTROL.sub("?", text or "").replace("\n", " ")
    return t if len(t) <= limit else t[: limit - 1] + "…"


def recipient_language(session: Session, n: Notice) -> str | None:
    """The stored language of the user a notice goes to, or ``None`` (English)."""
    if n.channel == "email" and n.recipient:
        return session.scalar(select(User.language).where(User.email == n.recipient).limit(1))
    ref = n.detail or ""
    if ref.startswith("target:") and ref[7:].isdigit():
        target = session.get(NotifyTarget, int(ref[7:]))
        if target is not None and target.user_id is not None:
            return session.scalar(select(User.language).where(User.id == target.user_id))
    return None


def device_label(d: Device | None, uuid_hint: str | None = None) -> str:
    """``GPU 0 NVIDIA A100 (UUID GPU-…, bus 00000000:01:00.0)``; the UUID alone when unregistered."""
    if d is None:
        return _("device %(uuid)s", uuid=uuid_hint) if uuid_hint else _("an unknown device")
    idx = f"GPU {d.index} " if d.index is not None else ""
    name = f"{d.name} " if d.name else ""
    return _("%(index)s%(name)s(UUID %(uuid)s, bus %(bus)s)", index=idx, name=name, uuid=d.uuid,
             bus=d.pci_bus_id or _("n/a"))


def _kind(kind: str) -> str:
    return _(kind)


def compose(n: Notice, f: Finding, host: Host, device: Device | None, settings: Settings) -> tuple[str, str]:
    """The subject and body of notice ``n`` about finding ``f`` in the current locale."""
    where = device_label(device)
    short = where.split(" (")[0]
    proc = _("process %(pid)s (%(command)s)", pid=f.pid, command=clean(f.command, 160)) if f.pid else ""
    link = settings.base_url.rstrip("/") + "/findings"
    policy = _(host.policy)
    if f.kind in ADMIN_KINDS:
        if f.kind == "unattributed":
            who = _("a container whose owner gpuroster cannot find: id %(id)s, name %(name)s, image %(image)s",
                    id=f.container_id or "?", name=f.container_name or "?", image=f.container_image or "?")
        else:
            who = _("uid %(uid)s, unknown to gpuroster (give the user that Unix uid on the admin page)", uid=f.uid)
        held = _(", reserved by %(holder)s", holder=f.holder) if f.holder else ""
        subject = _("[gpuroster] %(kind)s process on %(host)s: %(device)s", kind=_kind(f.kind.replace("_", " ")),
                    host=host.name, device=short)
        text = _("gpuroster: %(host)s %(device)s%(held)s: %(process)s of %(who)s. Nothing is signalled until its owner is known.",
                 host=host.name, device=where, held=held, process=proc, who=who)
        if n.channel == "webhook":
            # the legacy webhook posts raw Slack/Mattermost text: the whole line as literal text;
            # apprise targets are escaped per channel by app.services.channels
            return subject, chat_text(text, limit=1000) if n.detail == "webhook" else text
        return subject, f"{text}\n\n{link}\n"
    if n.channel == "email" and n.detail == "holder":
        subject = _("[gpuroster] your reserved %(device)s on %(host)s is occupied", device=short, host=host.name)
        body = _("Your reservation %(id)s of %(device)s on %(host)s is occupied by %(user)s's %(process)s.\n"
                 "%(user)s has been told (host policy: %(policy)s).",
                 id=f.reservation_id or "", device=where, host=host.name, user=f.unix_user, process=proc, policy=policy)
        return subject, f"{body}\n\n{link}\n"
    what = {"foreign": _("on a GPU reserved by %(holder)s", holder=f.holder),
            "overrun": _("after its reservation ended"), "unreserved": _("on a GPU without a reservation"),
            "idle": _("idle reservation")}.get(f.kind, f.kind)
    subject = _("[gpuroster] %(kind)s on %(host)s: %(device)s", kind=_kind(f.kind), host=host.name, device=short)
    if n.channel == "webhook":
        # the legacy webhook (detail "webhook") gets Slack markup escaped here; apprise targets
        # are escaped per channel by app.services.channels, so they get the values as they are
        return subject, webhook_text(f, host, where, escape=chat_text if n.detail == "webhook" else plain)
    first = f.message or _("%(user)s's %(process)s on %(host)s %(device)s: %(what)s.", user=f.unix_user, process=proc,
                           host=host.name, device=where, what=what)
    return subject, first + "\n\n" + _("Host policy: %(policy)s.", policy=policy) + f"\n{link}\n"


def plain(value: object) -> str:
    """``value`` as text as it is (``None``: empty): for channels that escape on their own."""
    return "" if value is None else str(value)


def webhook_text(f: Finding, host: Host, where: str, *, escape: Callable[[object], str] = chat_text) -> str:
    """The chat message: every value a lab member or a process chose goes through ``escape``
    (:func:`app.sanitize.chat_text` for a raw webhook), so it shows literally (no mention,
    link or markup)."""
    c = escape
    if f.kind == "idle":
        return _("gpuroster: %(host)s %(device)s: reservation %(id)s of %(holder)s is idle",
                 host=c(host.name), device=c(where), id=f.reservation_id, holder=c(f.holder))
    proc = _("process %(pid)s %(command)s", pid=f.pid, command=c(f.command)) if f.pid else _("a process")
    what = {"foreign": _("on a GPU reserved by %(holder)s", holder=c(f.holder)),
            "overrun": _("after its reservation ended"),
            "unreserved": _("on a GPU without a reservation")}.get(f.kind, c(f.kind))
    return _("gpuroster: %(host)s %(device)s: %(user)s's %(process)s %(what)s (policy %(policy)s, state %(state)s)",
             host=c(host.name), device=c(where), user=c(f.unix_user), process=proc, what=what,
             policy=_(host.policy), state=_(f.state))
