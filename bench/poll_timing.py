"""Timing helpers shared by the agent-poll benchmarks (``agent_poll.py``, ``agent_poll_nvml.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def timed_polls(poll: Callable[[], object], n: int, *, children: bool = False,
                after_warmup: Callable[[], None] = lambda: None) -> dict:
    """Run ``poll`` once to warm up (imports, caches), call ``after_warmup``, then ``n`` times.

    Returns ``cpu_ms`` (CPU of this process per poll, all threads, plus reaped children's if
    ``children``), ``p50_ms`` and ``p99_ms`` (wall per poll) and ``n``.
    """
    poll()
    after_warmup()
    walls = []
    cpu0, kids0 = time.process_time(), os.times()
    for _ in range(n):
        w0 = time.perf_counter()
        poll()
        walls.append(time.perf_counter() - w0)
    cpu = time.process_time() - cpu0
    if children:
        kids1 = os.times()
        cpu += (kids1.children_user - kids0.children_user) + (kids1.children_system - kids0.children_system)
    walls.sort()
    return {"n": n, "cpu_ms": cpu / n * 1000, "p50_ms": walls[n // 2] * 1000,
            "p99_ms": walls[min(n - 1, int(n * 0.99))] * 1000}


def nvitop_poll() -> None:
    """What nvitop does for one refresh: every device, its processes, their and its snapshots."""
    from nvitop import Device, GpuProcess

    devices = Device.all()
    procs = [p for d in devices for p in d.processes().values()]
    GpuProcess.take_snapshots(procs, failsafe=True)
    [d.as_snapshot() for d in devices]
