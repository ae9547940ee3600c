"""The service's time as the agent knows it.

Time is the service's: every ack carries ``server_time``. :class:`ServiceClock` keeps the
offset (service minus this host, seconds) measured against this host's clock at the middle
of the request that brought the ack, and gives "now" in service time. The agent stamps
``collected_at`` and judges reservations with it, so a host whose clock is minutes off never
judges a job under an active reservation as unreserved.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

from agent.telemetry import log

CLOCK_WARN_S = 2.0  # an offset from the service's clock above this is logged and shown for the host


class ServiceClock:
    """Service time from this host's clock ``now`` (aware UTC) plus the measured offset.

    ``offset_s`` is ``None`` until the first ack: until then the host's clock is used as is.
    """

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.host_now = now
        self.offset_s: float | None = None

    def now(self) -> datetime:
        """Now in service time (aware UTC)."""
        return self.host_now() + timedelta(seconds=self.offset_s or 0.0)

    def measure(self, server_time: datetime, local_mid: datetime) -> float:
        """Take the offset from an ack's ``server_time`` and the host time halfway through its
        request; returns it. A change across :data:`CLOCK_WARN_S` is logged (once per crossing)."""
        offset = (server_time - local_mid).total_seconds()
        before, self.offset_s = self.offset_s, offset
        if abs(offset) > CLOCK_WARN_S and (before is None or abs(before) <= CLOCK_WARN_S):
            log.warning("this host's clock is %.1f s %s the service's: judging reservations in service time; "
                        "fix the host's time sync (chrony/ntpd)", abs(offset), "behind" if offset > 0 else "ahead of")
        elif abs(offset) <= CLOCK_WARN_S and before is not None and abs(before) > CLOCK_WARN_S:
            log.warning("this host's clock agrees with the service's again (offset %.1f s)", offset)
        return offset
