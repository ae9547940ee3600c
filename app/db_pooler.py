"""PostgreSQL driver settings, including those for a transaction-mode pooler (PgBouncer).

Behind PgBouncer in ``pool_mode = transaction`` consecutive transactions of one client
connection may run on different server connections, so nothing may live in the server
session between transactions:

- psycopg prepares a statement server-side after it ran ``prepare_threshold`` times (5 by
  default); the next transaction may land on a server connection that never saw it
  (``prepared statement "_pg3_0" does not exist``). ``prepare_threshold=None`` turns that off.
- a startup ``options`` parameter (``-c timezone=UTC``) is refused by PgBouncer
  (``unsupported startup parameter: options``), so none is sent.
- the session time zone is not relied on: every timestamp column is ``timestamptz`` and the
  service converts the aware datetimes psycopg returns to UTC itself.

Pooler mode is on with ``GPUROSTER_PGBOUNCER=true`` or a ``?pgbouncer=true`` flag on the
database URL (removed before the URL reaches the driver).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from app.config import Settings

_TRUE = {"1", "true", "yes", "on"}


def pooler_mode(settings: Settings, url: URL) -> tuple[URL, bool]:
    """``url`` without its ``pgbouncer`` query flag, and whether pooler mode is on
    (the flag or ``settings.pgbouncer``)."""
    flag = url.query.get("pgbouncer")
    if flag is None:
        return url, settings.pgbouncer
    value = flag if isinstance(flag, str) else flag[-1]
    return url.difference_update_query(["pgbouncer"]), settings.pgbouncer or value.lower() in _TRUE


def postgres_connect_args(pooled: bool) -> dict[str, Any]:
    """psycopg 3 connection arguments: direct connections pin the session to UTC with a
    startup option; pooled ones send no startup option and never prepare statements."""
    if pooled:
        return {"prepare_threshold": None}
    return {"options": "-c timezone=UTC"}
