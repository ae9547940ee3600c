"""History seeded in bulk on PostgreSQL (``generate_series``), for the growth benchmark and
the query-plan test.

* ``SEED`` inserts ``:n`` past reservations (one device each, every tenth cancelled) of the
  existing users on the whole GPUs of host ``:host_id``, hour by hour back from ``:base``.
* ``SEED_ROLLUPS`` inserts per-minute usage rollups of every whole device (see its docstring).
* ``SEED_FINDINGS`` inserts ended findings of one host, a few a day (see its docstring).
"""

from __future__ import annotations

import math

from sqlalchemy import text

SEED = text(
    """
    WITH devs AS (
        SELECT id, row_number() OVER (ORDER BY id) - 1 AS k, count(*) OVER () AS n
          FROM devices WHERE host_id = :host_id AND parent_id IS NULL
    ), users_ AS (
        SELECT id, row_number() OVER (ORDER BY id) - 1 AS k, count(*) OVER () AS n FROM users
    ), made AS (
        INSERT INTO reservations (user_id, host_id, start_at, end_at, status, note, sequence, created_at, updated_at)
        SELECT u.id, :host_id, s.start_at, s.start_at + interval '50 minutes',
               CASE WHEN g % 10 = 0 THEN 'cancelled' ELSE 'confirmed' END, d.id::text, 0, s.start_at, s.start_at
          FROM generate_series(0, :n - 1) AS g
          JOIN devs d ON d.k = g % d.n
          JOIN users_ u ON u.k = g % u.n
          CROSS JOIN LATERAL (SELECT :base - interval '1 hour' * (g / d.n + 2) AS start_at) s
        RETURNING id, note, start_at, end_at, status
    )
    INSERT INTO reservation_devices (reservation_id, device_id, physical_id, slice_kind, start_at, end_at, active)
    SELECT id, note::int, note::int, 0, start_at, end_at, status <> 'cancelled' FROM made
    """
)

SEED_ROLLUPS = text(
    """
    WITH devs AS (
        SELECT array_agg(id ORDER BY id) AS ids, count(*) AS n FROM devices WHERE parent_id IS NULL
    ), users_ AS (
        SELECT array_agg(username ORDER BY id) AS names, array_agg(json_build_array(username) ORDER BY id) AS lists,
               count(*) AS n
          FROM users
    )
    INSERT INTO usage_rollups (device_id, minute, samples, utilization_sum, utilization_samples,
                               memory_used_sum_mib, memory_samples, users, holder)
    SELECT d.ids[1 + g % d.n],
           date_trunc('minute', CAST(:base AS timestamptz)) - interval '1 minute' * ((CAST(:n AS bigint) + d.n - 1) / d.n - g / d.n),
           4, (g % 101) * 4.0, 4, (g % 7) * 40000.0, 4,
           CASE WHEN g % 3 = 0 THEN CAST('[]' AS json) ELSE u.lists[1 + (g / 977) % u.n] END,
           CASE WHEN g % 3 = 0 THEN NULL ELSE u.names[1 + (g / 977) % u.n] END
      FROM devs d CROSS JOIN users_ u CROSS JOIN generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS g
    """
)
SEED_ROLLUPS.__doc__ = """Rows ``:lo`` to ``:hi - 1`` of ``:n`` per-minute usage rollups spread evenly over every
whole device (``parent_id IS NULL``, all hosts), row ``g`` on device ``g % devices`` at minute
``ceil(n / devices) - g // devices`` minutes before ``:base`` (floored to the minute): each
device has one row a minute for the last ``ceil(n / devices)`` minutes, up to the minute before
``:base``, oldest first (so both indexes grow at their right edge). A row holds 4 samples
(a 15 s agent interval), utilization 0-100 %, memory 0-240000 MiB summed; two rows in three
name a user (in runs of 977 rows) as both the process user and the holder, one in three is
idle (no users). Run it in chunks (``:lo``/``:hi``) to commit as it goes; see
:func:`rollup_devices_needed` for how many devices keep ``:n`` inside the retention window."""

SEED_FINDINGS = text(
    """
    WITH devs AS (
        SELECT id, uuid, row_number() OVER (ORDER BY id) - 1 AS k, count(*) OVER () AS n
          FROM devices WHERE host_id = :host_id AND parent_id IS NULL
    ), users_ AS (
        SELECT username, row_number() OVER (ORDER BY id) - 1 AS k, count(*) OVER () AS n FROM users
    )
    INSERT INTO findings (host_id, device_id, key, kind, state, pid, create_time, unix_user, uid, command, holder,
                          message, first_seen_at, last_seen_at, resolved_at, created_at)
    SELECT :host_id, d.id, 'seed:' || d.uuid || ':' || g, k.kind,
           CASE WHEN g % 10 = 0 THEN 'terminated' ELSE 'resolved' END,
           10000 + g, extract(epoch FROM t.at), u.username, 2000 + u.k, 'python train.py --run ' || g,
           CASE WHEN k.kind = 'foreign' THEN u.username END,
           k.kind || ' process of ' || u.username, t.at, t.at + interval '20 minutes', t.at + interval '20 minutes', t.at
      FROM generate_series(0, CAST(:days AS int) * CAST(:per_day AS int) - 1) AS g
      JOIN devs d ON d.k = g % d.n
      JOIN users_ u ON u.k = g % u.n
      CROSS JOIN LATERAL (SELECT (ARRAY['unreserved', 'foreign', 'overrun', 'idle'])[g % 4 + 1] AS kind) k
      CROSS JOIN LATERAL (SELECT CAST(:base AS timestamptz) - interval '1 day' * CAST(:days AS int)
                                 + interval '1 day' * g / CAST(:per_day AS int) AS at) t
    """
)
SEED_FINDINGS.__doc__ = """``:days * :per_day`` ended findings of host ``:host_id``, evenly spaced over the
``:days`` days before ``:base`` (the newest a day / ``:per_day`` before it): kinds unreserved,
foreign, overrun and idle in turn, on the host's whole devices and the users in turn, each seen
for 20 minutes; nine in ten ``resolved``, one in ten ``terminated``, none live (the live set
read by the Now view and ``/metrics`` stays the empty database's). Keys ``seed:<uuid>:<g>`` are
unique per host."""


def rollup_devices_needed(rows: int, *, days: float) -> int:
    """Whole devices that hold ``rows`` per-minute rollups within the last ``days`` days (one
    row per device and minute), so retention of ``days`` days would keep them all."""
    return max(1, math.ceil(rows / (days * 24 * 60)))
