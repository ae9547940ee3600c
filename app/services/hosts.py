"""Hosts (GPU servers) and their host tokens."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from app.models import Host, User
from app.security import HOST_TOKEN_PREFIX, new_token, token_hash
from app.services.audit import record_audit

HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def create_host(session: Session, *, name: str, actor: str = "system") -> tuple[Host, str]:
    """Register a host; returns it and its plain host token (shown once, stored as SHA-256)."""
    if not HOST_RE.match(name or ""):
        raise InvalidInput(f"name: {name!r} is not a valid host name", field="name")
    if session.scalar(select(Host.id).where(Host.name == name)) is not None:
        raise Conflict(f"name: host {name!r} already exists", field="name")
    plain = new_token(HOST_TOKEN_PREFIX)
    host = Host(name=name, token_hash=token_hash(plain), exempt_users=[])
    session.add(host)
    session.flush()
    record_audit(session, actor=actor, action="host.create", target=f"host:{name}")
    return host, plain


def rotate_host_token(session: Session, *, host: Host, actor: str) -> str:
    plain = new_token(HOST_TOKEN_PREFIX)
    host.token_hash = token_hash(plain)
    record_audit(session, actor=actor, action="host.rotate_token", target=f"host:{host.name}")
    return plain


def update_host(session: Session, *, actor: User, name: str, changes: dict[str, Any]) -> Host:
    """Set a host's enforcement settings (``changes``: fields of ``HostUpdate`` that were
    given: policy, grace, kill timeout, notice interval, min uid, exempt lists, idle
    minutes); audit-logged. Raises NotFound."""
    host = get_host(session, name)
    for k, v in changes.items():
        setattr(host, k, v)
    record_audit(session, actor=f"user:{actor.username}", action="host.update", target=f"host:{name}", detail=changes)
    session.flush()
    return host


def host_names(session: Session) -> tuple[list[str], frozenset[str]]:
    """Every host's name, in name order, and those of the hosts whose agent replays bundled
    captures instead of reading live GPUs (``source == "replay"``), which every page that
    lists hosts marks; one query."""
    rows = session.execute(select(Host.name, Host.source).order_by(Host.name)).all()
    return [name for name, _ in rows], frozenset(name for name, source in rows if source == "replay")


def get_host(session: Session, name: str) -> Host:
    host = session.scalar(select(Host).where(Host.name == name))
    if host is None:
        raise NotFound(f"host {name!r} not found", field="host")
    return host


# Built once: every agent snapshot looks its host up, and building the statement anew made
# SQLAlchemy compute its cache key each time (more than executing it).
_HOST_BY_TOKEN = select(Host).where(Host.token_hash == bindparam("token_hash"))


_HOSTS_BY_TOKENS = select(Host).where(Host.token_hash.in_(bindparam("token_hashes", expanding=True)))


def hosts_for_tokens(session: Session, plains: list[str]) -> dict[str, Host]:
    """The hosts of the tokens ``plains``, in one statement (a batch of snapshots); a token of
    no host is absent. Pass the answer to :func:`host_for_token` as ``known``."""
    by_hash = {token_hash(p): p for p in plains}
    if not by_hash:
        return {}
    return {by_hash[h.token_hash]: h for h in session.scalars(_HOSTS_BY_TOKENS, {"token_hashes": sorted(by_hash)})}


def host_for_token(session: Session, plain: str, known: dict[str, Host] | None = None) -> Host:
    """The host whose token is ``plain`` (read from the database on every call, so a rotated
    or deleted token is refused at once; ``known``: :func:`hosts_for_tokens`' answer, read in
    this transaction, instead); raises Unauthorized (401)."""
    host = known.get(plain) if known is not None else session.scalar(_HOST_BY_TOKEN, {"token_hash": token_hash(plain)})
    if host is None:
        raise Unauthorized("invalid host token")
    return host


def require_same_host(host: Host, name: str) -> None:
    if host.name != name:
        raise Forbidden(f"host: this token belongs to host {host.name!r}, not {name!r}", field="host")
