"""Past reservations seeded in bulk on PostgreSQL, for the growth benchmark and the
query-plan test: ``SEED`` inserts ``:n`` past reservations (one device each, every tenth
cancelled) of the existing users on the whole GPUs of host ``:host_id``, hour by hour back
from ``:base``."""

from __future__ import annotations

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
