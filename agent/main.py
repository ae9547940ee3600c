"""``gpuroster-agent``: poll NVML (or replay captures), judge, report, spool while the
service is away.

The loop runs on a steady clock (``next += interval``, missed ticks are skipped, never
bunched), posts over one ``httpx.Client``, spools a snapshot it could not deliver and
replays the spool in seq order once the service answers again. Transient failures (network,
5xx, 429) back off exponentially with jitter up to 60 s, honouring ``Retry-After``; a
snapshot the service refuses for good (a 4xx other than 404, 408 and 429) goes to the
dead-letter file with the reason, and the spool moves on.

Time is the service's: every ack carries ``server_time``, from which the agent measures its
clock's offset (service minus host, at the midpoint of the request); ``collected_at`` and
the judging of reservations use the host clock plus that offset, and the offset is sent
with every snapshot (:mod:`agent.clock`).

Each agent process draws a random ``agent_instance`` id and sends it with every snapshot:
the service's idempotency key is ``(host, agent_instance, seq)``, so an agent whose state
directory was lost (seq from 0 again) is never taken for a replay of the previous one.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from agent import __version__
from agent.client import PostResult, ServiceClient, backoff_delay
from agent.args import exit_for_monitoring, parse_args
from agent.clock import ServiceClock
from agent.collect import SnapshotBuilder, fit_body
from agent.consistency import judged_view
from agent.memtrim import TRIM_EVERY, trim
from agent.config import DEFAULT_STATE_DIR, AgentSettings, load_settings, read_token
from agent.schema import Snapshot, SnapshotAck
from agent.state import AckCache, DeadLetters, SeqCounter, Spool
from agent.telemetry import Source, log, warn_once




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
    :param now: aware UTC wall time of this host; ``collected_at`` and enforcement use it
        corrected by the offset measured from the service's acks (:meth:`service_now`).
    :param max_body_bytes: the service's body limit; a snapshot is trimmed to fit (:func:`fit_body`).
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
        max_body_bytes: int = 256 * 1024,
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
        self.dead = DeadLetters(state_dir / "dead-letter.jsonl")
        self.instance = uuid.uuid4().hex
        self.max_body_bytes = max_body_bytes
        self.service_clock = ServiceClock(now)
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

    @property
    def clock_offset_s(self) -> float | None:
        """Service minus host clock in seconds, from the last ack (``None`` before the first)."""
        return self.service_clock.offset_s

    def service_now(self) -> datetime:
        """The service's time as this host best knows it (see :mod:`agent.clock`)."""
        return self.service_clock.now()

    def take_snapshot(self) -> Snapshot:
        """Poll, number and judge one snapshot (no I/O to the service)."""
        at = self.service_now()
        snap = self.builder.build(self.seq.next(), at)
        snap.agent_instance = self.instance
        snap.clock_offset_s = round(self.clock_offset_s, 3) if self.clock_offset_s is not None else None
        if self.enforcer is not None:
            try:
                # devices whose process list disagrees with their memory are never judged
                judged, flagged = judged_view(snap)
                findings = self.enforcer.evaluate(judged, self.acks.ack, at)
                snap.findings = [f for f in findings if f.device_uuid not in flagged]
            except Exception as exc:  # noqa: BLE001 - enforcement must never stop reporting
                warn_once(f"enforce:{type(exc).__name__}", "enforcement failed (%r); snapshot sent without findings", exc,
                          level=logging.ERROR)
        self.last_snapshot = snap
        return snap

    def tick(self, deadline: float | None = None) -> Snapshot:
        """Take a snapshot, deliver or spool it, and drain the spool until ``deadline``."""
        snap = self.take_snapshot()
        body = self.encode(snap)
        if self.client is None:
            self.spool.put(snap.seq, body)
        elif len(self.spool) == 0 and self.clock() >= self._retry_at:
            result = self._post(body)
            if result.outcome == "retry":
                self.spool.put(snap.seq, body)
            self._handle(snap.seq, result, body)
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
            result = self._post(body)
            self._handle(seq, result, body)
            if result.outcome == "retry":
                break
            self.spool.remove(seq)
            posted += 1
        return posted

    def _post(self, body: bytes) -> PostResult:
        """POST ``body``; an ack's ``server_time`` sets the clock offset, taken against this
        host's clock halfway through the request."""
        assert self.client is not None
        sent = self.now()
        result = self.client.post(body)
        if result.ack is not None:
            self.service_clock.measure(result.ack.server_time, sent + (self.now() - sent) / 2)
        return result

    def encode(self, snap: Snapshot) -> bytes:
        """``snap`` as the body to post, trimmed to :attr:`max_body_bytes` (see :func:`fit_body`)."""
        body = fit_body(snap, self.max_body_bytes)
        if snap.trimmed:
            warn_once("trimmed", "snapshot over the service's body limit (%d bytes): %s", self.max_body_bytes, snap.trimmed)
        return body

    def _handle(self, seq: int, result: PostResult, body: bytes | None = None) -> None:
        if result.outcome == "ok":
            self.sent += 1
            if result.ack is not None:
                self.acks.update(result.ack)
                if result.ack.duplicate and result.ack.conflict:
                    log.error("service dropped snapshot seq %d as a duplicate of a different snapshot it already has: %s",
                              seq, result.ack.conflict)
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
            where = "dropped"
            if body is not None:
                where = self.dead.put(seq, result.status, result.detail, body, at=self.now())
            if state != self._link:
                log.error("service refused snapshot seq %d with %s%s: %s, not retried: %s",
                          seq, result.status, hint, where, (result.detail or "")[:300])
                self._link = state
            else:
                log.debug("service refused snapshot seq %d with %s: %s", seq, result.status, where)

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
            if ticks % TRIM_EVERY == 1:  # after the first poll (start-up garbage), then every TRIM_EVERY
                trim()
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

    from agent.containers import ContainerDirectory

    env = check_environment()
    containers = ContainerDirectory(settings.container_sockets, owner_label=settings.container_owner_label,
                                    name_pattern=settings.container_name_pattern,
                                    compose_pattern=settings.container_compose_pattern, ttl=settings.container_cache_seconds,
                                    state_dirs=settings.container_state_dirs)
    resolver = OwnerResolver(hide_args=settings.hide_args, host_pid_ns=env.host_pid_ns, hidepid=env.hidepid and not env.is_root,
                             containers=containers)
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
                              pid_namespace_ok=ns_ok, hide_args=settings.hide_args,
                              max_command_length=settings.max_command_length)

    if args.print_:
        snap = builder.build(0, utcnow())
        source.close()
        print(snap.model_dump_json(indent=2))
        return exit_for_monitoring(snap)

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
                  spool_max_bytes=settings.spool_max_mb << 20, spool_max_age_s=settings.spool_max_age_hours * 3600,
                  max_body_bytes=settings.max_body_kb << 10)

    if args.once:
        snap = agent.take_snapshot()
        body = agent.encode(snap)
        result = agent._post(body)
        agent._handle(snap.seq, result, body)
        agent.close()
        if result.outcome != "ok":
            print(f"gpuroster-agent: post failed ({result.status or ''} {result.detail or ''})".strip(), file=sys.stderr)
            return 1
        print(f"posted snapshot seq {snap.seq}: {len(snap.devices)} device(s), {len(snap.processes)} process(es), "
              f"{len(snap.findings)} finding(s)")
        return exit_for_monitoring(snap)

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
