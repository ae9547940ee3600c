"""Start-up time of the ``gpuroster`` command, against a bare Python start in the same run.

Times, as fresh processes: ``python -c pass`` (the floor), ``python -c "import typer"`` (the
framework alone), ``python -c "import app.cli"`` (everything ``gpuroster`` imports before it
parses a command), ``gpuroster --help``, and ``gpuroster status`` up to its first request:
the server is a closed port on 127.0.0.1, so the command parses its arguments, builds its
HTTP client, is refused at once and exits 5 (unreachable). Lists the costliest imports
(``python -X importtime``). Prints the target (0.1 s), the figures and their ratios to the
target and to the two baselines. Asserts nothing.
Run: ``.venv/bin/python bench/cli_start.py [--runs 10]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_S = 0.1


def timed(cmd: list[str], runs: int, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> float:
    """Median wall seconds of ``runs`` fresh runs of ``cmd``; their median CPU seconds (user
    and system, steadier on a shared machine) go to ``CPU``."""
    out, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        if rc not in ok:
            raise SystemExit(f"{' '.join(cmd)} exited {rc}")
        out.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    CPU[" ".join(cmd)] = statistics.median(cpu)
    return statistics.median(out)


CPU: dict[str, float] = {}


def top_imports(n: int) -> list[tuple[int, str]]:
    """(cumulative µs, module) of the ``n`` costliest top-level-ish imports of ``app.cli``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import app.cli"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cum, name = (p.strip() for p in line.removeprefix("import time:").split("|"))
        if cum.isdigit() and name.count("  ") <= 2:  # depth <= 2 below app.cli
            rows.append((int(cum), name.strip()))
    return sorted(rows, reverse=True)[:n]


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gr-cli-start-"))  # no stored sign-in: the environment's is used
    env = {**os.environ, "XDG_CONFIG_HOME": str(home), "GPUROSTER_SERVER": f"http://127.0.0.1:{closed_port()}",
           "GPUROSTER_TOKEN": "bench-token"}
    rows = [
        ("python -c pass (floor)", timed([sys.executable, "-c", "pass"], args.runs)),
        ("python -c 'import typer'", timed([sys.executable, "-c", "import typer"], args.runs)),
        ("python -c 'import app.cli'", timed([sys.executable, "-c", "import app.cli"], args.runs)),
        ("gpuroster --help", timed([str(BIN / "gpuroster"), "--help"], args.runs)),
        ("gpuroster status (to 1st request)", timed([str(BIN / "gpuroster"), "status"], args.runs, env, ok=(5,))),
    ]
    floor, typer_s = rows[0][1], rows[1][1]
    print(f"median of {args.runs} fresh processes each; target {TARGET_S} s")
    print(f"  {'command':36s}{'seconds':>8}{'x target':>9}{'x pass':>8}{'x typer':>8}{'CPU s':>7}")
    for (label, v), c in zip(rows, CPU.values(), strict=True):
        print(f"  {label:36s}{v:8.3f}{v / TARGET_S:9.2f}{v / floor:8.1f}{v / typer_s:8.2f}{c:7.3f}")
    for label, v in rows[3:]:
        print(f"target: {label} at most {TARGET_S} s; figure {v:.3f} s ({v / TARGET_S:.2f} x the target; "
              f"{v - floor:.3f} s above Python's own start, {v - typer_s:.3f} s above importing typer)")
    print("costliest imports under app.cli (cumulative ms):")
    for cum, name in top_imports(8):
        print(f"  {cum / 1000:8.1f}  {name}")


if __name__ == "__main__":
    main()
