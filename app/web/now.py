"""The home page (``/``): one card per host, one row per device, refreshed by htmx."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.api.deps import SessionDep
from app.models import utcnow
from app.schemas.host import HostRead
from app.services import devices as device_service
from app.services.devices import DeviceView
from app.web.deps import PageViewer
from app.web.render import page

router = APIRouter(tags=["web"], include_in_schema=False)

REFRESH_SECONDS = 5

DEVICE_BADGES = {
    "free": "free",
    "reserved-idle": "reserved, idle",
    "in-use": "in use",
    "finding": "finding",
    "monitoring-down": "monitoring down",
    "stale": "stale agent",
    "lost": "lost GPU",
    "retired": "retired",
}
HOST_BADGES = {
    "ok": "agent ok",
    "stale": "stale agent",
    "never": "no snapshot yet",
    "down": "monitoring down",
    "degraded": "monitoring degraded",
    "no_driver": "no NVIDIA driver",
    "misconfigured": "monitoring misconfigured",
}


@dataclass
class DeviceRow:
    """One device on the Now page: its view and how to label it."""

    view: DeviceView
    label: str
    badge: str


@dataclass
class HostCard:
    """One host on the Now page with its devices (MIG instances after their GPU)."""

    host: HostRead
    badge: str
    devices: list[DeviceRow] = field(default_factory=list)


def device_label(view: DeviceView, parents: dict[int, DeviceView]) -> str:
    """``0`` for GPU 0; ``0 · MIG 3g.40gb`` for a MIG instance of GPU 0."""
    d = view.device
    if d.parent_id is not None:
        parent = parents.get(d.parent_id)
        idx = parent.device.index if parent is not None and parent.device.index is not None else "?"
        return f"{idx} · MIG {d.mig_profile or d.gpu_instance_id or ''}".rstrip()
    return str(d.index) if d.index is not None else "?"


def now_view(session: Session, *, now: datetime) -> list[HostCard]:
    """Every host with its non-retired devices, their telemetry, processes and holders."""
    hosts = device_service.list_hosts(session, now=now)
    views = device_service.device_views(session, now=now)
    by_id = {v.device.id: v for v in views}
    per_host: dict[str, list[DeviceRow]] = defaultdict(list)
    for v in views:
        per_host[v.host.name].append(DeviceRow(view=v, label=device_label(v, by_id), badge=DEVICE_BADGES.get(v.status, v.status)))
    return [HostCard(host=h, badge=HOST_BADGES.get(h.status, h.status), devices=per_host.get(h.name, [])) for h in hosts]


@router.get("/")
def now_page(request: Request, viewer: PageViewer, session: SessionDep) -> Response:
    """Who holds what right now; htmx polls this URL for the ``hosts`` block."""
    now = utcnow()
    cards = now_view(session, now=now)
    ctx = {"viewer": viewer, "active": "now", "cards": cards, "now": now, "refresh": REFRESH_SECONDS}
    return page(request, "now.html", ctx, block="hosts")
