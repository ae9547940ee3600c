"""Accounts vouched for by a directory (LDAP) or an OpenID provider: provisioned on first
sign-in, refreshed on every sign-in.

Group membership follows the directory only for the gpuroster groups named in the
deployment's group map (``ldap_groups`` / ``oidc_groups``): a user is added to the mapped
groups the directory lists and removed from the other mapped ones; groups an admin manages
by hand are never touched. Like every service, nothing here commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.errors import Conflict, InvalidInput
from app.models import Group, GroupMember, User
from app.services.users import NAME_RE, create_user
from app.services.audit import record_audit


@dataclass(frozen=True)
class DirectoryAccount:
    """What a directory says about a user: ``groups`` are the directory's own group names."""

    source: str  # "ldap" | "oidc"
    username: str
    email: str | None = None
    display_name: str | None = None
    unix_name: str | None = None
    unix_uid: int | None = None
    groups: tuple[str, ...] = field(default_factory=tuple)


def mapped_groups(directory_groups: Iterable[str], group_map: Mapping[str, str]) -> set[str]:
    """gpuroster group names for the directory's group names (unmapped ones are ignored)."""
    return {group_map[g] for g in directory_groups if g in group_map}


def provision(
    session: Session, *, account: DirectoryAccount, group_map: Mapping[str, str], admin_group: str | None,
    manager_map: Mapping[str, str] | None = None,
) -> User:
    """The user for ``account``: created on first sign-in, else refreshed (e-mail, name, uid,
    groups, admin role when ``admin_group`` is configured). ``manager_map`` (directory group
    -> gpuroster group) makes the members of a directory group managers of the gpuroster
    group (and members of it); leaving the directory group ends the manager role there.

    Raises :class:`~app.errors.InvalidInput` (422) when the directory's username is not a
    valid account name, :class:`~app.errors.Conflict` (409) when a local account (or one of
    the other source) already has that username, or another user has the Unix uid.
    """
    username = account.username.strip().lower()
    if not NAME_RE.match(username):
        raise InvalidInput(f"username: the directory's name {account.username!r} is not a valid account name",
                           field="username")
    user = session.scalar(select(User).where(User.username == username))
    if user is not None and user.auth_source != account.source:
        raise Conflict(f"username: {username!r} is a {user.auth_source} account here; an admin must link it",
                       field="username")
    if account.unix_uid is not None:
        other = session.scalar(select(User).where(User.unix_uid == account.unix_uid))
        if other is not None and (user is None or other.id != user.id):
            raise Conflict(f"unix_uid: uid {account.unix_uid} already belongs to {other.username!r}", field="unix_uid")
    email = account.email if account.email and "@" in account.email else None
    if user is None:
        user = create_user(session, username=username, email=email, unix_name=account.unix_name or username,
                           display_name=account.display_name, actor=account.source)
        user.auth_source = account.source
    else:
        if email:
            user.email = email
        if account.display_name:
            user.display_name = account.display_name[:128]
    user.unix_uid = account.unix_uid if account.unix_uid is not None else user.unix_uid
    if admin_group:
        user.role = "admin" if admin_group in account.groups else "member"
    session.flush()
    manager_map = manager_map or {}
    manages = mapped_groups(account.groups, manager_map)
    _sync_groups(session, user=user, wanted=mapped_groups(account.groups, group_map) | manages,
                 managed=set(group_map.values()) | manages, source=account.source)
    _sync_managers(session, user=user, manages=manages, managed=set(manager_map.values()), source=account.source)
    return user


def _sync_managers(session: Session, *, user: User, manages: set[str], managed: set[str], source: str) -> None:
    """Set ``is_manager`` on the user's rows in the groups the directory decides managers of
    (``managed``): on where the directory says so (``manages``), off elsewhere."""
    if not managed:
        return
    rows = session.execute(select(GroupMember, Group.name).join(Group, Group.id == GroupMember.group_id)
                           .where(GroupMember.user_id == user.id, Group.name.in_(managed))).all()
    changed = {}
    for gm, name in rows:
        want = name in manages
        if bool(gm.is_manager) != want:
            gm.is_manager = want
            changed[name] = want
    if changed:
        record_audit(session, actor=source, action="user.managers_sync", target=f"user:{user.username}",
                     detail={"manager_of": sorted(n for n, on in changed.items() if on),
                             "no_longer_manager_of": sorted(n for n, on in changed.items() if not on)})
        session.flush()


def _sync_groups(session: Session, *, user: User, wanted: set[str], managed: set[str], source: str) -> None:
    if not managed:
        return
    existing = {g.name: g for g in session.scalars(select(Group).where(Group.name.in_(managed)))}
    for name in sorted(wanted - existing.keys()):
        if not NAME_RE.match(name):
            raise InvalidInput(f"{source}_groups: {name!r} is not a valid group name", field=f"{source}_groups")
        g = Group(name=name, description=f"follows the {source} directory")
        session.add(g)
        existing[name] = g
    session.flush()
    member_of = set(session.scalars(select(GroupMember.group_id).where(GroupMember.user_id == user.id)))
    added = [n for n in sorted(wanted) if existing[n].id not in member_of]
    for n in added:
        session.add(GroupMember(group_id=existing[n].id, user_id=user.id))
    gone = [g for n, g in existing.items() if n not in wanted and g.id in member_of]
    if gone:
        session.execute(delete(GroupMember).where(GroupMember.user_id == user.id,
                                                  GroupMember.group_id.in_([g.id for g in gone])))
    if added or gone:
        record_audit(session, actor=source, action="user.groups_sync", target=f"user:{user.username}",
                     detail={"added": added, "removed": sorted(g.name for g in gone)})
    session.flush()
