"""Start-up time of the ``gpuroster`` command, against a bare Python start in the same run.

Times, as fresh processes: ``python -c pass`` (the floor), ``python -c "import app.cli"``
(everything ``gpuroster`` imports before it parses a command) and ``gpuroster --help``, and
lists the costliest imports (``python -X importtime``). Prints the target (0.1 s), the
figures and the ratios. Asserts nothing. Run: ``.venv/bin/python bench/cli_start.py [--runs 10]``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_S = 0.1


def timed(cmd: list[str], runs: int) -> float:
    """Median wall seconds of ``runs`` fresh runs of ``cmd``; their median CPU seconds (user
    and system, steadier on a shared machine) go to ``CPU``."""
    out, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    floor = timed([sys.executable, "-c", "pass"], args.runs)
    imp = timed([sys.executable, "-c", "import app.cli"], args.runs)
    helped = timed([str(BIN / "gpuroster"), "--help"], args.runs)
    print(f"median of {args.runs} fresh processes each")
    print(f"  {'command':34s}{'seconds':>9}{'x python -c pass':>18}{'CPU s':>8}")
    cpu = list(CPU.values())
    for (label, v), c in zip((("python -c pass (floor)", floor), ("python -c 'import app.cli'", imp),
                              ("gpuroster --help", helped)), cpu, strict=True):
        print(f"  {label:34s}{v:9.3f}{v / floor:18.1f}{c:8.3f}")
    print(f"target: CLI start at most {TARGET_S} s; figure: gpuroster --help {helped:.3f} s "
          f"({helped / TARGET_S:.2f} x the target), of which {floor:.3f} s is Python's own start")
    print("costliest imports under app.cli (cumulative ms):")
    for cum, name in top_imports(8):
        print(f"  {cum / 1000:8.1f}  {name}")


if __name__ == "__main__":
    main()
