"""indexes for the lab-wide current-state reads: reservation_devices by end_at, findings by state, audit_log by action

``GET /api/v1/devices`` and ``GET /metrics`` read who holds every device now and next in one
statement: the reserved devices whose interval has not ended (app.services.lab_holds). With
history growing, only an index on ``end_at`` keeps that read to the rows that can still
hold a device; the live findings (open, notified), read lab-wide, by ``state``. The
refused-bookings counter of ``/metrics`` counts the ``audit_log`` rows of
one action: indexed by ``action`` that count reads those rows only, not the whole log.

Revision ID: 0015_current_state
Revises: 0014_language
Create Date: 2026-12-01 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015_current_state"
down_revision: str | None = "0014_language"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reservation_devices", schema=None) as batch_op:
        batch_op.create_index("ix_reservation_devices_end_at", ["end_at"], unique=False)
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.create_index("ix_findings_state", ["state"], unique=False)
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_action", ["action"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_action")
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.drop_index("ix_findings_state")
    with op.batch_alter_table("reservation_devices", schema=None) as batch_op:
        batch_op.drop_index("ix_reservation_devices_end_at")
