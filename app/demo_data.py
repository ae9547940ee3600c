"""What ``gpuroster demo`` puts in the database and where it finds its inputs: the admin,
the demo users and their captures' pids (:data:`DEMO_OWNERS`), one host per agent, and the
reservations that make every state of the Now page visible (:func:`plan_reservations`).
The seeding functions take the session and never commit, like every service.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError
from app.models import Device, DeviceProcess, Host, Reservation, ReservationDevice, User
from app.security import token_hash

ADMIN = "admin"
DEMO_GRACE_SECONDS = 10  # a process without a reservation becomes a finding this fast
DEMO_POLICY = "observe"  # record findings; never notify or signal anybody from a demo
REPLAY_INTERVAL_S = 3.0  # seconds between replayed polls
NVML_INTERVAL_S = 5.0
RESERVATION_HOURS = 8
DEMO_NOTE = "gpuroster demo"

# Demo users: (username, uid, display name). Unix names equal the usernames.
DEMO_USERS: tuple[tuple[str, int, str], ...] = (
    ("alice", 2001, "Alice (demo)"),
    ("bob", 2002, "Bob (demo)"),
    ("carol", 2003, "Carol (demo)"),
    ("dave", 2004, "Dave (demo)"),
)
# The bundled captures' real pids -> the demo user said to run them (see agent/captures/SOURCES.md):
#   pai__nvidia_smi_out_of_order.xml: 58813 python on GPU 0, 58642 python on GPU 1 (4x Tesla K80)
#   telegraf__dual_a5000-v13.xml:     100477 llama-server on both RTX A5000
#   telegraf__a100-sxm4-v12.xml:      no processes (A100 in MIG mode, 4 instances)
DEMO_OWNERS: dict[int, str] = {58813: "alice", 58642: "bob", 100477: "carol"}
UNRESERVED_USER = "bob"  # runs without a reservation: the finding
IDLE_USER = "dave"  # holds a device and runs nothing: reserved-idle
UPCOMING_USER = "carol"  # an upcoming reservation on a free device

_HOST_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


# ---------------------------------------------------------------------------- inputs


def bundled_captures() -> list[Path]:
    """The ``nvidia-smi -q -x`` captures shipped with the agent package, sorted by name."""
    folder = resources.files("agent") / "captures"
    return sorted((Path(str(p)) for p in folder.iterdir() if p.name.endswith(".xml")), key=lambda p: p.name)


def replay_host_name(capture: Path) -> str:
    """``replay-<capture stem>`` with ``__``/``_`` as ``-``: a valid, recognisable host name."""
    stem = capture.name.removesuffix(".xml").replace("__", "-").replace("_", "-")
    return ("replay-" + _HOST_CHARS.sub("-", stem).strip("-").lower())[:128]


def owners_map() -> dict[str, dict[str, object]]:
    """The replay owners map (the agent's ``--replay-owners`` JSON) for :data:`DEMO_OWNERS`."""
    uids = {name: uid for name, uid, _ in DEMO_USERS}
    doc: dict[str, dict[str, object]] = {}
    for pid, user in sorted(DEMO_OWNERS.items()):
        doc[str(pid)] = {"user": user, "uid": uids[user]}
    return doc


def nvml_device_count() -> tuple[int, str]:
    """(number of NVIDIA GPUs NVML sees, a short reason); 0 when NVML is missing or fails."""
    try:
        import pynvml
    except ImportError as e:
        return 0, f"pynvml not importable ({e})"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - any NVML failure means "no GPUs to show"
        return 0, f"NVML unavailable ({e.__class__.__name__}: {e})"
    try:
        n = int(pynvml.nvmlDeviceGetCount())
        return n, f"NVML sees {n} GPU(s)"
    except Exception as e:  # noqa: BLE001
        return 0, f"NVML device count failed ({e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def local_host_name() -> str:
    """This machine's name as a valid host name."""
    name = _HOST_CHARS.sub("-", socket.gethostname()).strip("-.") or "localhost"
    return name[:128]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------- seeding (services: take the session, never commit)


@dataclass
class AdminResult:
    created: bool
    password: str | None = None
    token: str | None = None


def ensure_admin(session: Session, *, username: str = ADMIN) -> AdminResult:
    """Create the admin with a random password and an API token unless it exists.

    The secrets are returned once for printing; only their hashes are stored.
    """
    from app.services import users as user_service

    if session.scalar(select(User.id).where(User.username == username)) is not None:
        return AdminResult(created=False)
    password = secrets.token_urlsafe(12)
    user = user_service.create_user(session, username=username, password=password, admin=True,
                                    display_name="Administrator", actor="demo")
    _, token = user_service.create_api_token(session, user=user, name="demo")
    return AdminResult(created=True, password=password, token=token)


def ensure_demo_users(session: Session) -> dict[str, str]:
    """Create the members of :data:`DEMO_USERS` that do not exist, each with a random
    password so that they can sign in; returns username -> password of those created (to be
    printed once, like the admin's: only the hashes are stored)."""
    from app.services import users as user_service

    created: dict[str, str] = {}
    for name, _uid, display in DEMO_USERS:
        if session.scalar(select(User.id).where(User.username == name)) is None:
            password = secrets.token_urlsafe(12)
            user_service.create_user(session, username=name, unix_name=name, display_name=display, actor="demo",
                                     password=password)
            created[name] = password
    return created


def ensure_host(session: Session, *, name: str, token_file: Path) -> bool:
    """Register host ``name`` (policy :data:`DEMO_POLICY`, grace :data:`DEMO_GRACE_SECONDS`)
    unless it exists, and make ``token_file`` hold a valid host token for it (a new one
    when the file is missing or belongs to an earlier database). Returns True if created.
    """
    from app.services import hosts as host_service

    host = session.scalar(select(Host).where(Host.name == name))
    created = host is None
    if host is None:
        host, token = host_service.create_host(session, name=name, actor="demo")
        host.policy = DEMO_POLICY
        host.grace_seconds = DEMO_GRACE_SECONDS
    else:
        try:
            current = token_file.read_text().strip()
        except OSError:
            current = ""
        if current and token_hash(current) == host.token_hash:
            return False
        token = host_service.rotate_host_token(session, host=host, actor="demo")
    write_secret(token_file, token)
    return created


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` readable by its owner only (mode 600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class PlannedReservation:
    """One reservation the demo wants: ``user`` on ``uuids`` of ``host``, ``[start, end)``."""

    user: str
    host: str
    uuids: tuple[str, ...]
    start: datetime
    end: datetime
    purpose: str


def plan_reservations(session: Session, *, hosts: Sequence[str], now: datetime) -> list[PlannedReservation]:
    """What to book on the replayed ``hosts`` so that the Now page shows every state.

    From each host's latest processes: every device on which a demo user other than
    :data:`UNRESERVED_USER` runs is reserved for that user (in use by the holder); the
    unreserved user's process is left without one (the finding). Of the devices without
    processes (MIG instances rather than their parent GPU), the first is reserved for
    :data:`IDLE_USER` (reserved-idle) when at least two are idle, the last gets an upcoming
    reservation for :data:`UPCOMING_USER` when at least three are, and the rest stay free.
    """
    demo_users = {name for name, _, _ in DEMO_USERS}
    end = now + timedelta(hours=RESERVATION_HOURS)
    plan: list[PlannedReservation] = []
    for host_name in hosts:
        host = session.scalar(select(Host).where(Host.name == host_name))
        if host is None:
            continue
        devices = list(session.scalars(
            select(Device).where(Device.host_id == host.id, Device.retired_at.is_(None)).order_by(Device.id)
        ))
        users_on: dict[int, set[str]] = defaultdict(set)
        for dev_id, unix in session.execute(
            select(DeviceProcess.device_id, DeviceProcess.unix_user).where(DeviceProcess.host_id == host.id)
        ):
            users_on[dev_id].add(unix or "")
        has_children = {d.parent_id for d in devices if d.parent_id is not None}
        by_user: dict[str, list[str]] = defaultdict(list)
        busy: set[int] = set()
        for d in devices:
            users = users_on.get(d.id, set())
            if users:
                busy.add(d.id)
                if d.parent_id is not None:
                    busy.add(d.parent_id)
            owners = sorted(u for u in users if u in demo_users and u != UNRESERVED_USER)
            if len(owners) == 1 and not (users - {owners[0]}):
                by_user[owners[0]].append(d.uuid)
        for user, uuids in sorted(by_user.items()):
            plan.append(PlannedReservation(user, host_name, tuple(uuids), now, end, "in use by the holder"))
        idle = [d for d in sorted(devices, key=_device_order)
                if d.id not in busy and d.id not in has_children]
        if len(idle) >= 2:
            plan.append(PlannedReservation(IDLE_USER, host_name, (idle[0].uuid,), now, end, "reserved, idle"))
        if len(idle) >= 3:
            start = now + timedelta(hours=2)
            plan.append(PlannedReservation(UPCOMING_USER, host_name, (idle[-1].uuid,), start,
                                           start + timedelta(hours=2), "free now, booked later"))
    return plan


def _device_order(d: Device) -> tuple[int, int, str]:
    return (d.index if d.index is not None else 1 << 30, d.gpu_instance_id or 0, d.uuid)


def _ended_by_a_user(p: PlannedReservation, *, now: datetime):
    """A query for a demo booking of ``p``'s user and first device, within the demo's booking
    horizon, that somebody released or cancelled: a later start of the demo must not undo that."""
    return (
        select(Reservation.id)
        .join(ReservationDevice, ReservationDevice.reservation_id == Reservation.id)
        .join(Device, Device.id == ReservationDevice.device_id)
        .join(User, User.id == Reservation.user_id)
        .where(User.username == p.user, Device.uuid == p.uuids[0], Reservation.status.in_(("released", "cancelled")),
               Reservation.note.startswith(DEMO_NOTE), Reservation.start_at > now - timedelta(hours=RESERVATION_HOURS))
        .limit(1)
    )


def ensure_reservations(
    session: Session, *, plan: Iterable[PlannedReservation], settings: Settings, now: datetime
) -> list[tuple[PlannedReservation, str]]:
    """Book each planned reservation that is not already there; returns (plan, outcome) pairs.

    "Already there": a confirmed reservation of the same user on the first of its devices
    that covers the planned start (for one starting now) or starts later (for an upcoming
    one). A refusal (someone else booked the device meanwhile) is reported, not raised.
    """
    from app.schemas.reservation import ReservationCreate
    from app.services import reservations as reservation_service

    admin = session.scalar(select(User).where(User.username == ADMIN))
    if admin is None:
        raise RuntimeError("the demo admin does not exist; ensure_admin first")
    out: list[tuple[PlannedReservation, str]] = []
    for p in plan:
        q = (
            select(Reservation.id)
            .join(ReservationDevice, ReservationDevice.reservation_id == Reservation.id)
            .join(Device, Device.id == ReservationDevice.device_id)
            .join(User, User.id == Reservation.user_id)
            .where(User.username == p.user, Device.uuid == p.uuids[0], Reservation.status == "confirmed",
                   Reservation.end_at > now)
        )
        q = q.where(Reservation.start_at <= now) if p.start <= now else q.where(Reservation.start_at > now)
        if session.scalar(q.limit(1)) is not None:
            out.append((p, "exists"))
            continue
        if session.scalar(_ended_by_a_user(p, now=now)) is not None:
            out.append((p, "ended by a user; not booked again"))
            continue
        data = ReservationCreate(
            host=p.host, devices=list(p.uuids), start="now" if p.start <= now else p.start.isoformat(),
            end=p.end.isoformat(), user=p.user, note=f"{DEMO_NOTE}: {p.purpose}", override_reason=DEMO_NOTE,
        )
        try:
            with session.begin_nested():
                r = reservation_service.create_reservation(session, actor=admin, data=data, settings=settings, now=now)
            out.append((p, f"booked #{r.id}"))
        except AppError as e:
            out.append((p, f"not booked: {e.detail}"))
    return out
