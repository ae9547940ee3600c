"""Idle reservations: devices of an active reservation that show no process of the holder
and low utilization *now* (debounced by the agent's finding tracker over
``policy.idle_minutes``). Pure, like :mod:`agent.policy`, whose :func:`~agent.policy.judge`
includes these judgements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from agent.attribution import owner_of
from agent.judgement import Judgement, as_utc, entitled, is_active
from agent.schema import DeviceReport, HostPolicy, ProcessReport, ReservationEntry


def _holds(r: ReservationEntry, p: ProcessReport, unix_uids: Mapping[int, str] | None) -> bool:
    user = owner_of(p, unix_uids)
    return user is not None and entitled(r, user, None if p.container_id else p.uid)


def judge_idle(
    processes: Sequence[ProcessReport],
    devices: Sequence[DeviceReport],
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    *,
    now: datetime,
    unix_uids: Mapping[int, str] | None = None,
) -> list[Judgement]:
    """Devices of active reservations that look idle *now* (see the module docstring).

    A device that is not in ``devices`` (not reported, lost) or whose process listing failed
    is never idle: absence of evidence is not idleness. Utilization is in %.
    """
    by_uuid = {d.uuid: d for d in devices}
    children: dict[str, list[str]] = {}
    for d in devices:
        if d.parent_uuid:
            children.setdefault(d.parent_uuid, []).append(d.uuid)
    on_device: dict[str, list[ProcessReport]] = {}
    for p in processes:
        on_device.setdefault(p.device_uuid.strip(), []).append(p)
    out: list[Judgement] = []
    for r in sorted(reservations, key=lambda r: r.id):
        if not is_active(r, now):
            continue
        for uuid in dict.fromkeys(u.strip() for u in r.device_uuids):
            d = by_uuid.get(uuid)
            if d is None or d.health != "ok" or d.processes_status != "ok":
                continue
            span = [uuid, *children.get(uuid, [])]
            if any(by_uuid[u].processes_status != "ok" for u in span if u in by_uuid):
                continue
            procs = [p for u in span for p in on_device.get(u, ())]
            if any(_holds(r, p, unix_uids) for p in procs):
                continue
            util = d.utilization_gpu
            if util is None:
                if any(owner_of(p, unix_uids) is None for p in procs):
                    continue
                basis = "utilization n/a, no process of the holder"
            elif util >= policy.idle_utilization_pct:
                continue
            else:
                basis = f"utilization {util:g}% < {policy.idle_utilization_pct:g}%, no process of the holder"
            out.append(
                Judgement(
                    kind="idle",
                    device_uuid=uuid,
                    reason=f"reservation {r.id} of {r.unix_name} idle: {basis}",
                    unix_user=r.unix_name,
                    reservation_id=r.id,
                    holder=r.unix_name,
                    reservation_end=as_utc(r.end),
                )
            )
    return out
