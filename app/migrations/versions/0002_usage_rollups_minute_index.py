"""usage_rollups: index on minute, for pruning history by age

The primary key (device_id, minute) cannot serve ``DELETE ... WHERE minute < :cutoff``, which
the hourly retention pruning runs (app.services.reports.prune_history); without this index it
scans the whole table, which holds one row per device and minute for the retention window.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usage_rollups_minute"), ["minute"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usage_rollups_minute"))
