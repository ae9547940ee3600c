"""CPU cost of one agent poll on a real GPU host (real NVML), against gpustat, nvitop and nvidia-smi.

``bench/agent_poll.py`` compares the tools over a fake NVML, which separates each tool's own
Python work from NVML's; this script is its counterpart on a machine with NVIDIA GPUs, where
NVML calls are ioctls into the driver and cost what they cost. Compared in the same run, over
the GPUs and compute processes the host has at the time:

* gpuroster-agent: ``SnapshotBuilder.build()`` over ``NvmlSource()`` (the real ``pynvml``),
  owner lookup with its cache, plus ``model_dump_json()`` (what is posted);
* the same, with every NVML call timed (CPU, all threads): the NVML share of a poll;
* gpustat: ``GPUStatCollection.new_query()`` (wall time includes its 0.1 s sleep per GPU;
  CPU does not);
* nvitop: ``Device.all()`` + processes + ``GpuProcess.take_snapshots()`` + device snapshots;
* ``nvidia-smi --query-gpu=... --query-compute-apps=...`` (two CSV calls, what a shell
  script polls), CPU of the children included.

Prints CPU ms per poll, wall p50/p99, the share of one core at a 5 s and a 1 s interval and
each ratio to the agent's figure. Asserts nothing; machine-dependent. Needs the ``bench``
extra (gpustat, nvitop); a tool that is not installed is left out and said so.
Run: ``.venv/bin/python bench/agent_poll_nvml.py [--polls 500]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml  # noqa: E402

from agent.collect import SnapshotBuilder  # noqa: E402
from agent.nvml import NvmlSource  # noqa: E402
from agent.owners import OwnerResolver  # noqa: E402
from bench.poll_timing import nvitop_poll, timed_polls  # noqa: E402

SMI_GPU = "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw,power.limit"
SMI_APPS = "pid,gpu_uuid,used_memory,process_name"


class TimedNvml:
    """``pynvml`` with every ``nvml*`` call counted and its CPU time (all threads) summed."""

    def __init__(self, lib: object) -> None:
        self._lib = lib
        self.calls = 0
        self.cpu = 0.0

    def __getattr__(self, name: str) -> object:
        value = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def timed(*args: object, **kwargs: object) -> object:
            t0 = time.process_time()
            try:
                return value(*args, **kwargs)
            finally:
                self.cpu += time.process_time() - t0
                self.calls += 1

        return timed


def measure(name: str, poll: Callable[[], object], n: int, *, children: bool = False,
            after_warmup: Callable[[], None] = lambda: None) -> dict:
    """``timed_polls`` with the path's name."""
    return {"name": name, **timed_polls(poll, n, children=children, after_warmup=after_warmup)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=500, help="polls of the agent and nvitop (gpustat and nvidia-smi: a tenth)")
    args = ap.parse_args()
    started = time.perf_counter()
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    gpus = pynvml.nvmlDeviceGetCount()
    names = sorted({pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(gpus)})
    results = []

    builder = SnapshotBuilder(NvmlSource(expect_gpus=True), host="bench", resolver=OwnerResolver())
    seq = iter(range(10**9))
    now = datetime.now(UTC)
    first = builder.build(next(seq), now)
    if first.monitoring.status != "ok" or len([d for d in first.devices if d.parent_uuid is None]) != gpus:
        print(f"the agent's poll does not work here: {first.monitoring}, {len(first.devices)} device(s) of {gpus}")
        return 1

    def agent_poll() -> None:
        builder.build(next(seq), now).model_dump_json()

    results.append(measure("gpuroster-agent", agent_poll, args.polls))

    timed = TimedNvml(pynvml)
    timed_builder = SnapshotBuilder(NvmlSource(lib=timed, expect_gpus=True), host="bench", resolver=OwnerResolver())

    def timed_poll() -> None:
        timed_builder.build(next(seq), now).model_dump_json()

    def reset() -> None:
        timed.calls, timed.cpu = 0, 0.0

    nvml = SimpleNamespace(**measure("agent, NVML timed", timed_poll, args.polls, after_warmup=reset))
    nvml.calls, nvml.nvml_ms = timed.calls / args.polls, timed.cpu / args.polls * 1000

    missing = []
    try:
        import gpustat.core

        results.append(measure("gpustat new_query", gpustat.core.GPUStatCollection.new_query, max(10, args.polls // 10)))
    except ImportError:
        missing.append("gpustat")
    if importlib.util.find_spec("nvitop") is not None:
        results.append(measure("nvitop snapshot", nvitop_poll, args.polls))
    else:
        missing.append("nvitop")
    smi = shutil.which("nvidia-smi")
    if smi:
        def smi_poll() -> None:
            for query in (f"--query-gpu={SMI_GPU}", f"--query-compute-apps={SMI_APPS}"):
                subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True)

        results.append(measure("nvidia-smi (2 CSV)", smi_poll, max(10, args.polls // 10), children=True))
    else:
        missing.append("nvidia-smi")

    ours = results[0]
    print(f"host: {gpus} GPU(s) {', '.join(names)}, driver {driver}, nvidia-ml-py {first.binding_version}; "
          f"{len(first.processes)} compute process(es) at start; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"agent's NVML share: {nvml.calls:.0f} NVML calls per poll, {nvml.nvml_ms:.3f} ms CPU in them of "
          f"{nvml.cpu_ms:.3f} ms per timed poll ({nvml.nvml_ms / nvml.cpu_ms * 100:.0f}%)")
    header = f"{'path':<20} {'polls':>6} {'CPU ms/poll':>11} {'%core@5s':>9} {'%core@1s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU / agent':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['name']:<20} {r['n']:>6} {r['cpu_ms']:>11.3f} {r['cpu_ms'] / 5000 * 100:>8.4f}% "
              f"{r['cpu_ms'] / 1000 * 100:>8.3f}% {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['cpu_ms'] / ours['cpu_ms']:>10.2f}x")
    if missing:
        print(f"not measured (not installed): {', '.join(missing)}")
    print(f"elapsed {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
