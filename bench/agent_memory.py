"""Resident memory of a running ``gpuroster-agent``: at start, after many polls, and its growth.

The agent runs as it does on a host: ``agent.main.main()`` in a process of its own (the
interpreter running this script, so run it with the venv to measure: the dev venv, or one
with only the base install, which is what a GPU host has). Only NVML is faked: the fake of
testkit/fake_nvml.py is installed over ``pynvml`` (8 GPUs x 5 processes). The processes
are real ``sleep`` children of this script, and one of them is replaced by a new one every
``--churn`` polls, so owner lookups and per-process state see processes come and go as
they do over a day. The service is a local HTTP server here that answers every snapshot
with an ack (server time = the snapshot's, a reservation of GPU 0 by another user, policy
``terminate`` with no grace); the agent runs ``--dry-run``, so every finding is judged,
noticed and "signalled" on paper and nothing is sent to the children.

This script samples the agent's RSS (``/proc/<pid>/status`` through psutil) after the
first acknowledged poll ("start") and every 1,000 polls, and prints the target (40 MiB), the
figures, their ratio to the target, and the growth per 1,000 polls (least-squares slope over
the second half, after caches have filled). 20,000 polls is 28 hours at the 5 s default
interval. The polls run back to back (``--interval 0.001``): time-based expiry (caches'
TTLs, spool age) sees minutes, not hours; the poll count is what is stretched.
With ``--real-nvml`` (a machine with NVIDIA GPUs) nothing is faked: the agent reads the real
NVML, so its RSS includes the driver's ``libnvidia-ml.so`` and what NVML allocates, over
whatever compute processes the host runs; no processes are started or replaced, and the ack's
reservation names GPU 0's real UUID. As the baseline of the same run, it then measures a fresh
interpreter bare, with ``pynvml`` imported and after ``nvmlInit``: what any NVML-based monitor
holds before doing anything.
Asserts nothing. Run: ``.venv/bin/python bench/agent_memory.py [--polls 20000] [--real-nvml]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TARGET_MIB = 40.0
N_GPUS, PROCS_PER_GPU = 8, 5
MiB = 2**20

# The agent's process: fake NVML over pynvml, the pids from PIDS_FILE (re-read every poll,
# so the bench can replace processes), then the agent's own entry point.
CHILD = r"""
import os, sys
sys.path.insert(0, {root!r})
from testkit.fake_nvml import FakeNVML, FakeProc, busy_host, patched_pynvml
pids_file = {pids_file!r}

class Churning(FakeNVML):
    def nvmlDeviceGetCount(self):
        with open(pids_file) as fh:
            pids = [int(p) for p in fh.read().split()]
        for g, gpu in enumerate(self.gpus):
            mine = pids[g * {per}:(g + 1) * {per}]
            gpu.compute = [FakeProc(p, 512 * 2**20) for p in mine]
        return super().nvmlDeviceGetCount()

with open(pids_file) as fh:
    fake = busy_host({gpus}, [int(p) for p in fh.read().split()], {per})
fake.__class__ = Churning
import agent.main
with patched_pynvml(fake):
    sys.exit(agent.main.main(sys.argv[1:]))
