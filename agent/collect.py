"""Turn one source reading into a :class:`~agent.schema.Snapshot`: owners resolved, typed.

Live processes are resolved with :class:`~agent.owners.OwnerResolver`; replayed ones only
through the replay owners map (a replayed pid belongs to another host, so looking it up
here would attribute it to a stranger).
"""

from __future__ import annotations

import os
from datetime import datetime

from agent import __version__
from agent.owners import OwnerResolver
from agent.schema import MonitoringReport, ProcessReport, Snapshot
from agent.telemetry import Source, Telemetry


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
    ) -> None:
        self.source = source
        self.host = host
        self.interval = interval
        self.resolver = resolver or OwnerResolver(hide_args=hide_args, host_pid_ns=pid_namespace_ok)
        self.pid_namespace_ok = pid_namespace_ok
        self.hide_args = hide_args

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
        return Snapshot(
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
            devices=t.devices,
            processes=processes,
        )

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
            command=owner.command if attributed else None,
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
            command=command[:4096] if command else None,
            name=name[:256] or "(unnamed)",
            container_id=entry.get("container_id") if entry else None,
            owner_status="replay" if entry else "unknown",
        )
