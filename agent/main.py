"""``gpuroster-agent``: poll NVML (or replay captures), judge, report, spool while the
service is away.

The loop runs on a steady clock (``next += interval``, missed ticks are skipped, never
bunched), posts over one ``httpx.Client``, spools a snapshot it could not deliver and
replays the spool in seq order once the service answers again. Transient failures (network,
5xx, 429) back off exponentially with jitter up to 60 s, honouring ``Retry-After``; a
snapshot the service refuses for good (400, 401, 403, 413, 422) is dropped with a loud log.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from agent import __version__
from agent.client import PostResult, ServiceClient, backoff_delay
from agent.collect import SnapshotBuilder
from agent.config import DEFAULT_STATE_DIR, AgentSettings, load_settings, read_token
from agent.schema import Snapshot, SnapshotAck
from agent.state import AckCache, SeqCounter, Spool
from agent.telemetry import Source, log, warn_once

# monitoring states in which --once / --print exit non-zero, with the hint to print
_HINTS = {
    "no_driver": "no NVIDIA driver on this host (no /proc/driver/nvidia): nothing to monitor; "
    "use --replay FILE to run on captures",
    "misconfigured": "NVML (libnvidia-ml.so.1) could not be loaded: install the NVIDIA driver's user-space "
    "libraries (or the nvidia-ml-py binding), or unset expect_gpus",
    "down": "NVML is not usable; if the message says driver/library mismatch, reboot the host "
    "(the loaded kernel module is older than the installed libraries)",
}


def utcnow() -> datetime:
    """Aware UTC now."""
    return datetime.now(timezone.utc)


def load_enforcer(state_dir: Path, dry_run: bool) -> Any | None:
    """The colleague's :class:`agent.enforce.Enforcer`, or ``None`` (observe only) if absent."""
    try:
        from agent.enforce import Enforcer  # type: ignore[import-not-found]
    except ImportError as exc:
        log.warning("enforcement unavailable (%s): reporting without findings", exc)
        return None
    return Enforcer(state_dir=state_dir, dry_run=dry_run)


