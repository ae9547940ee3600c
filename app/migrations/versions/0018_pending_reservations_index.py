"""index pending reservations by start: the approval queue and the expiry round read only them

Reservations awaiting approval are a handful among every reservation ever made, but the
periodic expiry of those past their start and the admins' approval queue filtered the whole
table by status, which no index served: on PostgreSQL with a large history each round read
every reservation. A partial index holds only the pending rows, so both reads stay as small
as the queue.

Revision ID: 0018_pending_reservations
Revises: 0017_reservations_end_at
Create Date: 2026-12-03 16:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_pending_reservations"
down_revision: str | None = "0017_reservations_end_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.create_index("ix_reservations_pending_start_at", "reservations", ["start_at"], unique=False,
                    postgresql_where=PENDING, sqlite_where=PENDING)


def downgrade() -> None:
    op.drop_index("ix_reservations_pending_start_at", table_name="reservations")
