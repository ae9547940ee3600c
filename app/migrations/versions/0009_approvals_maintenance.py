"""approval and maintenance: pending/denied/expired statuses, reservation kind, group
managers, approval thresholds on sharing rules

A pending reservation keeps its reservation_devices rows active, so the exclusion
constraints treat a pending hold as holding (no double booking while it awaits approval).

Revision ID: 0009_approvals
Revises: 0008_identity
Create Date: 2026-12-01 03:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0009_approvals"
down_revision: str | None = "0008_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_STATUS = "status IN ('confirmed', 'cancelled', 'released')"
NEW_STATUS = "status IN ('confirmed', 'cancelled', 'released', 'pending', 'denied', 'expired')"


def upgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=16), server_default="booking", nullable=False,
                                      comment="maintenance: an admin's hold of hosts/devices (may be open-ended)"))
        batch_op.drop_constraint(op.f("ck_reservations_status"), type_="check")
        batch_op.create_check_constraint(op.f("ck_reservations_status"), NEW_STATUS)
        batch_op.create_check_constraint(op.f("ck_reservations_kind"), "kind IN ('booking', 'maintenance')")
    with op.batch_alter_table("group_members", schema=None) as batch_op:
        batch_op.add_column(sa.Column("is_manager", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approval_above_devices", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("approval_above_seconds", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("approval_above_ahead_seconds", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("approval_above_gpu_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    op.execute("UPDATE reservations SET status = 'cancelled' WHERE status IN ('pending', 'denied', 'expired')")
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        batch_op.drop_column("approval_above_gpu_hours")
        batch_op.drop_column("approval_above_ahead_seconds")
        batch_op.drop_column("approval_above_seconds")
        batch_op.drop_column("approval_above_devices")
    with op.batch_alter_table("group_members", schema=None) as batch_op:
        batch_op.drop_column("is_manager")
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_reservations_kind"), type_="check")
        batch_op.drop_constraint(op.f("ck_reservations_status"), type_="check")
        batch_op.create_check_constraint(op.f("ck_reservations_status"), OLD_STATUS)
        batch_op.drop_column("kind")
