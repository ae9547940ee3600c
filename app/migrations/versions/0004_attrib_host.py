"""attrib host: clock, agent instance, device conflicts, process data

* ``hosts.clock_offset_s`` (service minus host clock, as the agent measured it) and
  ``clock_trouble``/``clock_trouble_at`` (the last implausible ``collected_at``).
* ``host_snapshots.agent_instance``: the idempotency key becomes (host, agent instance,
  seq), so an agent that lost its state directory and numbers from 0 again is not taken for
  a replay; rows of older agents get "".
* ``device_conflicts``: devices a host's token reported although they belong to another
  host (refused, shown to admins until an admin moves the device).
* ``device_telemetry``: ``memory_reserved_mib`` (NVML v2 structure) and whether the process
  list agrees with the memory figures (``process_data``, its detail and the last owner).

Downgrade drops the idempotency keys of agents that sent an instance id first: with them
(host, seq) may repeat, and the keys only guard against replays within a retention window.

Revision ID: 0004_attrib_host
Revises: 0003_attrib_proc
Create Date: 2026-12-01 01:47:43.060953
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.models.base


revision: str = '0004_attrib_host'
down_revision: str | None = '0003_attrib_proc'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('device_conflicts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('claimed_by_host_id', sa.Integer(), nullable=False),
    sa.Column('first_at', app.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_at', app.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['claimed_by_host_id'], ['hosts.id'], name=op.f('fk_device_conflicts_claimed_by_host_id_hosts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_device_conflicts_device_id_devices'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_device_conflicts')),
    sa.UniqueConstraint('device_id', 'claimed_by_host_id', name=op.f('uq_device_conflicts_device_id_claimed_by_host_id'))
    )
    with op.batch_alter_table('device_conflicts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_device_conflicts_claimed_by_host_id'), ['claimed_by_host_id'], unique=False)

    with op.batch_alter_table('device_telemetry', schema=None) as batch_op:
        batch_op.add_column(sa.Column('memory_reserved_mib', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('process_data', sa.String(length=16), server_default='ok', nullable=False))
        batch_op.add_column(sa.Column('process_data_detail', sa.String(length=512), nullable=True))
        batch_op.add_column(sa.Column('last_owner', sa.String(length=64), nullable=True))

    with op.batch_alter_table('host_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_instance', sa.String(length=64), server_default='', nullable=False))
        batch_op.drop_constraint(batch_op.f('uq_host_snapshots_host_id_seq'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_host_snapshots_host_id_agent_instance_seq'), ['host_id', 'agent_instance', 'seq'])

    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('clock_offset_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('clock_trouble', sa.String(length=512), nullable=True))
        batch_op.add_column(sa.Column('clock_trouble_at', app.models.base.UTCDateTime(timezone=True), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.drop_column('clock_trouble_at')
        batch_op.drop_column('clock_trouble')
        batch_op.drop_column('clock_offset_s')

    op.execute("DELETE FROM host_snapshots WHERE agent_instance <> ''")
    with op.batch_alter_table('host_snapshots', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_host_snapshots_host_id_agent_instance_seq'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_host_snapshots_host_id_seq'), ['host_id', 'seq'])
        batch_op.drop_column('agent_instance')

    with op.batch_alter_table('device_telemetry', schema=None) as batch_op:
        batch_op.drop_column('last_owner')
        batch_op.drop_column('process_data_detail')
        batch_op.drop_column('process_data')
        batch_op.drop_column('memory_reserved_mib')

    with op.batch_alter_table('device_conflicts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_device_conflicts_claimed_by_host_id'))

    op.drop_table('device_conflicts')
