"""ASGI middleware and handlers that guard every response: browser security headers and
the database-outage 503 (see ``docs/security.md``)."""
