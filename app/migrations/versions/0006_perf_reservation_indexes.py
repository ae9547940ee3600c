"""reservations: index on (user_id, end_at), for counting a user's quota as history grows

Counted sharing rules (devices at once, concurrent reservations, GPU-hours per 7 days) read
the owner's reservations that end after the window starts
(app.services.rules._owner_rows). With only ``user_id`` indexed that read grows with the
user's whole history; with ``(user_id, end_at)`` it reads just the reservations that can
overlap the window.

Revision ID: 0006_perf
Revises: 0005_hardening_feed_hash
Create Date: 2026-12-01 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006_perf"
down_revision: str | None = "0005_hardening_feed_hash"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index("ix_reservations_user_id_end_at", ["user_id", "end_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index("ix_reservations_user_id_end_at")
