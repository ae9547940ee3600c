"""Turn one source reading into a :class:`~agent.schema.Snapshot`: owners resolved, typed.

Live processes are resolved with :class:`~agent.owners.OwnerResolver`; replayed ones only
through the replay owners map (a replayed pid belongs to another host, so looking it up
here would attribute it to a stranger).

What is sent is bounded: command lines are cut to ``max_command_length`` characters (an
ellipsis marks the cut), and :func:`fit_body` trims a snapshot that would still exceed the
service's body limit, saying what it cut in ``Snapshot.trimmed``, instead of sending a body
the service must refuse (413) on every poll.
"""

from __future__ import annotations

import os
from datetime import datetime

from agent import __version__
from agent.consistency import ProcessDataChecker
from agent.owners import OwnerResolver
from agent.schema import DeviceReport, MonitoringReport, ProcessReport, Snapshot
from agent.telemetry import Source, Telemetry


ELLIPSIS = "\u2026"
TRIM_COMMAND = 128  # characters kept per command line when a snapshot must shrink


def cut(text: str | None, limit: int) -> str | None:
    """``text`` cut to at most ``limit`` characters, the cut marked with an ellipsis."""
    if text is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS


def fit_body(snap: Snapshot, max_bytes: int) -> bytes:
    """``snap`` serialized within ``max_bytes``, trimming process detail in steps until it fits.

    Steps, each only if still needed: command lines of processes and findings cut to
    :data:`TRIM_COMMAND` characters; process command lines dropped; processes that no
    finding names dropped, smallest memory first (the device telemetry and every finding
    stay). ``snap.trimmed`` records what was done; ``snap`` is changed in place.
    """
    body = snap.model_dump_json().encode()
    if len(body) <= max_bytes:
        return body
    done: list[str] = []
    for p in snap.processes:
        p.command = cut(p.command, TRIM_COMMAND)
    for f in snap.findings:
        f.command = cut(f.command, TRIM_COMMAND)
    done.append(f"command lines cut to {TRIM_COMMAND} characters")
    snap.trimmed = "; ".join(done)
    body = snap.model_dump_json().encode()
    if len(body) <= max_bytes:
        return body
    for p in snap.processes:
        p.command = None
    done.append("process command lines dropped")
    snap.trimmed = "; ".join(done)
    body = snap.model_dump_json().encode()
    if len(body) <= max_bytes:
        return body
    named = {(f.device_uuid, f.pid) for f in snap.findings}
    droppable = sorted((p for p in snap.processes if (p.device_uuid, p.pid) not in named),
                       key=lambda p: p.used_memory_mib or 0.0)
    # each process row costs about the same: drop enough of them in one go, then check
    per_row = max(1, len(body) // max(1, len(snap.processes) + len(snap.devices) + len(snap.findings)))
    excess = len(body) - max_bytes
    drop = {id(p) for p in droppable[: excess // per_row + 1]}
    while True:
        snap.processes = [p for p in snap.processes if id(p) not in drop]
        snap.trimmed = "; ".join(done + [f"{len(drop)} process row(s) without a finding dropped"])
        body = snap.model_dump_json().encode()
        if len(body) <= max_bytes or len(drop) >= len(droppable):
            return body
        drop |= {id(p) for p in droppable[len(drop): len(drop) + max(1, len(drop))]}


def _without_ok_checks(d: DeviceReport) -> DeviceReport:
    """``d`` with its ``ok`` health checks left out: the wire carries only the readings that
    are ``bad`` or ``unknown`` (parsing a model per fine reading cost the service more than
    the rest of an 8-GPU snapshot's devices)."""
    if all(c.state != "ok" for c in d.health_checks):
        return d
    return d.model_copy(update={"health_checks": [c for c in d.health_checks if c.state != "ok"]})


class SnapshotBuilder:
    """Poll a source and build snapshots for ``host``.

    :param interval: the poll interval in seconds, reported in ``Snapshot.interval_seconds``.
    :param pid_namespace_ok: result of the start-up PID namespace check (``None`` unknown).
    """

    def __init__(
        self,
        source: Source,
        *,
        host: str,
        interval: float = 5.0,
        resolver: OwnerResolver | None = None,
        pid_namespace_ok: bool | None = None,
        hide_args: bool = False,
        max_command_length: int = 1024,
        consistency: ProcessDataChecker | None = None,
    ) -> None:
        self.source = source
        self.host = host
        self.interval = interval
        self.resolver = resolver or OwnerResolver(hide_args=hide_args, host_pid_ns=pid_namespace_ok)
        self.pid_namespace_ok = pid_namespace_ok
        self.hide_args = hide_args
        self.max_command_length = max_command_length
        self.consistency = consistency or ProcessDataChecker()

    def build(self, seq: int, now: datetime) -> Snapshot:
        """Poll the source once and return the snapshot numbered ``seq``, taken at ``now`` (UTC)."""
        return self.from_telemetry(self.source.poll(), seq, now)

    def from_telemetry(self, t: Telemetry, seq: int, now: datetime) -> Snapshot:
        """Build the snapshot for an existing reading."""
        if t.source == "replay":
            processes = [self._replayed(p, t.replay_owners or {}) for p in t.processes]
            ns_ok = None
        else:
            processes = [self._live(p) for p in t.processes]
            self.resolver.end_poll()
            ns_ok = self.pid_namespace_ok
        monitoring = t.monitoring
        if t.source == "nvml" and ns_ok is False and monitoring.status == "ok":
            monitoring = MonitoringReport(status="degraded", message="cannot attribute processes: run with host PID namespace")
        suspect = list(t.suspect_reasons)
        snap = Snapshot(
            host=self.host,
            seq=seq,
            collected_at=now,
            agent_version=__version__,
            source=t.source,
            replay_of=t.replay_of,
            interval_seconds=self.interval,
            driver_version=t.driver_version,
            nvml_version=t.nvml_version,
            cuda_version=t.cuda_version,
            binding_version=t.binding_version,
            monitoring=monitoring,
            stale=t.stale,
            suspect=bool(suspect),
            suspect_reasons=suspect,
            pid_namespace_ok=ns_ok,
            devices=[_without_ok_checks(d) for d in t.devices],
            processes=processes,
        )
        self.consistency.check(snap, live=t.source == "nvml")
        return snap

    def _live(self, p) -> ProcessReport:  # noqa: ANN001 - RawProcess
        owner = self.resolver.resolve(p.pid)
        attributed = owner.status in ("ok", "uid_only", "unattributed")
        return ProcessReport(
            device_uuid=p.device_uuid,
            pid=p.pid,
            type=p.type,
            used_memory_mib=p.used_memory_mib,
            uid=owner.uid if attributed else None,
            unix_user=owner.user if attributed else None,
            command=cut(owner.command, self.max_command_length) if attributed else None,
            name=owner.name if attributed else None,
            create_time=owner.create_time,
            identity=owner.identity,
            container_id=owner.container_id if attributed else None,
            container_name=owner.container_name if attributed else None,
            container_image=owner.container_image if attributed else None,
            owner_source=owner.owner_source if attributed else None,  # type: ignore[arg-type]
            exe=owner.exe if attributed else None,
            owner_status=owner.status,
        )

    def _replayed(self, p, owners: dict[int, dict]) -> ProcessReport:  # noqa: ANN001 - RawProcess
        entry = owners.get(p.pid)
        command = p.command
        if command and self.hide_args:
            command = command.split()[0]
        name = os.path.basename(p.command.split()[0].replace("\\", "/")) if p.command else "(unnamed)"
        return ProcessReport(
            device_uuid=p.device_uuid,
            pid=p.pid,
            type=p.type,
            used_memory_mib=p.used_memory_mib,
            uid=entry.get("uid") if entry else None,
            unix_user=(entry.get("user") or None) if entry else None,
            command=cut(command, self.max_command_length),
            name=name[:256] or "(unnamed)",
            container_id=entry.get("container_id") if entry else None,
            owner_status="replay" if entry else "unknown",
        )
