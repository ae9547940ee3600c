"""Live ``gpuroster serve`` processes for tests that go over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from testkit.ports import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def gpuroster_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GPUROSTER_DATABASE_URL": database_url, "GPUROSTER_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


class Seeder:
    """Users, API tokens and hosts written straight into a live server's database through the
    services that ``gpuroster admin create-user/create-token/add-host`` call, in this process.

    Tests that only need a seeded lab use it instead of starting one ``gpuroster admin``
    process per row (about a second of CPU each, most of it imports); the commands themselves
    are tested where they are the subject (``tests/cli``, the README session). Passwords are
    hashed with this process's hasher; a server verifies any argon2id cost from the hash.
    ``close()`` (or ``with``) disposes of the engine.
    """

    def __init__(self, database_url: str, **settings: object) -> None:
        from app.config import Settings
        from app.db import build_engine, build_session_factory

        self.engine = build_engine(Settings(database_url=database_url, environment="test", **settings))
        self.factory = build_session_factory(self.engine)

    def __enter__(self) -> "Seeder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    def user(self, name: str, *, admin: bool = False, email: str | None = None, password: str | None = None) -> str:
        """Create user ``name`` (no password: a token-only account) and return a new API token."""
        from app.db import run_in_transaction
        from app.services import users

        def work(s):
            u = users.create_user(s, username=name, password=password, email=email, unix_name=None, admin=admin,
                                  actor="cli")
            s.flush()
            return users.create_api_token(s, user=u, name="cli", expires_days=None)[1]

        return run_in_transaction(self.factory, work)

    def host(self, name: str) -> str:
        """Register host ``name`` and return its host token."""
        from app.db import run_in_transaction
        from app.services import hosts

        return run_in_transaction(self.factory, lambda s: hosts.create_host(s, name=name, actor="cli")[1])


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
