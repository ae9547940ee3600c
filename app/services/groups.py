"""Groups of users (projects, sub-teams): sharing rules and reservation shares may target them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.errors import Conflict, InvalidInput, NotFound
from app.models import Group, GroupMember, User, utcnow
from app.services.users import validate_name
from app.services.audit import record_audit


def get_group(session: Session, name: str) -> Group:
    """The group called ``name``; raises NotFound (404)."""
    g = session.scalar(select(Group).where(Group.name == name))
    if g is None:
        raise NotFound(f"group {name!r} not found", field="group")
    return g


def member_names(session: Session, group: Group) -> list[str]:
    """Usernames of the group's members, sorted."""
    q = select(User.username).join(GroupMember, GroupMember.user_id == User.id).where(GroupMember.group_id == group.id)
    return sorted(session.scalars(q))


def list_groups(session: Session) -> list[tuple[Group, list[str]]]:
    """Every group with its members' usernames, by name."""
    groups = list(session.scalars(select(Group).order_by(Group.name)))
    members: dict[int, list[str]] = {g.id: [] for g in groups}
    rows = session.execute(select(GroupMember.group_id, User.username).join(User, User.id == GroupMember.user_id))
    for gid, name in rows:
        members.setdefault(gid, []).append(name)
    return [(g, sorted(members.get(g.id, []))) for g in groups]


def _users(session: Session, names: Sequence[str], *, field: str) -> list[User]:
    wanted = list(dict.fromkeys(n.strip() for n in names))
    found = {u.username: u for u in session.scalars(select(User).where(User.username.in_(wanted)))} if wanted else {}
    for n in wanted:
        if n not in found:
            raise InvalidInput(f"{field}: no user {n!r}", field=field)
    return [found[n] for n in wanted]


def create_group(
    session: Session, *, name: str, description: str | None, members: Sequence[str], actor: User
) -> Group:
    """Create a group (name like a Unix account name) with optional initial members.

    Raises InvalidInput (422) for a bad name or an unknown member, Conflict (409) when the
    name is taken.
    """
    validate_name(name, field="name")
    if session.scalar(select(Group.id).where(Group.name == name)) is not None:
        raise Conflict(f"name: group {name!r} already exists", field="name")
    users = _users(session, members, field="members")
    g = Group(name=name, description=description, created_at=utcnow())
    session.add(g)
    session.flush()
    for u in users:
        session.add(GroupMember(group_id=g.id, user_id=u.id))
    record_audit(session, actor=f"user:{actor.username}", action="group.create", target=f"group:{name}",
                 detail={"members": [u.username for u in users]})
    session.flush()
    return g


def delete_group(session: Session, *, name: str, actor: User) -> Group:
    """Delete a group; its rules and reservation shares go with it. Raises NotFound."""
    g = get_group(session, name)
    # Core delete: the database cascades to members, rules and shares (ON DELETE CASCADE).
    session.execute(delete(Group).where(Group.id == g.id))
    session.expunge(g)
    record_audit(session, actor=f"user:{actor.username}", action="group.delete", target=f"group:{name}")
    session.flush()
    return g


def add_members(session: Session, *, name: str, usernames: Sequence[str], actor: User) -> Group:
    """Add users to a group (already-members are left alone). Raises NotFound, InvalidInput."""
    g = get_group(session, name)
    users = _users(session, usernames, field="users")
    present = set(session.scalars(select(GroupMember.user_id).where(GroupMember.group_id == g.id)))
    added = [u for u in users if u.id not in present]
    for u in added:
        session.add(GroupMember(group_id=g.id, user_id=u.id))
    record_audit(session, actor=f"user:{actor.username}", action="group.add_members", target=f"group:{name}",
                 detail={"users": [u.username for u in added]})
    session.flush()
    return g


def remove_member(session: Session, *, name: str, username: str, actor: User) -> Group:
    """Remove one user from a group; raises NotFound if the group or the membership is missing."""
    g = get_group(session, name)
    uid = session.scalar(select(User.id).where(User.username == username))
    if uid is None or session.get(GroupMember, (g.id, uid)) is None:
        raise NotFound(f"user {username!r} is not a member of group {name!r}", field="user")
    session.execute(delete(GroupMember).where(GroupMember.group_id == g.id, GroupMember.user_id == uid))
    record_audit(session, actor=f"user:{actor.username}", action="group.remove_member", target=f"group:{name}",
                 detail={"user": username})
    session.flush()
    return g
