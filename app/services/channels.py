"""Notices where labs talk: apprise URLs of the deployment, groups and users, each user's
choice of notice kinds, and one sanitiser per chat sink.

Targets
    ``settings.notify_urls`` (deployment, from the environment), ``NotifyTarget`` rows with
    no owner (deployment, added by an admin), rows of a group (every member's notices go
    there) and rows of a user (that user's own notices, if they want the kind). URLs carry
    secrets (webhook tokens), so lists show :func:`redact`-ed URLs only.

Escaping
    Notices quote text users control (process command lines, host names, notes). Before a
    message leaves, :func:`sanitize` applies the sanitiser of the target's sink (its URL
    scheme) so that a command line like ``<!channel> <http://x|click>`` is shown as text, not
    as a mention or a link. Slack's ``&``, ``<``, ``>`` are escaped by apprise's Slack
    plugin itself for plain-text bodies (escaping them here too would show ``&amp;lt;``);
    Mattermost takes Slack-style text without that step, so it is escaped here, with its
    Markdown and ``@channel``-style mentions; Feishu/Lark text turns ``<at …>`` tags into
    mentions; DingTalk and WeCom text messages mention only by the payload's own fields.
    Every sink loses control characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.errors import Forbidden, InvalidInput, NotFound
from app.models import NOTICE_KINDS, GroupMember, NoticePreference, NotifyTarget, User

MAX_URL = 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MENTION = re.compile(r"@(?=(channel|here|all|everyone)\b)", re.IGNORECASE)
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#|~])")


def _plain(text: str) -> str:
    return _CONTROL.sub("?", text)


def _slack(text: str) -> str:
    return _plain(text)  # apprise's Slack plugin escapes & < > of a TEXT body (see module docstring)


def _mattermost(text: str) -> str:
    t = _plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MENTION.sub("@\u200b", _MARKDOWN.sub(r"\\\1", t))


def _feishu(text: str) -> str:
    return _plain(text).replace("<", "\uff1c").replace(">", "\uff1e")


def _generic(text: str) -> str:
    t = _plain(text).replace("<!", "<\u200b!")
    return _MENTION.sub("@\u200b", t)


#: One sanitiser per sink, by apprise URL scheme; other schemes get the generic one.
SANITISERS: dict[str, Callable[[str], str]] = {
    "slack": _slack, "mmost": _mattermost, "mmosts": _mattermost,
    "dingtalk": _plain, "wecombot": _plain, "feishu": _feishu, "lark": _feishu,
    "mailto": _plain, "mailtos": _plain,
}


def scheme(url: str) -> str:
    """The apprise scheme of ``url`` (``mmost``, ``dingtalk``, ``mailto`` …), lower case."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def sanitize(url: str, text: str) -> str:
    """``text`` made safe for the markup of the sink ``url`` points at (see module docstring)."""
    return SANITISERS.get(scheme(url), _generic)(text)


def redact(url: str) -> str:
    """``scheme://host/…`` without the path, query and credentials that carry webhook tokens;
    a "host" that is no host name (apprise puts DingTalk, WeCom, Feishu tokens there) becomes ``…``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = host if ("." in host or ":" in host or host == "localhost") else "…"
    return f"{parts.scheme}://{shown}/…"


def validate_url(url: str) -> str:
    """The URL, stripped, if apprise knows its scheme and accepts it; raises InvalidInput (422)."""
    url = (url or "").strip()
    if not url or len(url) > MAX_URL:
        raise InvalidInput(f"url: 1 to {MAX_URL} characters", field="url")
    import apprise  # here, not at module level: it costs a tenth of a second of every server start

    if apprise.Apprise.instantiate(url) is None:
        raise InvalidInput(f"url: apprise does not accept {redact(url)!r} (see docs/notices.md for the URL forms)",
                           field="url")
    return url


# ------------------------------------------------------------------------------------------
# targets and preferences


def add_target(session: Session, *, actor: User, url: str, label: str | None = None, user: User | None = None,
               group_id: int | None = None) -> NotifyTarget:
    """Add an apprise URL for the deployment (neither ``user`` nor ``group_id``; admins), a group
    (admins) or a user (that user, or an admin). Raises InvalidInput, Forbidden."""
    if (user is None or user.id != actor.id) and not actor.is_admin:
        raise Forbidden("only admins set the deployment's, a group's or another user's notification URLs")
    if label is not None and len(label) > 128:
        raise InvalidInput("label: at most 128 characters", field="label")
    row = NotifyTarget(url=validate_url(url), label=label, user_id=user.id if user else None, group_id=group_id)
    session.add(row)
    session.flush()
    return row


def visible_targets(session: Session, *, viewer: User) -> list[NotifyTarget]:
    """Every target for an admin; a member's own ones otherwise (by id)."""
    q = select(NotifyTarget).order_by(NotifyTarget.id)
    if not viewer.is_admin:
        q = q.where(NotifyTarget.user_id == viewer.id)
    return list(session.scalars(q))


