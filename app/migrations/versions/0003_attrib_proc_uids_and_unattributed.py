"""users.unix_uid; findings for containers without an owner and uids nobody has

``users.unix_uid`` (nullable, unique) lets the agents judge processes of directory users whose
uid has no passwd entry on the GPU host. ``findings`` gains two kinds, ``unattributed`` (a
container whose owner cannot be found) and ``unknown_uid``, and the container's name and image,
which admins need to find an unattributed container.

Revision ID: 0003_attrib_proc
Revises: 0002
Create Date: 2026-12-01 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_attrib_proc"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = "kind IN ('unreserved', 'foreign', 'overrun', 'idle')"
NEW_KINDS = "kind IN ('unreserved', 'foreign', 'overrun', 'idle', 'unattributed', 'unknown_uid')"


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("unix_uid", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_users_unix_uid"), ["unix_uid"])
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("container_name", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("container_image", sa.String(length=512), nullable=True))
        batch_op.drop_constraint(batch_op.f("ck_findings_kind"), type_="check")
        batch_op.create_check_constraint("kind", NEW_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM findings WHERE kind IN ('unattributed', 'unknown_uid')")
    with op.batch_alter_table("findings", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_findings_kind"), type_="check")
        batch_op.create_check_constraint("kind", OLD_KINDS)
        batch_op.drop_column("container_image")
        batch_op.drop_column("container_name")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_users_unix_uid"), type_="unique")
        batch_op.drop_column("unix_uid")
