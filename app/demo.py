"""``gpuroster demo``: the whole system on one machine, the quick start's main job.

What it does, in order:

1. applies the migrations to the embedded SQLite database in ``--data-dir``;
2. on first start creates the admin ``admin`` with a random password and an API token,
   both printed once (stored hashed); later starts say the admin exists;
3. chooses the agent source: real NVML when ``pynvml.nvmlInit()`` succeeds and the device
   count is above 0, else the real ``nvidia-smi -q -x`` captures bundled in
   ``agent/captures/``, each replayed as a host of its own (``replay-<capture>``, the agent
   reports ``source="replay"``); in replay mode it also creates the demo users of
   :data:`DEMO_USERS`, whose Unix names the owners map (:data:`DEMO_OWNERS`) gives to the
   captures' real pids;
4. registers one host per agent (host token in ``<data>/agents/<host>/token``, mode 600;
   policy ``observe`` so nobody is ever notified or signalled by a demo, grace
   :data:`DEMO_GRACE_SECONDS`) and starts ``gpuroster serve`` and one ``gpuroster-agent``
   per host as child processes, logging to ``<data>/logs/``;
5. once every replayed host has reported, books the reservations that make every state of
   the Now page visible (see :func:`plan_reservations`): devices in use by their holder,
   reserved but idle, free (one with an upcoming reservation), and one process running
   without a reservation, which becomes a finding after the grace period;
6. prints the URL to open and waits. Ctrl-C (SIGINT) or SIGTERM stops the agents, then the
   service, and waits for each; a child that dies takes the demo down with an error.

Children run in sessions of their own (the terminal's Ctrl-C reaches only the demo, which
stops them in order) and, on Linux, get SIGTERM if the demo itself is killed
(``PR_SET_PDEATHSIG``), so no process outlives it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.demo_data import (  # the seeding and inputs, re-exported for the callers of app.demo
    ADMIN, AdminResult, DEMO_GRACE_SECONDS, DEMO_OWNERS, DEMO_POLICY, DEMO_USERS, NVML_INTERVAL_S,
    PlannedReservation, REPLAY_INTERVAL_S, UNRESERVED_USER, bundled_captures, ensure_admin,
    ensure_demo_users, ensure_host, ensure_reservations, local_host_name, nvml_device_count, owners_map,
    plan_reservations, port_free, replay_host_name,
)
from app.models import Host, utcnow


# ---------------------------------------------------------------------------- processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child when the demo dies (PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


@dataclass
class Child:
    """A child process of the demo and where its output goes."""

    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    log: TextIO | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "a", encoding="utf-8")
        self.log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.args)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(
            self.args, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the child's process group, wait ``timeout`` seconds, then SIGKILL it."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        _signal_group(self.proc.pid, signal.SIGKILL)  # anything the child left in its group
        if self.log is not None:
            self.log.close()
            self.log = None
        return self.proc.returncode

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _console_script(name: str, module: str) -> list[str]:
    """``[<venv>/bin/NAME]`` when installed beside this interpreter, else ``[python, -m, MODULE]``."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


# ---------------------------------------------------------------------------- the demo


@dataclass
class AgentPlan:
    host: str
    capture: Path | None  # None: NVML
    state_dir: Path
    token_file: Path