class Agent:
    """The reporting loop. Everything that touches time or the network is injectable.

    :param clock: monotonic seconds (scheduling and backoff).
    :param sleep: waits that many seconds (tests advance a fake clock instead).
    :param now: aware UTC wall time for ``collected_at`` and enforcement.
    """

    def __init__(
        self,
        builder: SnapshotBuilder,
        client: ServiceClient | None,
        *,
        state_dir: Path,
        interval: float = 5.0,
        enforcer: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        now: Callable[[], datetime] = utcnow,
        spool_max_bytes: int = 1 << 30,
        spool_max_age_s: float = 48 * 3600,
        rng: random.Random | None = None,
    ) -> None:
        self.builder = builder
        self.client = client
        self.interval = interval
        self.enforcer = enforcer
        self.clock = clock
        self.now = now
        self.stop = threading.Event()
        self.sleep = sleep or (lambda s: self.stop.wait(s))
        self.rng = rng or random.Random()
        state_dir.mkdir(parents=True, exist_ok=True)
        self.seq = SeqCounter(state_dir / "seq")
        self.spool = Spool(state_dir / "spool", max_bytes=spool_max_bytes, max_age_s=spool_max_age_s)
        self.acks = AckCache(state_dir / "ack.json")
        self._attempt = 0
        self._retry_at = 0.0
        self._link: str = "ok"
        self.sent = 0
        self.rejected = 0
        self.last_snapshot: Snapshot | None = None
        if len(self.spool):
            log.warning("%d snapshot(s) spooled from a previous run will be replayed", len(self.spool))

    @property
    def ack(self) -> SnapshotAck | None:
        """The last reservation table and policy from the service (survives restarts)."""
        return self.acks.ack

    # -- one poll ---------------------------------------------------------------------------

    def take_snapshot(self) -> Snapshot:
        """Poll, number and judge one snapshot (no I/O to the service)."""
        at = self.now()
        snap = self.builder.build(self.seq.next(), at)
        if self.enforcer is not None:
            try:
                snap.findings = list(self.enforcer.evaluate(snap, self.acks.ack, at))
            except Exception as exc:  # noqa: BLE001 - enforcement must never stop reporting
                warn_once(f"enforce:{type(exc).__name__}", "enforcement failed (%r); snapshot sent without findings", exc,
                          level=logging.ERROR)
        self.last_snapshot = snap
        return snap

    def tick(self, deadline: float | None = None) -> Snapshot:
        """Take a snapshot, deliver or spool it, and drain the spool until ``deadline``."""
        snap = self.take_snapshot()
        body = snap.model_dump_json().encode()
        if self.client is None:
            self.spool.put(snap.seq, body)
        elif len(self.spool) == 0 and self.clock() >= self._retry_at:
            result = self.client.post(body)
            if result.outcome == "retry":
                self.spool.put(snap.seq, body)
            self._handle(snap.seq, result)
        else:
            self.spool.put(snap.seq, body)
        self.flush(deadline)
        return snap

    def flush(self, deadline: float | None = None) -> int:
        """Post spooled snapshots oldest first until empty, a failure, or ``deadline`` (clock s)."""
        posted = 0
        while self.client is not None and len(self.spool) and self.clock() >= self._retry_at:
            if deadline is not None and self.clock() >= deadline:
                break
            item = self.spool.oldest()
            if item is None:
                break
            seq, body = item
            result = self.client.post(body)
            self._handle(seq, result)
            if result.outcome == "retry":
                break
            self.spool.remove(seq)
            posted += 1
        return posted

    def _handle(self, seq: int, result: PostResult) -> None:
        if result.outcome == "ok":
            self.sent += 1
            if result.ack is not None:
                self.acks.update(result.ack)
            elif result.detail:
                warn_once("bad-ack", "service accepted seq %d but its answer is unusable: %s", seq, result.detail)
            if self._link != "ok":
                log.warning("service reachable again (was %s); %d spooled snapshot(s) to replay", self._link, len(self.spool))
            self._link, self._attempt, self._retry_at = "ok", 0, 0.0
        elif result.outcome == "retry":
            self._attempt += 1
            delay = backoff_delay(self._attempt, result.retry_after, rng=self.rng)
            self._retry_at = self.clock() + delay
            state = f"unavailable ({result.status or result.detail})"
            if state != self._link:
                log.error("service %s: spooling snapshots, retrying with backoff (next in %.1f s)", state, delay)
                self._link = state
        else:
            self.rejected += 1
            state = f"rejecting ({result.status})"
            hint = " (check the host token file)" if result.status in (401, 403) else ""
            if state != self._link:
                log.error("service refused snapshot seq %d with %s%s: dropped, not retried: %s",
                          seq, result.status, hint, (result.detail or "")[:300])
                self._link = state
            else:
                log.debug("service refused snapshot seq %d with %s: dropped", seq, result.status)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, max_ticks: int | None = None) -> None:
        """Poll every ``interval`` seconds until :attr:`stop` is set (or ``max_ticks`` polls)."""
        next_at = self.clock()
        ticks = 0
        while not self.stop.is_set():
            try:
                self.tick(deadline=next_at + self.interval * 0.9)
            except Exception as exc:  # noqa: BLE001 - the daemon outlives a bad poll
                warn_once(f"tick:{type(exc).__name__}", "poll failed: %r", exc, level=logging.ERROR)
                log.debug("poll failure", exc_info=True)
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            next_at += self.interval
            late = self.clock() - next_at
            if late > 0:  # overran: skip the missed ticks instead of firing them back to back
                skipped = math.ceil(late / self.interval)
                next_at += skipped * self.interval
                warn_once("overrun", "a poll took longer than the %.1f s interval; skipping missed ticks", self.interval)
            self.sleep(max(0.0, next_at - self.clock()))

    def close(self) -> None:
        """Release the client and the source."""
        if self.client is not None:
            self.client.close()
        self.builder.source.close()


# -- wiring ------------------------------------------------------------------------------------


def build_source(settings: AgentSettings) -> tuple[Source, bool | None, Any]:
    """The configured source, the PID-namespace verdict and the owner resolver."""
    from agent.owners import OwnerResolver, check_environment

    if settings.replay:
        from agent.replay import ReplaySource

        return ReplaySource(settings.replay, settings.replay_owners), None, OwnerResolver(hide_args=settings.hide_args)
    from agent.nvml import NvmlSource

    env = check_environment()
    resolver = OwnerResolver(hide_args=settings.hide_args, host_pid_ns=env.host_pid_ns, hidepid=env.hidepid and not env.is_root)
    return NvmlSource(expect_gpus=settings.expect_gpus, timeout=settings.nvml_timeout), env.host_pid_ns, resolver


