"""check-in by evidence and idle holders: reservation check-in/idle columns, their rule
settings on sharing_rules, the service's no_show and idle_holder finding kinds

Revision ID: 0013_checkin
Revises: 0012_waitlist
Create Date: 2026-12-01 05:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime


revision: str = "0013_checkin"
down_revision: str | None = "0012_waitlist"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = "kind IN ('unreserved', 'foreign', 'overrun', 'idle', 'unattributed', 'unknown_uid')"
NEW_KINDS = "kind IN ('unreserved', 'foreign', 'overrun', 'idle', 'unattributed', 'unknown_uid', 'no_show', 'idle_holder')"
AUTO_RELEASE = "auto_release IN ('no_show', 'idle', 'idle_devices', 'idle_consent')"
SILENCE = "idle_silence IN ('nothing', 'release', 'release_idle_devices')"
RESERVATION_TIMES = (
    ("checked_in_at", "first holder process seen on its devices"),
    ("checkin_warned_at", "holder told: no check-in yet"),
    ("checkin_kept_at", "holder answered keep to the no-show warning"),
    ("idle_asked_at", "holder asked: still using it?"),
    ("idle_kept_at", "holder answered keep to the idle question"),
)
RULE_INTS = (
    ("checkin_minutes", "check-in window after the start"),
    ("checkin_min_booking_minutes", "shorter bookings: no check-in"),
    ("checkin_grace_minutes", "after the warning, before release"),
    ("idle_below_percent", "compute utilization counted as idle"),
    ("idle_after_minutes", "idle this long: holder asked"),
    ("idle_grace_minutes", "after the question, before silence counts"),
)


def upgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        for name, comment in RESERVATION_TIMES:
            batch_op.add_column(sa.Column(name, UTCDateTime(timezone=True), nullable=True, comment=comment))
        batch_op.add_column(sa.Column("auto_release", sa.String(length=16), nullable=True,
                                      comment="why it was released: see AUTO_RELEASES"))
        batch_op.create_check_constraint(op.f("ck_reservations_auto_release"), AUTO_RELEASE)
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        for name, comment in RULE_INTS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True, comment=comment))
        batch_op.add_column(sa.Column("idle_silence", sa.String(length=24), nullable=True,
                                      comment="nothing | release | release_idle_devices"))
        batch_op.create_check_constraint(op.f("ck_sharing_rules_idle_silence"), SILENCE)
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_findings_kind"), type_="check")
        batch_op.create_check_constraint("kind", NEW_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM findings WHERE kind IN ('no_show', 'idle_holder')")
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_findings_kind"), type_="check")
        batch_op.create_check_constraint("kind", OLD_KINDS)
    with op.batch_alter_table("sharing_rules", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_sharing_rules_idle_silence"), type_="check")
        batch_op.drop_column("idle_silence")
        for name, _comment in reversed(RULE_INTS):
            batch_op.drop_column(name)
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_reservations_auto_release"), type_="check")
        batch_op.drop_column("auto_release")
        for name, _comment in reversed(RESERVATION_TIMES):
            batch_op.drop_column(name)