@dataclass
class Demo:
    """One run of ``gpuroster demo``; :meth:`run` returns the exit status."""

    data_dir: Path
    port: int = 8000
    bind: str = "127.0.0.1"
    source: str = "auto"  # auto | nvml | replay
    out: Callable[[str], None] = print
    ready_timeout: float = 60.0
    stop_event: threading.Event = field(default_factory=threading.Event)
    children: list[Child] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    def settings(self) -> Settings:
        return Settings(data_dir=self.data_dir, database_url=f"sqlite:///{self.data_dir / 'gpuroster.db'}",
                        base_url=self.url, environment="development")

    def child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUROSTER_AGENT_",))}
        env.update({
            "GPUROSTER_DATA_DIR": str(self.data_dir),
            "GPUROSTER_DATABASE_URL": f"sqlite:///{self.data_dir / 'gpuroster.db'}",
            "GPUROSTER_BASE_URL": self.url,
            "GPUROSTER_ENVIRONMENT": "development",
            "PYTHONUNBUFFERED": "1",
        })
        return env

    # -- steps -----------------------------------------------------------------------------

    def choose_agents(self) -> tuple[list[AgentPlan], str]:
        agents_dir = self.data_dir / "agents"
        count, why = (0, "replay requested") if self.source == "replay" else nvml_device_count()
        if self.source == "nvml" and count == 0:
            raise DemoError(f"--source nvml, but {why}")
        if count > 0:
            name = local_host_name()
            d = agents_dir / name
            return [AgentPlan(name, None, d / "state", d / "token")], f"{why}: monitoring this machine's GPUs"
        captures = bundled_captures()
        if not captures:
            raise DemoError("no GPUs and no bundled captures in agent/captures/ to replay")
        plans = []
        for cap in captures:
            name = replay_host_name(cap)
            d = agents_dir / name
            plans.append(AgentPlan(name, cap, d / "state", d / "token"))
        return plans, f"no GPUs ({why}): replaying {len(captures)} bundled capture(s)"

    def agent_args(self, a: AgentPlan, config: Path, owners: Path) -> list[str]:
        args = [*_console_script("gpuroster-agent", "agent"), "--config", str(config), "--server", self.url,
                "--token-file", str(a.token_file), "--host", a.host, "--state-dir", str(a.state_dir)]
        if a.capture is not None:
            args += ["--replay", str(a.capture), "--replay-owners", str(owners), "--interval", str(REPLAY_INTERVAL_S)]
        else:
            args += ["--interval", str(NVML_INTERVAL_S)]
        return args

    def wait_ready(self, server: Child) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not self.stop_event.is_set():
            if not server.alive():
                raise DemoError(f"the service exited ({server.proc.returncode if server.proc else '?'}); "
                                f"last lines of {server.log_path}:\n{server.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"the service did not become ready in {self.ready_timeout:.0f} s; see {server.log_path}")
            self.stop_event.wait(0.2)

    def wait_reported(self, factory: sessionmaker[Session], hosts: list[str], timeout: float = 30.0) -> list[str]:
        """Wait until each of ``hosts`` has posted a snapshot; returns those that did."""
        deadline = time.monotonic() + timeout
        while not self.stop_event.is_set():
            with factory() as s:
                seen = set(s.scalars(select(Host.name).where(Host.name.in_(hosts), Host.last_seen_at.is_not(None))))
            if seen >= set(hosts) or time.monotonic() > deadline:
                return sorted(seen)
            self._check_children()
            self.stop_event.wait(0.3)
        return []

    def _check_children(self) -> None:
        for c in self.children:
            if not c.alive():
                code = c.proc.returncode if c.proc else "?"
                raise DemoError(f"{c.name} exited with status {code}; last lines of {c.log_path}:\n{c.tail()}")

    # -- the whole run ---------------------------------------------------------------------

    def run(self) -> int:
        from app.db import build_engine, build_session_factory, run_in_transaction
        from app.migrate import head_revision, upgrade

        self.data_dir = self.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not port_free(self.bind, self.port):
            self.out(f"error: port {self.port} on {self.bind} is in use; pass --port with a free one")
            return 2
        settings = self.settings()
        self.out(f"gpuroster demo: data in {self.data_dir} (SQLite {self.data_dir / 'gpuroster.db'})")
        upgrade(settings.sqlalchemy_url)
        self.out(f"  database migrated to {head_revision()}")
        try:
            agents, why = self.choose_agents()
        except DemoError as e:
            self.out(f"error: {e}")
            return 2
        self.out(f"  agents: {why}")
        engine = build_engine(settings)
        factory = build_session_factory(engine)
        try:
            admin = run_in_transaction(factory, lambda s: ensure_admin(s))
            replay = any(a.capture is not None for a in agents)
            if replay:
                made = run_in_transaction(factory, ensure_demo_users)
                if made:
                    self.out(f"  demo users created: {', '.join(made)} (Unix names of the replayed processes)")
                    self.out("  their passwords (shown once, stored hashed): "
                             + ", ".join(f"{name} {pw}" for name, pw in made.items()))
            for a in agents:
                run_in_transaction(factory, lambda s, a=a: ensure_host(s, name=a.host, token_file=a.token_file))
            config = self.data_dir / "agents" / "agent.toml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("# gpuroster demo: agents take every setting from their command line\n")
            owners = self.data_dir / "agents" / "replay-owners.json"
            owners.write_text(json.dumps({"_comment": "pid -> owner for the bundled captures (gpuroster demo)",
                                          **owners_map()}, indent=2) + "\n")
            return self._supervise(settings, factory, agents, admin, config, owners)
        except DemoError as e:
            self.out(f"error: {e}")
            return 1
        finally:
            self.stop_all()
            engine.dispose()

    def _supervise(self, settings: Settings, factory: sessionmaker[Session], agents: list[AgentPlan],
                   admin: AdminResult, config: Path, owners: Path) -> int:
        from app.db import run_in_transaction

        env = self.child_env()
        logs = self.data_dir / "logs"
        server = Child("the service", [*_console_script("gpuroster", "app.cli"), "serve", "--host", self.bind,
                                       "--port", str(self.port), "--no-migrate", "--log-level", "warning"],
                       logs / "service.log")
        self.children.append(server)
        server.start(env)
        self.wait_ready(server)
        if self.stop_event.is_set():
            return 0
        self.out(f"  service ready at {self.url} (log: {server.log_path})")
        for a in agents:
            child = Child(f"agent {a.host}", self.agent_args(a, config, owners), logs / f"agent-{a.host}.log")
            self.children.append(child)
            child.start(env)
        replayed = [a.host for a in agents if a.capture is not None]
        if replayed:
            seen = self.wait_reported(factory, replayed)
            if self.stop_event.is_set():
                return 0
            now = utcnow()
            plan = run_in_transaction(factory, lambda s: plan_reservations(s, hosts=seen, now=now))
            results = run_in_transaction(factory, lambda s: ensure_reservations(s, plan=plan, settings=settings, now=now))
            for p, outcome in results:
                self.out(f"  {p.user} on {p.host} {', '.join(p.uuids)} ({p.purpose}): {outcome}")
            missing = sorted(set(replayed) - set(seen))
            if missing:
                self.out(f"  warning: no snapshot yet from {', '.join(missing)}; see {logs}")
        self._banner(admin, agents)
        while not self.stop_event.wait(1.0):
            self._check_children()
        return 0

    def _banner(self, admin: AdminResult, agents: list[AgentPlan]) -> None:
        self.out("")
        self.out(f"Open {self.url}/ and sign in as '{ADMIN}'.")
        if admin.created:
            self.out(f"  Admin password (shown once, stored hashed): {admin.password}")
            self.out(f"  Admin API token (shown once): {admin.token}")
            self.out(f"  e.g. curl -H 'Authorization: Bearer {admin.token}' {self.url}/api/v1/devices")
        else:
            self.out(f"  The admin '{ADMIN}' exists; its password was printed on the first start. Lost it? "
                     f"GPUROSTER_DATA_DIR={self.data_dir} gpuroster admin set-password {ADMIN} (or start over "
                     f"with a fresh --data-dir).")
        for a in agents:
            what = f"replay of {a.capture.name} (source=replay)" if a.capture else "NVML on this machine"
            self.out(f"  host {a.host}: {what}, policy {DEMO_POLICY}, grace {DEMO_GRACE_SECONDS} s")
        self.out(f"  Metrics: {self.url}/metrics · API docs: {self.url}/docs · logs: {self.data_dir / 'logs'}")
        self.out("Press Ctrl-C to stop.")

    def stop_all(self) -> None:
        """Stop the agents first (their last posts reach the service), then the service."""
        agents = [c for c in self.children if c.name.startswith("agent")]
        others = [c for c in self.children if not c.name.startswith("agent")]
        for c in agents:
            if c.alive():
                _signal_group(c.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        for c in [*agents, *others]:
            c.stop()
        self.children.clear()


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


def run_demo(*, port: int, data_dir: Path, source: str = "auto") -> int:
    """Entry point of ``gpuroster demo``: run until SIGINT/SIGTERM; returns the exit status."""
    demo = Demo(data_dir=data_dir, port=port, source=source, out=lambda line: print(line, flush=True))

    def _stop(signum: int, _frame: object) -> None:
        if not demo.stop_event.is_set():
            print(f"\nstopping (signal {signum}): agents, then the service…", flush=True)
        demo.stop_event.set()

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = demo.run()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print("gpuroster demo stopped.", flush=True)
    return code


__all__ = [
    "ADMIN", "DEMO_OWNERS", "DEMO_USERS", "Demo", "DemoError", "PlannedReservation", "bundled_captures",
    "ensure_admin", "ensure_demo_users", "ensure_host", "ensure_reservations", "nvml_device_count", "owners_map",
    "plan_reservations", "replay_host_name", "run_demo", "UNRESERVED_USER", "DEMO_GRACE_SECONDS", "DEMO_POLICY",
]