def _state_dir(settings: AgentSettings, explicit: bool) -> Path:
    path = settings.state_dir
    if explicit or path != DEFAULT_STATE_DIR:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    fallback = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "gpuroster-agent"
    log.warning("%s is not writable; using %s for the spool and seq counter", path, fallback)
    return fallback


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # allow_abbrev=False: "--token SECRET" must fail, not be read as "--token-file SECRET"
    p = argparse.ArgumentParser(prog="gpuroster-agent", description="gpuroster host agent: report GPU use to the service",
                                allow_abbrev=False)
    p.add_argument("--config", type=Path, help="TOML file (default /etc/gpuroster/agent.toml)")
    p.add_argument("--server", help="service base URL")
    p.add_argument("--token-file", type=Path, help="file holding the host token (never pass the token itself)")
    p.add_argument("--allow-readable-token-file", action="store_true", default=None,
                   help="start even if group or others may read the token file (default: refuse)")
    p.add_argument("--host", help="host name to report (default: this machine's)")
    p.add_argument("--interval", type=float, help="seconds between polls (default 5)")
    p.add_argument("--state-dir", type=Path, help="spool, seq counter and ack cache (default /var/lib/gpuroster-agent)")
    p.add_argument("--hide-args", action="store_true", default=None, help="report executables without arguments")
    p.add_argument("--expect-gpus", action="store_true", default=None, help="treat a missing NVML as a misconfiguration")
    p.add_argument("--replay", type=Path, nargs="+", metavar="FILE", help="replay nvidia-smi -q -x captures instead of NVML")
    p.add_argument("--replay-owners", type=Path, metavar="MAP.json", help="pid -> owner map for replayed processes")
    p.add_argument("--dry-run", action="store_true", default=None, help="enforcement only logs what it would do")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="poll once, post, exit (non-zero if the post failed)")
    mode.add_argument("--print", dest="print_", action="store_true", help="print one snapshot as JSON, post nothing")
    p.add_argument("--version", action="version", version=f"gpuroster-agent {__version__}")
    return p.parse_args(argv)


def _exit_for_monitoring(snap: Snapshot) -> int:
    hint = _HINTS.get(snap.monitoring.status)
    if hint is None:
        return 0
    print(f"gpuroster-agent: {snap.monitoring.message}\nhint: {hint}", file=sys.stderr)
    return 3


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gpuroster-agent``; returns the exit status."""
    args = parse_args(argv)
    cli = {
        "server": args.server, "token_file": args.token_file, "host": args.host, "interval": args.interval,
        "state_dir": args.state_dir, "hide_args": args.hide_args, "expect_gpus": args.expect_gpus,
        "replay": args.replay, "replay_owners": args.replay_owners, "dry_run": args.dry_run, "log_level": args.log_level,
        "allow_readable_token_file": args.allow_readable_token_file,
    }
    try:
        settings = load_settings(cli, args.config)
    except Exception as exc:  # noqa: BLE001 - configuration errors end in a message, not a traceback
        print(f"gpuroster-agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # httpx logs every request at INFO: one line per poll is a log flood on a quiet host
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        source, ns_ok, resolver = build_source(settings)
    except (OSError, ValueError) as exc:
        print(f"gpuroster-agent: cannot load the replay input: {exc}", file=sys.stderr)
        return 2
    builder = SnapshotBuilder(source, host=settings.host, interval=settings.interval, resolver=resolver,
                              pid_namespace_ok=ns_ok, hide_args=settings.hide_args)

    if args.print_:
        snap = builder.build(0, utcnow())
        source.close()
        print(snap.model_dump_json(indent=2))
        return _exit_for_monitoring(snap)

    if not settings.server or not settings.token_file:
        print("gpuroster-agent: --server and --token-file (or their config/env equivalents) are required", file=sys.stderr)
        return 2
    try:
        token = read_token(settings.token_file, allow_readable=settings.allow_readable_token_file)
    except (OSError, ValueError) as exc:
        print(f"gpuroster-agent: cannot read the host token: {exc}", file=sys.stderr)
        return 2
    state_dir = _state_dir(settings, explicit=args.state_dir is not None)
    client = ServiceClient(settings.server, token)
    # Replayed pids belong to another host: enforcement on them only ever says what it would do.
    enforcer = load_enforcer(state_dir / "enforce", settings.dry_run or bool(settings.replay))
    agent = Agent(builder, client, state_dir=state_dir, interval=settings.interval, enforcer=enforcer,
                  spool_max_bytes=settings.spool_max_mb << 20, spool_max_age_s=settings.spool_max_age_hours * 3600)

    if args.once:
        snap = agent.take_snapshot()
        result = client.post(snap.model_dump_json().encode())
        agent._handle(snap.seq, result)
        agent.close()
        if result.outcome != "ok":
            print(f"gpuroster-agent: post failed ({result.status or ''} {result.detail or ''})".strip(), file=sys.stderr)
            return 1
        print(f"posted snapshot seq {snap.seq}: {len(snap.devices)} device(s), {len(snap.processes)} process(es), "
              f"{len(snap.findings)} finding(s)")
        return _exit_for_monitoring(snap)

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("gpuroster-agent %s: host %s, %s, every %.1f s, server %s, state %s", __version__, settings.host,
             "replay of " + ", ".join(p.name for p in settings.replay) if settings.replay else "NVML",
             settings.interval, settings.server, state_dir)
    try:
        agent.run()
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
