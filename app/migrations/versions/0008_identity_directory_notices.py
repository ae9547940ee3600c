"""users: auth_source; notify_targets and notice_preferences

Directory sign-in (LDAP, OIDC) records where an account comes from; apprise notification URLs belong to the deployment, a group or a user, and
each user's choice of notice kinds is stored.

Revision ID: 0008_identity
Revises: 0007_lifecycle_idempotency
Create Date: 2026-12-01 02:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision: str = "0008_identity"
down_revision: str | None = "0007_lifecycle_idempotency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("auth_source", sa.String(length=16), server_default="local", nullable=False))
    op.create_table(
        "notify_targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("url", sa.String(length=1024), nullable=False),
        sa.Column("label", sa.String(length=128), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("user_id IS NULL OR group_id IS NULL", name=op.f("ck_notify_targets_one_owner")),
        sa.ForeignKeyConstraint(["group_id"], ["groups.id"], name=op.f("fk_notify_targets_group_id_groups"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_notify_targets_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notify_targets")),
    )
    op.create_index(op.f("ix_notify_targets_group_id"), "notify_targets", ["group_id"], unique=False)
    op.create_index(op.f("ix_notify_targets_user_id"), "notify_targets", ["user_id"], unique=False)
    op.create_table(
        "notice_preferences",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.CheckConstraint("kind IN ('findings', 'approvals', 'waitlist', 'no_shows', 'quarantine')",
                           name=op.f("ck_notice_preferences_kind")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_notice_preferences_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("user_id", "kind", name=op.f("pk_notice_preferences")),
    )


def downgrade() -> None:
    op.drop_table("notice_preferences")
    op.drop_index(op.f("ix_notify_targets_user_id"), table_name="notify_targets")
    op.drop_index(op.f("ix_notify_targets_group_id"), table_name="notify_targets")
    op.drop_table("notify_targets")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("auth_source")
