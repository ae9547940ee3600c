"""The answer to a snapshot: the host's reservation table, open devices, uid table and policy.

Built on every snapshot, so read with plain statements built once (their compiled form is
cached by SQLAlchemy) into tuples, and the pydantic objects of the answer are reused while
the rows they were built from are unchanged: a host's table changes when someone books,
cancels or shares, not between two polls. The caches are keyed by the rows themselves, so
a change made by another process is seen on the next snapshot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, literal_column, null, or_, select, union_all
from sqlalchemy.orm import Session

from agent.schema import HostPolicy, ReservationEntry, SnapshotAck
from app.config import Settings
from app.models import Device, GroupMember, Host, Reservation, ReservationDevice, ReservationShare, User

# The window of the host's reservation table sent to the agent.
TABLE_AHEAD = timedelta(hours=48)
TABLE_BEHIND = timedelta(hours=6)

# Bounded caches: a lab has about as many hosts as entries; beyond that they are cleared.
_CACHE_MAX = 20_000

# Core columns (``Model.__table__``), not ORM attributes: the rows are plain tuples, and the
# ORM's result handling would be most of the cost of these small queries.
_R, _U, _D = Reservation.__table__, User.__table__, Device.__table__
_RD, _RS, _GM = ReservationDevice.__table__, ReservationShare.__table__, GroupMember.__table__
_r, _u, _d, _rd, _rs, _gm = _R.c, _U.c, _D.c, _RD.c, _RS.c, _GM.c


def _table_rows(host_match):  # noqa: ANN001, ANN202 - a clause on reservations.host_id
    """The table rows of the hosts ``host_match`` selects: reservation id, start, end, holder's
    username, unix_name, device uuid, holder's uid."""
    return (
        select(_r.id, _r.start_at, _r.end_at, _u.username, _u.unix_name, _d.uuid, _u.unix_uid)
        .join(_U, _u.id == _r.user_id)
        .join(_RD, _rd.reservation_id == _r.id)
        .join(_D, _d.id == _rd.device_id)
        .where(
            host_match,
            _r.status != "cancelled",
            _r.end_at > bindparam("after"),
            _r.start_at < bindparam("before"),
            # a device released before the rest of its reservation is no longer the holder's
            or_(_rd.end_at >= _r.end_at, _rd.end_at > bindparam("now")),
            # implied by the two above ("after" is before "now"), but it lets the planner reach the
            # reserved devices by ix_reservation_devices_end_at, never by scanning their history
            _rd.end_at > bindparam("after"),
        )
    )


_TABLE_ROWS = _table_rows(_r.host_id == bindparam("host_id")).order_by(_r.start_at, _r.id, _d.index)
_SHARE_ROWS = union_all(
    select(_rs.reservation_id, _u.unix_name, _u.unix_uid)
    .join(_U, _u.id == _rs.user_id)
    .where(_rs.reservation_id.in_(bindparam("ids", expanding=True))),
    select(_rs.reservation_id, _u.unix_name, _u.unix_uid)
    .join(_GM, _gm.group_id == _rs.group_id)
    .join(_U, _u.id == _gm.user_id)
    .where(_rs.reservation_id.in_(bindparam("ids", expanding=True))),
)
# What every ack reads, in one statement (two round trips less per snapshot): the table rows
# (kind 0, in _TABLE_ROWS' order), the host's open devices (kind 1: uuid) and the uid table
# (kind 2: unix_name, unix_uid), each branch padded with NULLs to _TABLE_ROWS' columns, then
# the row's host id (NULL for the uid table, which every host gets).
_N = null()


def _ack_rows(one: bool):  # noqa: ANN202
    """The ack statement for one host (``:host_id``) or for a batch's hosts (``:host_ids``)."""
    def match(column):  # noqa: ANN001, ANN202
        return column == bindparam("host_id") if one else column.in_(bindparam("host_ids", expanding=True))

    rows = union_all(
        _table_rows(match(_r.host_id)).add_columns(_d.index.label("ord"), literal_column("0").label("kind"),
                                                   _r.host_id),
        select(_N, _N, _N, _N, _N, _d.uuid, _N, _N, literal_column("1"), _d.host_id)
        .where(match(_d.host_id), _d.is_open.is_(True)),
        select(_N, _N, _N, _N, _u.unix_name, _N, _u.unix_uid, _N, literal_column("2"), _N)
        .where(and_(_u.unix_uid.is_not(None), _u.active.is_(True))),
    )
    # by position (kind, start_at, id, ord): SQLite matches a compound's ORDER BY names only to aliases
    return rows.order_by(*(literal_column(str(n)) for n in (9, 2, 1, 8)))


_ACK_ROWS, _BATCH_ACK_ROWS = _ack_rows(True), _ack_rows(False)


@dataclass(slots=True)
class AckRows:
    """What one host's ack is built from: its table rows (``_TABLE_ROWS``' columns), its open
    devices' UUIDs and the uid table's ``(unix_uid, unix_name)`` rows."""

    table: list[tuple] = field(default_factory=list)
    open_devices: list[str] = field(default_factory=list)
    uids: list[tuple] = field(default_factory=list)


def _split(rows, host_ids: list[int]) -> dict[int, AckRows]:  # noqa: ANN001
    """``_ack_rows``' answer by host (each host gets the one uid table)."""
    out = {h: AckRows() for h in host_ids}
    uids: list[tuple] = []
    for row in rows:
        kind = row[8]
        if kind == 0:
            out[row[9]].table.append(row[:7])
        elif kind == 1:
            out[row[9]].open_devices.append(row[5])
        else:
            uids.append((row[6], row[4]))
    for acks in out.values():
        acks.uids = uids
    return out


