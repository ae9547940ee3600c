"""CPU cost of one agent poll on a host of 8 GPUs with 40 processes, against baselines.

Everything runs over the same fake NVML (testkit/fake_nvml.py), and the 40 GPU
"processes" are real ``sleep`` children, so owner lookups (psutil, /proc) are real work for
every tool. Compared in the same run:

* gpuroster-agent: ``SnapshotBuilder.build()`` (NVML worker thread with deadline, owner
  lookup with cache, typed snapshot) plus ``model_dump_json()`` (what is posted);
* gpuroster-agent with container lookups on: half the processes sit in (stand-in) Docker
  containers, whose owners come from a Docker Engine API stand-in on a Unix socket
  (testkit/docker_standin.py) through the agent's cached container directory;
* gpustat: ``gpustat.core.GPUStatCollection.new_query()`` (its wall time includes a 0.1 s
  sleep per GPU that it takes to sample process CPU; its CPU figures do not);
* nvitop: ``Device.all()`` + per-device processes + ``GpuProcess.take_snapshots()`` +
  device snapshots;
* one trivial subprocess (``true``), a stand-in for shelling out to ``nvidia-smi``.

The cost of the (fake) NVML calls themselves is separated out: calls per poll are counted
and multiplied by the measured cost of one fake call; on real hardware NVML calls cost more
(they are ioctls), and that part is the same for every tool that makes the same calls.
Figures are machine-dependent and only printed, never asserted.

Run: ``.venv/bin/python bench/agent_poll.py`` (needs the ``bench`` extra: gpustat, nvitop).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from agent.collect import SnapshotBuilder  # noqa: E402
from agent.nvml import NvmlSource  # noqa: E402
from agent.containers import ContainerDirectory  # noqa: E402
from agent.owners import OwnerResolver, _read_cgroup  # noqa: E402
from testkit.docker_standin import DockerStandIn, inspect_body  # noqa: E402
from bench.poll_timing import nvitop_poll, timed_polls  # noqa: E402
from testkit.fake_nvml import busy_host, patched_pynvml  # noqa: E402

N_GPUS, PROCS_PER_GPU = 8, 5
AGENT_POLLS = 2000
BASELINE_POLLS = 300
GPUSTAT_POLLS = 40  # gpustat sleeps 0.1 s per GPU for cpu_percent: 0.8 s of wall time per query here
SPAWNS = 200


def fake_call_cost(fake) -> float:  # noqa: ANN001
    """CPU seconds of one fake NVML call (a representative mix), measured in a tight loop."""
    h = fake.nvmlDeviceGetHandleByIndex(0)
    calls = [fake.nvmlDeviceGetMemoryInfo, fake.nvmlDeviceGetUtilizationRates, fake.nvmlDeviceGetUUID,
             fake.nvmlDeviceGetComputeRunningProcesses, fake.nvmlDeviceGetPowerUsage]
    n = 4000
    t0 = time.process_time()
    for _ in range(n):
        for c in calls:
            c(h)
    return (time.process_time() - t0) / (n * len(calls))


def measure(name: str, poll, n: int, fake, per_call: float, children: bool = False) -> dict:  # noqa: ANN001
    """Run ``poll`` ``n`` times (``timed_polls``); adds the fake NVML calls per poll and their CPU."""
    r = timed_polls(poll, n, children=children, after_warmup=fake.calls.clear)
    calls = sum(fake.calls.values()) / n
    nvml_ms = calls * per_call * 1000
    return {**r, "name": name, "calls": calls, "nvml_ms": nvml_ms, "own_ms": max(r["cpu_ms"] - nvml_ms, 0.0)}


def main() -> int:
    started = time.perf_counter()
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(N_GPUS * PROCS_PER_GPU)]
    sock_dir = Path(tempfile.mkdtemp(prefix="gr-bench-", dir="/tmp"))
    cids = {k.pid: f"{i + 1:064x}" for i, k in enumerate(kids) if i % 2 == 0}
    runtime = DockerStandIn(sock_dir / "docker.sock", {
        cid: inspect_body(cid, name=f"job-{i}", image="pytorch/pytorch:2.5.1", labels={"org.gpuroster.user": "alice"})
        for i, cid in enumerate(cids.values())
    })

    def cgroup(pid: int) -> str | None:  # half the children "run in containers"
        return f"0::/system.slice/docker-{cids[pid]}.scope" if pid in cids else _read_cgroup(pid)

    try:
        fake = busy_host(N_GPUS, [k.pid for k in kids], PROCS_PER_GPU)
        fake.nvmlInit()
        per_call = fake_call_cost(fake)
        results = []

        source = NvmlSource(lib=fake, timeout=5.0, driver_present=lambda: True)
        builder = SnapshotBuilder(source, host="bench", resolver=OwnerResolver())
        seq = iter(range(10**9))
        now = datetime.now(UTC)

        def agent_poll() -> None:
            snap = builder.build(next(seq), now)
            snap.model_dump_json()

        snap = builder.build(0, now)
        assert len(snap.devices) == N_GPUS and len(snap.processes) == N_GPUS * PROCS_PER_GPU
        assert all(p.owner_status == "ok" for p in snap.processes), "owner lookups must hit the live children"
        rss0 = psutil.Process().memory_info().rss
        results.append(measure("gpuroster-agent", agent_poll, AGENT_POLLS, fake, per_call))
        rss1 = psutil.Process().memory_info().rss

        containers = ContainerDirectory([runtime.path])
        builder_c = SnapshotBuilder(source, host="bench", resolver=OwnerResolver(containers=containers, cgroup_reader=cgroup))

        def agent_poll_containers() -> None:
            snap = builder_c.build(next(seq), now)
            snap.model_dump_json()

        snap = builder_c.build(0, now)
        boxed = [p for p in snap.processes if p.container_id]
        assert len(boxed) == len(cids) and all(p.unix_user == "alice" and p.owner_source == "label" for p in boxed)
        results.append(measure("agent +containers", agent_poll_containers, AGENT_POLLS, fake, per_call))
        container_requests = len(runtime.requests)

        import gpustat.core
        import nvitop.api.libnvml as nvitop_nvml

        with patched_pynvml(fake, nvitop_nvml):
            q = gpustat.core.GPUStatCollection.new_query()
            assert len(q.gpus) == N_GPUS and sum(len(g.processes or []) for g in q.gpus) == N_GPUS * PROCS_PER_GPU
            results.append(measure("gpustat new_query", gpustat.core.GPUStatCollection.new_query, GPUSTAT_POLLS, fake, per_call))

            results.append(measure("nvitop snapshot", nvitop_poll, BASELINE_POLLS, fake, per_call))

        results.append(measure("subprocess `true`", lambda: subprocess.run(["true"], check=True), SPAWNS, fake, per_call,
                               children=True))
    finally:
        runtime.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
        for k in kids:
            k.kill()
        for k in kids:
            k.wait()

    ours = results[0]
    print(f"host: {N_GPUS} GPUs x {PROCS_PER_GPU} processes = {N_GPUS * PROCS_PER_GPU} (real pids), fake NVML "
          f"call = {per_call * 1e6:.2f} us CPU; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    header = f"{'path':<20} {'CPU ms/poll':>11} {'NVML calls':>10} {'NVML ms':>8} {'own ms':>7} {'%core@5s':>9} {'%core@1s':>9} {'p50 ms':>7} {'p99 ms':>7} {'own vs agent':>12}"
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r["own_ms"] / ours["own_ms"] if ours["own_ms"] else float("nan")
        print(f"{r['name']:<20} {r['cpu_ms']:>11.3f} {r['calls']:>10.0f} {r['nvml_ms']:>8.3f} {r['own_ms']:>7.3f} "
              f"{r['cpu_ms'] / 5000 * 100:>8.4f}% {r['cpu_ms'] / 1000 * 100:>8.3f}% {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
              f"{ratio:>11.2f}x")
    print(f"this process's RSS (agent plus the bench's fakes and stand-ins): {rss0 / 2**20:.1f} MiB before, "
          f"{rss1 / 2**20:.1f} MiB after {AGENT_POLLS} polls (growth {(rss1 - rss0) / 2**10:+.0f} KiB); "
          "the agent alone against its 40 MiB target: bench/agent_memory.py")
    print(f"container runtime: {container_requests} API request(s) for {len(cids)} containers over "
          f"{AGENT_POLLS + 2} polls (answers cached per container id)")
    for base in ("gpustat new_query", "nvitop snapshot"):
        other = next(r for r in results if r["name"] == base)
        for r in results[:2]:
            print(f"{r['name']} CPU per poll / {base}: {r['cpu_ms'] / other['cpu_ms']:.3f} "
                  f"(own code only: {r['own_ms'] / other['own_ms']:.3f})")
    budget = 0.2
    print(f"agent at 5 s: {ours['cpu_ms'] / 5000 * 100:.4f}% of one core (budget {budget}%: "
          f"{'within' if ours['cpu_ms'] / 5000 * 100 < budget else 'OVER'})")
    print(f"elapsed {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