def remove_target(session: Session, *, actor: User, target_id: int) -> None:
    """Delete a target: its owner or an admin. Raises NotFound."""
    row = session.get(NotifyTarget, target_id)
    if row is None or (not actor.is_admin and row.user_id != actor.id):
        raise NotFound(f"notify target {target_id} not found", field="target")
    session.execute(delete(NotifyTarget).where(NotifyTarget.id == target_id))


def preferences(session: Session, *, user: User) -> dict[str, bool]:
    """The user's choice per kind of ``NOTICE_KINDS`` (no row: wanted)."""
    rows = dict(session.execute(select(NoticePreference.kind, NoticePreference.enabled)
                                .where(NoticePreference.user_id == user.id)).all())
    return {k: bool(rows.get(k, True)) for k in NOTICE_KINDS}


def set_preferences(session: Session, *, user: User, choices: Mapping[str, bool]) -> dict[str, bool]:
    """Store the user's choices (kinds not given keep theirs). Raises InvalidInput for an unknown kind."""
    for kind in choices:
        if kind not in NOTICE_KINDS:
            raise InvalidInput(f"{kind}: not a notice kind (one of {', '.join(NOTICE_KINDS)})", field=kind)
    current = {p.kind: p for p in session.scalars(select(NoticePreference).where(NoticePreference.user_id == user.id))}
    for kind, on in choices.items():
        if kind in current:
            current[kind].enabled = bool(on)
        else:
            session.add(NoticePreference(user_id=user.id, kind=kind, enabled=bool(on)))
    session.flush()
    return preferences(session, user=user)


def wanting(session: Session, users: Iterable[User], kind: str) -> list[User]:
    """Those of ``users`` who have not turned ``kind`` off."""
    users = list(users)
    if not users:
        return []
    off = set(session.scalars(select(NoticePreference.user_id).where(
        NoticePreference.user_id.in_([u.id for u in users]), NoticePreference.kind == kind,
        NoticePreference.enabled.is_(False))))
    return [u for u in users if u.id not in off]


def targets_for(session: Session, *, users: Iterable[User], kind: str) -> list[NotifyTarget]:
    """Targets a notice of ``kind`` about ``users`` goes to: the deployment's rows, the groups
    of those users, and the own rows of those who want ``kind`` (deduplicated, by id)."""
    users = list(users)
    ids = [u.id for u in users]
    group_ids = list(session.scalars(select(GroupMember.group_id).where(GroupMember.user_id.in_(ids)))) if ids else []
    own = [u.id for u in wanting(session, users, kind)]
    cond = (NotifyTarget.user_id.is_(None) & NotifyTarget.group_id.is_(None))
    if group_ids:
        cond = cond | NotifyTarget.group_id.in_(group_ids)
    if own:
        cond = cond | NotifyTarget.user_id.in_(own)
    return list(session.scalars(select(NotifyTarget).where(cond).order_by(NotifyTarget.id)))


# ------------------------------------------------------------------------------------------
# sending


@dataclass
class Sent:
    """The outcome of one send: ``ok`` and a line for the notice's ``detail``."""

    ok: bool
    detail: str


def send(url: str, *, title: str, body: str) -> Sent:
    """Send one notice through apprise to ``url``, sanitised for its sink; never raises for a
    failed delivery (the reason, from apprise's log, is in ``detail``)."""
    import apprise  # see validate_url

    obj = apprise.Apprise()
    if not obj.add(url):
        return Sent(False, f"apprise does not accept {redact(url)}")
    with apprise.LogCapture(level=apprise.logging.WARNING) as log:
        ok = obj.notify(title=sanitize(url, title.replace("\n", " ")), body=sanitize(url, body),
                        body_format=apprise.NotifyFormat.TEXT)
    detail = f"via {redact(url)}" if ok else f"{redact(url)} failed: {log.getvalue().strip()[-300:] or 'no reason given'}"
    return Sent(bool(ok), detail)


__all__ = ["SANITISERS", "Sent", "add_target", "preferences", "redact", "remove_target", "sanitize", "scheme",
           "send", "set_preferences", "targets_for", "validate_url", "visible_targets", "wanting"]
