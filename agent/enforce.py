"""The enforcer: judge every poll, debounce, notify, terminate per the host's policy.

The agent loop calls::

    enforcer = Enforcer(state_dir, dry_run=False)
    findings = enforcer.evaluate(snapshot, ack, now)   # list[FindingReport]

``ack`` is the last :class:`~agent.schema.SnapshotAck` the service sent (cached by the loop);
the enforcer needs nothing else from the service, so it keeps judging, notifying and
terminating while the service is unreachable. With ``ack`` ``None`` (no table known yet) it
judges nothing and returns the findings it already has, unchanged.

Timeline of one process finding (``policy`` from the ack; ``grace`` = ``grace_seconds``):

* ``t0`` first judged (pending); ``t0 + grace`` it becomes a finding (``open``);
* policy ``observe``: recorded and reported only;
* ``notify``: a notice to the offender's terminals at once (``notified``), repeated at most
  every ``notice_interval_seconds``; for ``foreign`` also a note to the rightful holder;
* ``terminate``: as ``notify``; then ``grace`` after the first notice that announced
  termination, SIGTERM; ``kill_timeout_seconds`` after SIGTERM, SIGKILL if the very process
  (pid, start ticks since boot, boot id) still lives. So a process that stays is ended about ``2 * grace`` after it
  was first seen (plus up to one poll interval per step). The first grace is the debounce,
  the second the warning time the notice announces.
* ``unattributed`` and ``unknown_uid`` findings (nobody can say whose process it is) are
  never signalled; the device's holder is told on their terminals, admins by the service.
* the finding becomes ``terminated`` when a signalled process is gone, ``resolved`` when it is
  no longer judged (process exited, reservation made, device released); either is reported
  once more and then forgotten.

``dry_run`` has no effect on the host: every signal becomes an
:class:`~agent.schema.ActionReport` ``dry_run`` (after the same re-identification), and every
notice a :class:`~agent.schema.NoticeReport` with ``delivered=0`` naming the terminals it would
have been written to; the finding stays ``open`` (nobody was told). The agent uses it for
replayed captures, whose pids and users belong to another host. Every signal, refusal (``skipped``) and dry-run is an
``ActionReport`` on the finding. Nothing in :meth:`Enforcer.evaluate` raises because of one
bad process, device or finding: the error is logged and that item skipped.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from agent.findings import FindingTracker, TrackedFinding
from agent.notify import Notifier, TerminalNotifier, compose_holder_message, compose_message, free_devices
from agent.policy import DEFAULT_OVERRUN_WINDOW, Judgement, as_utc, judge, judge_idle, judge_process
from agent.schema import ActionReport, DeviceReport, FindingReport, HostPolicy, Snapshot, SnapshotAck
from agent.terminate import ProcessSignaller, SignalOutcome, Signaller

log = logging.getLogger(__name__)

STATE_FILE = "findings.json"
#: Findings about a device, not a process (idle), or about a process nobody can be named for.
UNSIGNALLED_KINDS = frozenset({"idle", "unattributed", "unknown_uid"})
#: Findings whose terminal notice goes to the device's holder, there being no offender to tell.
HOLDER_ONLY_KINDS = frozenset({"idle", "unattributed", "unknown_uid"})


def _ref(f: TrackedFinding) -> str | float | None:
    """How the signaller re-identifies the finding's process: the identity token, or for a
    finding without one (replay, a state file from an older agent) its create_time."""
    return f.identity or f.create_time


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Enforcer:
    """Judges snapshots against the cached reservation table and acts per the host policy.

    ``state_dir``: where the tracker keeps ``findings.json`` (created if missing).
    ``dry_run``: log and report signals instead of sending them.
    ``notifier``/``signaller``: injectable (defaults: :class:`TerminalNotifier`,
    :class:`ProcessSignaller`). ``clock``: returns aware UTC ``now`` when ``evaluate`` gets none.
    ``overrun_window``: how long after its end a reservation makes a leftover process
    ``overrun`` rather than ``unreserved``.
    """

    def __init__(
        self,
        state_dir: Path,
        dry_run: bool = False,
        *,
        notifier: Notifier | None = None,
        signaller: Signaller | None = None,
        clock: Callable[[], datetime] = _utcnow,
        overrun_window: timedelta = DEFAULT_OVERRUN_WINDOW,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.dry_run = dry_run
        self.notifier: Notifier = notifier or TerminalNotifier()
        self.signaller: Signaller = signaller or ProcessSignaller()
        self.clock = clock
        self.overrun_window = overrun_window
        self.tracker = FindingTracker(self.state_dir / STATE_FILE)

    # ------------------------------------------------------------------------------------
    def evaluate(self, snapshot: Snapshot, ack: SnapshotAck | None, now: datetime | None = None) -> list[FindingReport]:
        """Judge ``snapshot`` at ``now`` (default: the clock) and act; return the findings.

        Returns every current finding (``open``/``notified``) and those that ended since the
        last call (``terminated``/``resolved``), each with the notices and actions taken since
        the last call. State is saved under ``state_dir`` before returning (a failed save is
        logged, not raised).
        """
        now = as_utc(now or self.clock())
        if ack is None:
            return self.tracker.reports()
        policy = ack.policy
        try:
            self._follow_signalled(policy, now)
            self._observe(snapshot, ack, now)
            ctx = _Context(self, snapshot, ack, now)
            for f in self.tracker.active():
                try:
                    self._act(f, ctx)
                except Exception:  # noqa: BLE001 - one finding must not stop the others
                    log.exception("enforcement of finding %s failed; skipped this poll", f.key)
        except Exception:  # noqa: BLE001 - the poll loop must go on; findings so far are kept
            log.exception("evaluating snapshot %s of %s failed", snapshot.seq, snapshot.host)
        finally:
            # drain first: what is returned now is never returned again after a restart
            reports = self.tracker.reports()
            try:
                self.tracker.save()
            except OSError as e:
                log.error("cannot save finding state under %s: %s", self.state_dir, e)
        return reports

    # ------------------------------------------------------------------------------------
    def _judge(self, snapshot: Snapshot, ack: SnapshotAck, now: datetime) -> list[Judgement]:
        procs = [p for p in snapshot.processes if p.pid != os.getpid()]
        kw = dict(devices=snapshot.devices, open_devices=ack.open_devices, unix_uids=ack.unix_uids)
        try:
            return judge(procs, ack.reservations, ack.policy, now=now, overrun_window=self.overrun_window, **kw)
        except Exception:  # noqa: BLE001 - fall back to one process at a time
            log.exception("judging the snapshot failed; judging process by process")
        out: dict[str, Judgement] = {}
        for p in procs:
            try:
                j = judge_process(p, ack.reservations, ack.policy, now=now, overrun_window=self.overrun_window, **kw)
            except Exception:  # noqa: BLE001
                log.exception("cannot judge pid %s on %s; skipped", p.pid, p.device_uuid)
                continue
            if j is not None:
                out.setdefault(j.key, j)
        try:
            for j in judge_idle(procs, snapshot.devices, ack.reservations, ack.policy, now=now, unix_uids=ack.unix_uids):
                out.setdefault(j.key, j)
        except Exception:  # noqa: BLE001
            log.exception("idle judgement failed; skipped")
        return list(out.values())

    def _observe(self, snapshot: Snapshot, ack: SnapshotAck, now: datetime) -> None:
        policy = ack.policy
        if snapshot.stale or snapshot.monitoring.status == "down":
            # nothing reliable was listed: keep every finding as it is
            unobserved = {f.device_uuid for f in self.tracker.findings.values()}
            judgements: list[Judgement] = []
        else:
            unobserved = {d.uuid for d in snapshot.devices if d.health != "ok" or d.processes_status != "ok"}
            judgements = self._judge(snapshot, ack, now)
        self.tracker.observe(
            judgements,
            now=now,
            grace=timedelta(seconds=policy.grace_seconds),
            idle_after=timedelta(minutes=policy.idle_minutes),
            unobserved_devices=unobserved,
        )

    def _follow_signalled(self, policy: HostPolicy, now: datetime) -> None:
        """A really signalled process that is gone ends its finding as ``terminated``."""
        for f in list(self.tracker.active()):
            if not f.signalled or f.pid is None:
                continue
            try:
                alive = self.signaller.alive(f.pid, _ref(f))
            except Exception:  # noqa: BLE001
                log.exception("cannot check pid %s", f.pid)
                continue
            if not alive:
                log.info("finding %s: pid %s is gone after the signal: terminated", f.key, f.pid)
                self.tracker.end(f.key, "terminated", now)

    # ------------------------------------------------------------------------------------
    def _act(self, f: TrackedFinding, ctx: "_Context") -> None:
        policy = ctx.policy
        now = ctx.now
        grace = timedelta(seconds=policy.grace_seconds)
        can_kill = policy.policy == "terminate" and f.kind not in UNSIGNALLED_KINDS and f.pid is not None
        planned = None
        if can_kill and not f.kill_settled:
            planned = f.sigterm_at or (f.warned_at or now) + grace
        f.message = ctx.message(f, planned)
        if policy.policy in ("notify", "terminate"):
            interval = timedelta(seconds=policy.notice_interval_seconds)
            due = f.last_notice_at is None or now - f.last_notice_at >= interval
            if can_kill and f.warned_at is None and not f.kill_settled:
                due = True  # termination is always announced before it happens
            if due:
                self._notice(f, ctx)
                if can_kill and f.warned_at is None:
                    f.warned_at = now
        if can_kill and not f.kill_settled and f.warned_at is not None:
            self._terminate_step(f, policy, now, grace)

    def _notice(self, f: TrackedFinding, ctx: "_Context") -> None:
        now = ctx.now
        recipient = f.holder if f.kind in HOLDER_ONLY_KINDS else f.unix_user
        if not recipient:
            return
        pids = [f.pid] if f.pid is not None else []
        rep = self.notifier.notify(recipient=recipient, pids=pids, text=f.message or "", at=now, dry_run=self.dry_run)
        f.notices.append(rep)
        log.info("notice for %s to %s: %s terminal(s); %s", f.key, recipient, rep.delivered, rep.detail)
        if f.kind == "foreign" and f.holder and f.holder != f.unix_user:
            text = compose_holder_message(
                host=ctx.snapshot.host,
                device_uuid=f.device_uuid,
                devices=ctx.snapshot.devices,
                reservation=ctx.reservation(f.reservation_id),
                now=now,
                offender=f.unix_user,
                pid=f.pid,
                command=f.command,
            )
            f.notices.append(self.notifier.notify(recipient=f.holder, pids=[], text=text, at=now, dry_run=self.dry_run))
        f.last_notice_at = now
        if f.first_notice_at is None:
            f.first_notice_at = now
        if f.state == "open" and not self.dry_run:
            f.state = "notified"

    def _record(self, f: TrackedFinding, action: str, now: datetime, reason: str) -> None:
        assert f.pid is not None
        f.actions.append(ActionReport(action=action, pid=f.pid, create_time=f.create_time, at=now, reason=reason[:1024]))  # type: ignore[arg-type]
        log.warning("finding %s: %s pid %s: %s", f.key, action, f.pid, reason)

    def _same_process_signalled(self, f: TrackedFinding) -> TrackedFinding | None:
        for other in self.tracker.findings.values():
            if other is f or other.pid != f.pid or other.sigterm_at is None:
                continue
            if f.identity and other.identity:
                if f.identity == other.identity:
                    return other
            elif (
                other.create_time is not None
                and f.create_time is not None
                and abs(other.create_time - f.create_time) < 0.05
            ):
                return other
        return None

    def _terminate_step(self, f: TrackedFinding, policy: HostPolicy, now: datetime, grace: timedelta) -> None:
        assert f.pid is not None and f.warned_at is not None
        kill_after = timedelta(seconds=policy.kill_timeout_seconds)
        if f.sigterm_at is None:
            if now - f.warned_at < grace:
                return
            twin = self._same_process_signalled(f)
            if twin is not None:  # the same process on another device was already signalled
                f.sigterm_at, f.sigkill_at, f.signal_mode = twin.sigterm_at, twin.sigkill_at, twin.signal_mode
                return
            self._signal(f, signal.SIGTERM, policy, now)
        elif f.sigkill_at is None and now - f.sigterm_at >= kill_after:
            self._signal(f, signal.SIGKILL, policy, now)

    def _signal(self, f: TrackedFinding, sig: signal.Signals, policy: HostPolicy, now: datetime) -> None:
        assert f.pid is not None
        name = sig.name
        if self.dry_run:
            out = self.signaller.verify(f.pid, _ref(f), policy)
            if out.status == "ok":
                self._record(f, "dry_run", now, f"would send {name}: {out.detail}")
                if sig == signal.SIGTERM:
                    f.sigterm_at, f.signal_mode = now, "dry_run"
                else:
                    f.sigkill_at, f.kill_settled = now, True
                return
        else:
            out = self.signaller.send(f.pid, _ref(f), sig, policy)
            if out.status == "sent":
                self._record(f, name.lower(), now, out.detail)
                if sig == signal.SIGTERM:
                    f.sigterm_at, f.signal_mode = now, "real"
                else:
                    f.sigkill_at = now
                return
        self._refused(f, name, out, now)

    def _refused(self, f: TrackedFinding, name: str, out: SignalOutcome, now: datetime) -> None:
        """Record a signal that was not sent; never retried for this finding. The finding ends
        the usual way: ``resolved`` when no longer listed, ``terminated`` if it had a SIGTERM."""
        self._record(f, "skipped", now, f"{name} not sent: {out.status}: {out.detail}")
        f.kill_settled = True


class _Context:
    """Per-evaluate lookups shared by all findings (free devices computed lazily)."""

    def __init__(self, enforcer: Enforcer, snapshot: Snapshot, ack: SnapshotAck, now: datetime) -> None:
        self.snapshot = snapshot
        self.ack = ack
        self.policy = ack.policy
        self.now = now
        self._free: list[DeviceReport] | None = None
        self._res = {r.id: r for r in ack.reservations}

    def reservation(self, rid: int | None):  # noqa: ANN201 - ReservationEntry | None
        return self._res.get(rid) if rid is not None else None

    @property
    def free(self) -> list[DeviceReport]:
        if self._free is None:
            try:
                self._free = free_devices(
                    self.snapshot.devices,
                    self.snapshot.processes,
                    self.ack.reservations,
                    self.policy,
                    now=self.now,
                    open_devices=self.ack.open_devices,
                )
            except Exception:  # noqa: BLE001 - a hint, never a reason to fail
                log.exception("cannot compute free devices")
                self._free = []
        return self._free

    def message(self, f: TrackedFinding, sigterm_at: datetime | None) -> str:
        return compose_message(
            kind=f.kind,
            host=self.snapshot.host,
            device_uuid=f.device_uuid,
            devices=self.snapshot.devices,
            reservations=self.ack.reservations,
            policy=self.policy,
            now=self.now,
            unix_user=f.unix_user,
            pid=f.pid,
            command=f.command,
            reservation_id=f.reservation_id,
            holder=f.holder,
            free=self.free,
            booking_url=self.ack.booking_url,
            sigterm_at=sigterm_at,
        )


__all__ = ["Enforcer", "STATE_FILE"]
