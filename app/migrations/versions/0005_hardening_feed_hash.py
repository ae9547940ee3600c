"""calendar feed tokens stored as SHA-256, like API tokens

``users.feed_token`` and ``hosts.feed_token`` held the secret of each calendar feed URL in
plain text: anyone who read the database (a backup, a replica) could read every calendar.
They become ``feed_token_hash`` (hex SHA-256 of the token, unique); existing feed URLs keep
working because their tokens are hashed in place. Downgrading cannot recover the tokens:
the plain columns come back empty, so feeds get new URLs on first use.

Revision ID: 0005_hardening_feed_hash
Revises: 0004_attrib_host
Create Date: 2026-12-01 02:20:00
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_hardening_feed_hash"
down_revision: str | None = "0004_attrib_host"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("users", "hosts")


def upgrade() -> None:
    conn = op.get_bind()
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("feed_token_hash", sa.String(length=64), nullable=True))
        t = sa.table(table, sa.column("id", sa.Integer), sa.column("feed_token", sa.String),
                     sa.column("feed_token_hash", sa.String))
        rows = conn.execute(sa.select(t.c.id, t.c.feed_token).where(t.c.feed_token.is_not(None))).all()
        for row_id, token in rows:
            digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
            conn.execute(t.update().where(t.c.id == row_id).values(feed_token_hash=digest))
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(batch_op.f(f"uq_{table}_feed_token"), type_="unique")
            batch_op.drop_column("feed_token")
            batch_op.create_unique_constraint(batch_op.f(f"uq_{table}_feed_token_hash"), ["feed_token_hash"])


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(batch_op.f(f"uq_{table}_feed_token_hash"), type_="unique")
            batch_op.drop_column("feed_token_hash")
            batch_op.add_column(sa.Column("feed_token", sa.String(length=64), nullable=True))
            batch_op.create_unique_constraint(batch_op.f(f"uq_{table}_feed_token"), ["feed_token"])
