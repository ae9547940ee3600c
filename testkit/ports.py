"""Loopback ports for the servers tests start (no third-party imports: the agent's tests use it)."""

from __future__ import annotations

import random
import socket

# The ports the kernel hands to outgoing connections (Linux's default when /proc is unreadable).
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 15000  # below: ports that well-known services are more likely to hold


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def free_port() -> int:
    """A loopback TCP port that nothing is bound to now, chosen below the kernel's ephemeral
    range. A port the kernel picks for ``bind(0)`` lies in that range, where every outgoing
    connection of a busy machine also draws its local port: between the check and the
    server's own bind one often took it (slapd then exited at once with status 1)."""
    lo, _hi = _ephemeral_range()
    if lo - _LOWEST >= 1000:
        for _ in range(100):
            port = random.randrange(_LOWEST, lo)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


__all__ = ["free_port"]
