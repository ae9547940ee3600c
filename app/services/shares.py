"""Who else may use a reservation: users and groups it is shared with (``share_with``).
Shares are never checked against sharing rules; changing them is audited."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import InvalidInput
from app.models import Group, Reservation, ReservationShare, User
from app.services.audit import record_audit


def resolve_shares(session: Session, names: Sequence[str]) -> list[ReservationShare]:
    """Shares for usernames and ``group:NAME`` entries; raises InvalidInput (field
    ``share_with``) naming an unknown user or group."""
    shares: list[ReservationShare] = []
    for raw in names:
        name = raw.strip()
        if name.startswith("group:"):
            g = session.scalar(select(Group).where(Group.name == name[6:]))
            if g is None:
                raise InvalidInput(f"share_with: no group {name[6:]!r}", field="share_with")
            shares.append(ReservationShare(group=g, user=None))
        else:
            u = session.scalar(select(User).where(User.username == name))
            if u is None:
                raise InvalidInput(f"share_with: no user {name!r}", field="share_with")
            shares.append(ReservationShare(user=u, group=None))
    return shares


def _share_key(s: ReservationShare) -> tuple[int | None, int | None]:
    """(user id, group id) of a share, new (relationship set) or loaded (ids set)."""
    user, group = s.__dict__.get("user"), s.__dict__.get("group")
    return (s.user_id if s.user_id is not None else (user.id if user is not None else None),
            s.group_id if s.group_id is not None else (group.id if group is not None else None))


def replace_shares(session: Session, r: Reservation, names: Sequence[str], *, actor: User) -> None:
    """Replace the users/groups ``r`` is shared with (``[]`` clears); never rule-checked."""
    wanted = resolve_shares(session, names)
    if {_share_key(s) for s in wanted} == {_share_key(s) for s in r.shares}:
        return
    r.shares.clear()
    session.flush()
    r.shares.extend(wanted)
    record_audit(session, actor=f"user:{actor.username}",
                 action="reservation.share",
                 target=f"reservation:{r.id}",
                 detail={"share_with": sorted(set(n.strip() for n in names))})
