"""The audit log's one write: who did what, on what, when (``audit_log`` rows).

Each entry is one SQLAlchemy Core ``INSERT`` run at once in the caller's transaction, so it
commits or rolls back with the change it records (a savepoint rolled back takes its entries
with it). Not an ORM object: the unit of work's flush of a row nobody reads back in the same
request cost more CPU than the statement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from app.models import AuditLog

_INSERT = insert(AuditLog.__table__)


def record_audit(session: Session, *, actor: str, action: str, target: str | None = None,
                 detail: dict[str, Any] | None = None, at: datetime | None = None) -> None:
    """Write one audit entry: ``actor`` (``user:<name>``, ``host:<name>`` or ``system``),
    ``action`` (``reservation.create``, ...), ``target`` (``reservation:<id>``, ...), a JSON
    ``detail``, at ``at`` (UTC; default now). Raises what the database raises (an
    ``actor`` past 160 characters on PostgreSQL, for one)."""
    row: dict[str, Any] = {"actor": actor, "action": action, "target": target}
    if detail is not None:  # left out, not JSON null: an entry without detail stores SQL NULL
        row["detail"] = detail
    if at is not None:
        row["at"] = at
    session.execute(_INSERT, row)


__all__ = ["record_audit"]
