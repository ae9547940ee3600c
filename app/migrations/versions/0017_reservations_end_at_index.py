"""index reservations by end: the holders of every device read only reservations not yet ended

The device list, the Now page and the lab-wide holders cache join the reserved devices that
end after an instant to their reservations. With only (host, end) and (user, end) indexes the
planner could reach reservations by scanning all of them, and it did once the history was
large and a booking far ahead skewed its estimate of how many rows end in the future: the
read then grew with every past reservation. The queries also filter reservations by their
own end (never earlier than any of their devices'), which this index serves.

Revision ID: 0017_reservations_end_at
Revises: 0016_audit_log_target
Create Date: 2026-12-02 00:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017_reservations_end_at"
down_revision: str | None = "0016_audit_log_target"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index("ix_reservations_end_at", ["end_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index("ix_reservations_end_at")
