"""language: each user's preferred language for pages and notices

A NULL language leaves the choice to the browser's Accept-Language (pages) and to English
(notices), so existing accounts keep what they saw before.

Revision ID: 0014_language
Revises: 0013_checkin
Create Date: 2026-12-01 05:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0014_language"
down_revision: str | None = "0013_checkin"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("language", sa.String(length=16), nullable=True,
                                      comment="preferred locale; NULL: browser's choice"))


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("language")
