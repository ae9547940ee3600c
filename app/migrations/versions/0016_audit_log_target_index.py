"""index audit_log by target: the enforcement actions of a page of findings, a reservation's changes

The findings list (API and page) reads the enforcement actions of the findings it shows by
their ``target`` (``finding:<id>``); a reservation's history, the occupied-device warnings of
ingest and a holder's notices read the log by target too. Without an index on ``target`` each
of those reads the whole audit log, which only grows.

Revision ID: 0016_audit_log_target
Revises: 0015_current_state
Create Date: 2026-12-01 23:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016_audit_log_target"
down_revision: str | None = "0015_current_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_target", ["target"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_target")
