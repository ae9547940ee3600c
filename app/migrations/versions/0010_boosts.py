"""quota boosts; calendar GPU-hour limits on sharing rules

quota_boosts holds a member's request for a temporary raise of one limit and its decision;
users.boost_until the latest end of a user's approved boosts; sharing_rules gains GPU-hours per calendar day, ISO week and month (lab time zone).

Revision ID: 0010_boosts
Revises: 0009_approvals
Create Date: 2026-12-01 05:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision: str = "0010_boosts"
down_revision: str | None = "0009_approvals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("boost_until", UTCDateTime(timezone=True), nullable=True))
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_gpu_hours_day", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("max_gpu_hours_week", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("max_gpu_hours_month", sa.Float(), nullable=True))
    op.create_table(
        "quota_boosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("limit_name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("ends_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("decided_by_id", sa.Integer(), nullable=True),
        sa.Column("decided_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("decision_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'approved', 'denied')", name=op.f("ck_quota_boosts_status")),
        sa.CheckConstraint("value > 0", name=op.f("ck_quota_boosts_value_positive")),
        sa.ForeignKeyConstraint(["decided_by_id"], ["users.id"], name=op.f("fk_quota_boosts_decided_by_id_users"),
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_quota_boosts_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_boosts")),
    )
    op.create_index("ix_quota_boosts_user_id_ends_at", "quota_boosts", ["user_id", "ends_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_quota_boosts_user_id_ends_at", table_name="quota_boosts")
    op.drop_table("quota_boosts")
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        batch_op.drop_column("max_gpu_hours_month")
        batch_op.drop_column("max_gpu_hours_week")
        batch_op.drop_column("max_gpu_hours_day")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("boost_until")
