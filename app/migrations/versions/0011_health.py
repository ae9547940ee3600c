"""health quarantine: device_quarantines, devices.health_ack, hosts.health_watch

Revision ID: 0011_health
Revises: 0010_boosts
Create Date: 2026-12-01 05:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision: str = "0011_health"
down_revision: str | None = "0010_boosts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "device_quarantines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.Column("conditions", sa.JSON(), nullable=False),
        sa.Column("self_clearing", sa.Boolean(), nullable=False),
        sa.Column("started_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("condition_gone_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("cleared_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("cleared_by", sa.String(length=160), nullable=True),
        sa.Column("clear_note", sa.String(length=512), nullable=True),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name=op.f("fk_device_quarantines_device_id_devices"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_device_quarantines_host_id_hosts"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_quarantines")),
    )
    op.create_index(op.f("ix_device_quarantines_device_id"), "device_quarantines", ["device_id"], unique=False)
    op.create_index("ix_device_quarantines_open", "device_quarantines", ["host_id", "cleared_at"], unique=False)
    with op.batch_alter_table("devices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("health_ack", sa.JSON(), nullable=True))
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("health_watch", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("health_watch")
    with op.batch_alter_table("devices", schema=None) as batch_op:
        batch_op.drop_column("health_ack")
    op.drop_index("ix_device_quarantines_open", table_name="device_quarantines")
    op.drop_index(op.f("ix_device_quarantines_device_id"), table_name="device_quarantines")
    op.drop_table("device_quarantines")
