"""The client's failures, apart from the HTTP client itself: every command module handles
them, and importing them must not import httpx (a command imports httpx only when it sends
its first request, :mod:`app.client.api`)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """The server answered with an error status; ``doc`` is its problem document."""

    def __init__(self, status: int, doc: dict[str, Any]) -> None:
        self.status = status
        self.doc = doc
        super().__init__(self.detail)

    @property
    def detail(self) -> str:
        return str(self.doc.get("detail") or self.doc.get("title") or f"HTTP {self.status}")


class Unreachable(Exception):
    """No answer from the server (connection refused, DNS, timeout)."""


class NotConfigured(Exception):
    """No server URL or no token: ``gpuroster login`` has not been run."""
