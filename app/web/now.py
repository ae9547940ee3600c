"""The home page (``/``): one card per host, one row per device, refreshed by htmx."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.i18n import N_
from app.api.deps import SessionDep
from app.models import utcnow
from app.models.states import DeviceStatus, HostStatus
from app.schemas.host import HostRead
from app.services import devices as device_service
from app.services.devices import DeviceView
from app.web.deps import PageViewer
from app.web.render import page
from app.web.routing import page_router

router = page_router()

REFRESH_SECONDS = 5

DEVICE_BADGES = {
    DeviceStatus.FREE: N_("free"),
    DeviceStatus.RESERVED_IDLE: N_("reserved, idle"),
    DeviceStatus.IN_USE: N_("in use"),
    DeviceStatus.FINDING: N_("finding"),
    DeviceStatus.OCCUPIED_UNLISTED: N_("occupied, unlisted process"),
    DeviceStatus.UNRELIABLE: N_("process data unreliable"),
    DeviceStatus.MONITORING_DOWN: N_("monitoring down"),
    DeviceStatus.STALE: N_("stale agent"),
    DeviceStatus.LOST: N_("lost GPU"),
    DeviceStatus.RETIRED: N_("retired"),
}
HOST_BADGES = {
    HostStatus.OK: N_("agent ok"),
    HostStatus.STALE: N_("stale agent"),
    HostStatus.NEVER: N_("no snapshot yet"),
    HostStatus.DOWN: N_("monitoring down"),
    HostStatus.DEGRADED: N_("monitoring degraded"),
    HostStatus.NO_DRIVER: N_("no NVIDIA driver"),
    HostStatus.MISCONFIGURED: N_("monitoring misconfigured"),
}
# Host policies and process owner states, shown through the catalog (``tr`` in the template).
SHOWN_LABELS = (N_("observe"), N_("notify"), N_("terminate"), N_("exited"), N_("access denied"), N_("not visible"))



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
    """The device's name for people (``GPU 0``, ``GPU 0 · MIG 4``: ``device_service.device_label``);
    ``parents``: the views on the page by device id."""
    parent = parents.get(view.device.parent_id) if view.device.parent_id is not None else None
    return device_service.device_label(view.device, parent.device if parent is not None else None)


HOSTS_PER_PAGE = 25


def now_view(session: Session, *, now: datetime, page_no: int = 1, per_page: int | None = None) -> tuple[list[HostCard], int]:
    """The hosts of page ``page_no`` (``per_page`` hosts, ``None``: all) with their non-retired
    devices, telemetry, processes and holders; and the number of pages."""
    hosts = device_service.list_hosts(session, now=now)
    pages = 1 if not per_page else max(1, -(-len(hosts) // per_page))
    if per_page:
        page_no = min(max(page_no, 1), pages)
        hosts = hosts[(page_no - 1) * per_page : page_no * per_page]
        views = device_service.device_views(session, now=now, host_names=[h.name for h in hosts]) if hosts else []
    else:
        views = device_service.device_views(session, now=now)
    by_id = {v.device.id: v for v in views}
    per_host: dict[str, list[DeviceRow]] = defaultdict(list)
    for v in views:
        per_host[v.host.name].append(DeviceRow(view=v, label=device_label(v, by_id), badge=DEVICE_BADGES.get(v.status, v.status)))
    cards = [HostCard(host=h, badge=HOST_BADGES.get(h.status, h.status), devices=per_host.get(h.name, [])) for h in hosts]
    return cards, pages


@router.get("/")
def now_page(
    request: Request,
    viewer: PageViewer,
    session: SessionDep,
    page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
    show_all: Annotated[bool, Query(alias="all")] = False,
) -> Response:
    """Who holds what right now, 25 hosts a page (``?page=N``; ``?all=1`` for every host);
    htmx polls the same URL for the ``hosts`` block."""
    now = utcnow()
    cards, pages = now_view(session, now=now, page_no=page_no, per_page=None if show_all else HOSTS_PER_PAGE)
    page_no = min(page_no, pages)
    poll_url = "/?all=1" if show_all else (f"/?page={page_no}" if page_no > 1 else "/")
    ctx = {"viewer": viewer, "active": "now", "cards": cards, "now": now, "refresh": REFRESH_SECONDS,
           "page_no": page_no, "pages": pages, "show_all": show_all, "poll_url": poll_url}
    return page(request, "now.html", ctx, block="hosts")
