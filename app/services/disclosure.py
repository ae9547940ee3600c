"""Least disclosure: what a member may see of other members in findings and notices.

The Users API shows members each other's usernames, never e-mail addresses; findings follow
the same rule: the offender learns that the holder was told, by username, never the
holder's e-mail address.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Finding, Notice, User


def usernames_by_email(session: Session, notices: Iterable[Notice]) -> dict[str, str]:
    """``{email: username}`` for the e-mail recipients among ``notices`` (one query)."""
    emails = {n.recipient for n in notices if n.channel == "email" and n.recipient}
    if not emails:
        return {}
    return dict(session.execute(select(User.email, User.username).where(User.email.in_(emails))).tuples().all())


def visible_recipient(n: Notice, *, finding: Finding, viewer: User, names: dict[str, str]) -> str | None:
    """The recipient of ``n`` as ``viewer`` may see it (``None``: hidden).

    Admins see every recipient; anyone sees their own address or name. The finding's own
    user (the offender) sees the other recipients, with an e-mail address replaced by its
    owner's username; other members see none.
    """
    if viewer.is_admin or n.recipient is None:
        return n.recipient
    if n.recipient in (viewer.email, viewer.username, viewer.unix_name):
        return n.recipient
    own_finding = finding.unix_user is not None and finding.unix_user == viewer.unix_name
    if not own_finding:
        return None
    return names.get(n.recipient) if n.channel == "email" else n.recipient
