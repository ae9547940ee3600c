"""waitlist: standing requests for N devices for a length within a window, served first
come, first served when a reservation frees its devices

Revision ID: 0012_waitlist
Revises: 0011_health
Create Date: 2026-12-01 05:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision: str = "0012_waitlist"
down_revision: str | None = "0011_health"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "waitlist_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False, comment="devices wanted, on one host"),
        sa.Column("seconds", sa.Integer(), nullable=False, comment="length wanted, seconds"),
        sa.Column("window_start", UTCDateTime(timezone=True), nullable=False),
        sa.Column("window_end", UTCDateTime(timezone=True), nullable=False,
                  comment="the booking must end by then; the entry expires then"),
        sa.Column("host", sa.String(length=128), nullable=True, comment="only this host (None: any)"),
        sa.Column("model", sa.String(length=128), nullable=True, comment="substring of the GPU model name"),
        sa.Column("min_memory_mib", sa.Float(), nullable=True),
        sa.Column("book", sa.Boolean(), nullable=False, comment="true: book it; false: tell the owner"),
        sa.Column("note", sa.String(length=1024), nullable=True, comment="note of the booking it makes"),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reservation_id", sa.Integer(), nullable=True),
        sa.Column("last_refusal", sa.String(length=1024), nullable=True,
                  comment="why the last auto-book was refused"),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("served_at", UTCDateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('waiting', 'booked', 'notified', 'cancelled', 'expired')",
                           name=op.f("ck_waitlist_entries_status")),
        sa.CheckConstraint("window_end > window_start", name=op.f("ck_waitlist_entries_window")),
        sa.CheckConstraint("count >= 1 AND seconds >= 1", name=op.f("ck_waitlist_entries_positive")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_waitlist_entries_user_id_users"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["reservation_id"], ["reservations.id"],
                                name=op.f("fk_waitlist_entries_reservation_id_reservations"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_waitlist_entries")),
    )
    op.create_index("ix_waitlist_entries_status_created_at", "waitlist_entries", ["status", "created_at"])
    op.create_index(op.f("ix_waitlist_entries_user_id"), "waitlist_entries", ["user_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_waitlist_entries_user_id"), table_name="waitlist_entries")
    op.drop_index("ix_waitlist_entries_status_created_at", table_name="waitlist_entries")
    op.drop_table("waitlist_entries")