def batch_ack_rows(session: Session, host_ids: list[int], now: datetime) -> dict[int, AckRows]:
    """The ack rows of several hosts at ``now`` (UTC), in one statement (a batch of snapshots,
    before its writes: of the rows they come from, ingest writes only a device's index, which
    orders a reservation's devices, and a snapshot that moves one has its ack read again)."""
    if not host_ids:
        return {}
    params = {"host_ids": sorted(host_ids), "after": now - TABLE_BEHIND, "before": now + TABLE_AHEAD, "now": now}
    return _split(session.execute(_BATCH_ACK_ROWS, params).tuples(), host_ids)


_lock = threading.Lock()
_tables: dict[int, tuple[tuple, list[ReservationEntry]]] = {}
_uids: list[tuple[tuple, dict[int, str]]] = []
_policies: dict[int, tuple[tuple, HostPolicy]] = {}


def _remember(cache: dict, key: object, value: object) -> None:
    with _lock:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = value


def host_policy(host: Host) -> HostPolicy:
    """The host's enforcement settings as the agent receives them (reused while unchanged)."""
    key = (host.policy, host.grace_seconds, host.kill_timeout_seconds, host.notice_interval_seconds, host.min_uid,
           tuple(host.exempt_users or ()), host.idle_minutes,
           None if host.exempt_process_names is None else tuple(host.exempt_process_names))
    hit = _policies.get(host.id)
    if hit is not None and hit[0] == key:
        return hit[1]
    kwargs: dict[str, object] = dict(
        policy=host.policy,
        grace_seconds=host.grace_seconds,
        kill_timeout_seconds=host.kill_timeout_seconds,
        notice_interval_seconds=host.notice_interval_seconds,
        min_uid=host.min_uid,
        exempt_users=list(host.exempt_users or []),
        idle_minutes=host.idle_minutes,
    )
    if host.exempt_process_names is not None:
        kwargs["exempt_process_names"] = list(host.exempt_process_names)
    policy = HostPolicy(**kwargs)  # type: ignore[arg-type]
    _remember(_policies, host.id, (key, policy))
    return policy


def _window(host: Host, now: datetime) -> dict[str, object]:
    return {"host_id": host.id, "after": now - TABLE_BEHIND, "before": now + TABLE_AHEAD, "now": now}


def reservation_table(session: Session, *, host: Host, now: datetime, rows: tuple | None = None) -> list[ReservationEntry]:
    """Active, upcoming (48 h) and recently ended (6 h) reservations of ``host`` for the agent:
    one query for reservations and their devices (unless ``rows``, that query's answer, is
    given), one for shares (resolved to Unix names and uids, groups expanded) when there
    are reservations."""
    if rows is None:
        rows = tuple(session.execute(_TABLE_ROWS, _window(host, now)).tuples())
    if not rows:
        return []
    ids = sorted({r[0] for r in rows})
    shares = tuple(sorted(session.execute(_SHARE_ROWS, {"ids": ids}).tuples(), key=repr))
    key = (rows, shares)
    hit = _tables.get(host.id)
    if hit is not None and hit[0] == key:
        return hit[1]
    entries: dict[int, ReservationEntry] = {}
    for rid, start, end, username, unix_name, uuid, unix_uid in rows:
        e = entries.get(rid)
        if e is None:
            e = entries[rid] = ReservationEntry(id=rid, user=username, unix_name=unix_name, unix_uid=unix_uid,
                                                device_uuids=[], start=start, end=end)
        e.device_uuids.append(uuid)
    shared: dict[int, set[str]] = {}
    shared_uids: dict[int, set[int]] = {}
    for rid, unix, uid in shares:
        shared.setdefault(rid, set()).add(unix)
        if uid is not None:
            shared_uids.setdefault(rid, set()).add(uid)
    for rid, names in shared.items():
        entries[rid].shared_with = sorted(names)
        entries[rid].shared_uids = sorted(shared_uids.get(rid, ()))
    table = list(entries.values())
    _remember(_tables, host.id, (key, table))
    return table


def uid_table(rows: tuple) -> dict[int, str]:
    """Unix uid -> unix_name of every active user with a uid: the agent judges a process whose
    uid has no passwd entry on the host (directory users) by this table. ``rows``: its
    ``(unix_uid, unix_name)`` rows, read with the ack's (``_ack_rows``)."""
    with _lock:
        hit = _uids[0] if _uids else None
    if hit is not None and hit[0] == rows:
        return hit[1]
    table = dict(rows)
    with _lock:
        _uids[:] = [(rows, table)]
    return table


def build_ack(session: Session, *, host: Host, seq: int, duplicate: bool, settings: Settings, now: datetime,
              conflict: str | None = None, rows: AckRows | None = None) -> SnapshotAck:
    """The answer to snapshot ``seq`` of ``host`` at ``now`` (UTC): accepted, whether it was a
    duplicate (``conflict`` says why a reused seq was another snapshot), server time, policy,
    reservation table, open devices, uid table and the booking page's address. ``rows``: the
    host's ack rows when already read for a batch (:func:`batch_ack_rows`)."""
    if rows is None:
        rows = _split(session.execute(_ACK_ROWS, _window(host, now)).tuples(), [host.id])[host.id]
    return SnapshotAck.model_construct(
        accepted=True,
        duplicate=duplicate,
        conflict=conflict,
        seq=seq,
        server_time=now,
        policy=host_policy(host),
        reservations=reservation_table(session, host=host, now=now, rows=tuple(rows.table)),
        open_devices=rows.open_devices,
        unix_uids=uid_table(tuple(rows.uids)),
        booking_url=settings.base_url.rstrip("/") + "/book",
    )