"""

# The agent's process on a GPU host: the real pynvml, the agent's own entry point.
CHILD_REAL = r"""
import sys
sys.path.insert(0, {root!r})
import agent.main
sys.exit(agent.main.main(sys.argv[1:]))
"""


class Service(ThreadingHTTPServer):
    """Answers ``POST /api/v1/agent/snapshots`` with an ack; counts polls, samples the agent."""

    daemon_threads = True

    def __init__(self, gpu0: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.gpu0 = gpu0
        self.polls = 0
        self.agent_pid: int | None = None
        self.samples: list[tuple[int, int]] = []  # (polls, RSS bytes)
        self.lock = threading.Lock()
        self.on_poll = lambda n: None

    def ack(self, snap: dict) -> bytes:
        at = datetime.fromisoformat(snap["collected_at"])
        return json.dumps({
            "accepted": True, "seq": snap["seq"], "server_time": snap["collected_at"],
            "policy": {"policy": "terminate", "grace_seconds": 0, "kill_timeout_seconds": 1,
                       "notice_interval_seconds": 1, "min_uid": 0},
            "reservations": [{"id": 1, "user": "holder", "unix_name": "holder", "device_uuids": [self.gpu0],
                              "start": (at - timedelta(hours=1)).isoformat(), "end": (at + timedelta(hours=1)).isoformat()}],
        }).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        server: Service = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = server.ack(body)
        with server.lock:
            server.polls += 1
            n = server.polls
            if server.agent_pid is not None and (n == 1 or n % 1000 == 0):
                server.samples.append((n, psutil.Process(server.agent_pid).memory_info().rss))
        server.on_poll(n)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def memory_split(pid: int, n: int) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """The agent's RSS split (KiB: anonymous, file-backed) and its ``n`` largest mappings
    by RSS (KiB, path or ``[heap]`` / ``[anon]``), from ``/proc/<pid>/status`` and ``smaps``."""
    split = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            split[key] = int(value.split()[0])
    sizes: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else "[anon]"
        elif head and head[0] == "Rss:":
            sizes[name] = sizes.get(name, 0) + int(head[1])
    return split, sorted(((k, v) for v, k in sizes.items()), reverse=True)[:n]


def slope_per_1000(samples: list[tuple[int, int]]) -> float:
    """Least-squares growth of RSS in KiB per 1,000 polls over ``samples`` (polls, bytes)."""
    if len(samples) < 2:
        return float("nan")
    xs = [n / 1000 for n, _ in samples]
    ys = [r / 1024 for _, r in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=20_000)
    ap.add_argument("--top", type=int, default=8, help="print the agent's largest mappings at the end")
    ap.add_argument("--churn", type=int, default=25, help="replace one process every this many polls")
    ap.add_argument("--real-nvml", action="store_true", help="read the GPUs of this machine; fake nothing")
    args = ap.parse_args()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gr-mem-"))
    kids = [] if args.real_nvml else [subprocess.Popen(["sleep", "100000"]) for _ in range(N_GPUS * PROCS_PER_GPU)]
    pids_file = work / "pids"

    def write_pids() -> None:
        (work / "pids.new").write_text(" ".join(str(k.pid) for k in kids))
        os.replace(work / "pids.new", pids_file)

    write_pids()
    token = work / "token"
    token.write_text("bench-token")
    token.chmod(0o600)
    sys.path.insert(0, str(ROOT))
    service = Service(_real_gpu0_uuid() if args.real_nvml else _gpu0_uuid())
    replaced = 0

    def churn(n: int) -> None:
        nonlocal replaced
        if kids and n % args.churn == 0:
            i = replaced % len(kids)
            old, kids[i] = kids[i], subprocess.Popen(["sleep", "100000"])
            write_pids()
            old.kill()
            old.wait()
            replaced += 1

    service.on_poll = churn
    threading.Thread(target=service.serve_forever, daemon=True).start()
    (work / "agent.toml").write_text("")  # so no /etc/gpuroster/agent.toml of this machine is read
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUROSTER_AGENT_")}
    env["GPUROSTER_AGENT_CONFIG"] = str(work / "agent.toml")
    agent = subprocess.Popen(
        [sys.executable, "-c", CHILD_REAL.format(root=str(ROOT)) if args.real_nvml else
         CHILD.format(root=str(ROOT), pids_file=str(pids_file), gpus=N_GPUS, per=PROCS_PER_GPU),
         "--server", f"http://127.0.0.1:{service.server_address[1]}", "--token-file", str(token),
         "--state-dir", str(work / "state"), "--interval", "0.001", "--dry-run", "--host", "bench", "--log-level", "ERROR"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    service.agent_pid = agent.pid
    split = top = None
    try:
        while service.polls < args.polls and agent.poll() is None:
            time.sleep(0.2)
        if agent.poll() is None:
            split, top = memory_split(agent.pid, args.top)
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
        service.shutdown()
        for k in kids:
            k.kill()
            k.wait()
    if service.polls < args.polls:
        print(f"agent stopped after {service.polls} polls:\n{err.decode()[-2000:]}")
        return 1
    s = service.samples
    first, last = s[0][1] / MiB, s[-1][1] / MiB
    peak = max(r for _, r in s) / MiB
    half = [x for x in s if x[0] >= args.polls // 2] or s[-1:]  # fewer polls than one sampling step: the last sample
    host = ("this machine's GPUs through the real NVML" if args.real_nvml else
            f"fake NVML, {N_GPUS} GPUs x {PROCS_PER_GPU} processes, one replaced every {args.churn} polls ({replaced} replaced)")
    print(f"agent under {Path(sys.executable).parent.parent.name}: python {sys.version.split()[0]}, {host}")
    print(f"target: RSS at most {TARGET_MIB:.0f} MiB, flat")
    print(f"  RSS after the first poll : {first:6.1f} MiB ({first / TARGET_MIB:.2f} x target)")
    print(f"  RSS after {s[-1][0]:>6} polls : {last:6.1f} MiB ({last / TARGET_MIB:.2f} x target); peak sampled {peak:.1f} MiB")
    print(f"  growth per 1,000 polls   : {slope_per_1000(half):+6.1f} KiB (polls {half[0][0]}-{half[-1][0]}); "
          f"{slope_per_1000(s[1:]):+.1f} KiB over polls {s[min(1, len(s) - 1)][0]}-{s[-1][0]}")
    print("  samples (polls: MiB): " + ", ".join(f"{n}: {r / MiB:.1f}" for n, r in s[:: max(1, len(s) // 10)]))
    if split:
        print("  at the end: " + ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in split.items())
              + " (file-backed pages are shared code and data of libraries, mostly)")
        for kib, name in top:
            print(f"    {kib / 1024:6.1f} MiB  {name}")
    if args.real_nvml:
        floor = nvml_floor()
        if isinstance(floor, str):
            print(f"  NVML floor not measured: {floor}")
        else:
            print(f"  NVML floor, same run: a bare Python holds {floor[0] / 1024:.1f} MiB, with pynvml imported "
                  f"{floor[1] / 1024:.1f} MiB, after nvmlInit {floor[2] / 1024:.1f} MiB; the agent holds "
                  f"{last - floor[2] / 1024:.1f} MiB more than the last ({last / (floor[2] / 1024):.2f}x)")
    print(f"elapsed {time.perf_counter() - started:.0f} s")
    return 0


FLOOR = r"""
import sys
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
bare = rss()
import pynvml
imported = rss()
pynvml.nvmlInit()
print(bare, imported, rss())
"""


def nvml_floor() -> tuple[int, int, int] | str:
    """RSS in KiB of a fresh interpreter (this one's executable): bare, with ``pynvml``
    imported, after ``nvmlInit`` (which maps the driver's libraries); or why it failed."""
    r = subprocess.run([sys.executable, "-c", FLOOR], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["no output"])[-1]
    bare, imported, initialised = (int(x) for x in r.stdout.split())
    return bare, imported, initialised


def _real_gpu0_uuid() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()


def _gpu0_uuid() -> str:
    from testkit.fake_nvml import busy_host

    gpu = busy_host(1).gpus[0]
    return gpu.uuid if isinstance(gpu.uuid, str) else gpu.uuid.decode()


if __name__ == "__main__":
    sys.exit(main())
