"""The quick benchmarks run at a toy size and print their figures.

They are run by hand on a large lab, where a crash costs a seeding of minutes; here each
runs on two hosts in seconds, so a change that breaks one (a cache it swaps, a helper it
calls) fails the suite instead. Their figures are not checked: they depend on the machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUNS = {
    "agent_memory": (["bench/agent_memory.py", "--polls", "50"], "RSS after the first poll"),
    "devices_list": (["bench/devices_list.py", "--hosts", "2", "--requests", "2"], "GET /metrics, warm"),
    "render_now": (["bench/render_now.py", "--hosts", "2", "--renders", "2"], "warm/cold"),
    "ingest_route": (["bench/ingest_route.py", "--db", "sqlite", "--hosts", "2", "--count", "5", "--repeat", "1",
                      "--baseline", "none"], "service CPU per snapshot"),
    "ingest_route_in_flight": (["bench/ingest_route.py", "--db", "sqlite", "--hosts", "8", "--count", "16",
                               "--repeat", "1", "--concurrency", "8", "--baseline", "none"],
                              "8 in flight: service CPU per snapshot"),
    "booking_route": (["bench/ingest_route.py", "--db", "sqlite", "--route", "booking", "--hosts", "2", "--count", "5",
                       "--repeat", "1", "--baseline", "none"], "service CPU per booking"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_benchmark_runs_at_a_toy_size_and_prints_its_figures(name):
    argv, expect = RUNS[name]
    run = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert expect in run.stdout, run.stdout[-2000:]
