"""Live ``gpuroster serve`` processes for tests that go over real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpuroster_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GPUROSTER_DATABASE_URL": database_url, "GPUROSTER_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], input: str | None = None) -> str:
    """Run ``gpuroster ARGS`` and return its stdout; raises CalledProcessError on failure."""
    out = subprocess.run([str(BIN / "gpuroster"), *args], env=env, input=input, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


@contextmanager
def live_server(env: dict[str, str], *, workers: int = 1, migrate: bool = True, log: Path | None = None,
                port: int | None = None):
    """Start ``gpuroster serve`` on ``port`` (default: a free loopback port); yields its base URL; stops it on exit."""
    port = port or free_port()
    args = [str(BIN / "gpuroster"), "serve", "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    if not migrate:
        args.append("--no-migrate")
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gpuroster serve exited with {proc.returncode}" + (f"; see {log}" if log else ""))
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("gpuroster serve did not become ready in 60 s")
            time.sleep(0.2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if log:
            out.close()
