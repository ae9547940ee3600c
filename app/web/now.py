"""The home page (``/``): one card per host, one row per device, refreshed by htmx."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response
from jinja2 import Template
from markupsafe import Markup, escape
from sqlalchemy.orm import Session

from app import i18n
from app.i18n import N_
from app.api.deps import SessionDep
from app.config import Settings
from app.models import utcnow
from app.models.states import DeviceStatus, HostStatus
from app.services import checkin
from app.services import device_names
from app.services import now_state
from app.services import reservations as reservation_service
from app.services.devices import DeviceView
from app.services.lab_holds import HoldsCache
from app.services.now_state import DeviceRowNow, HostNow, NowCache
from app.web.deps import PageViewer
from app.web.render import ago, page, page_locale, splice, templates
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
    """One device on the Now page: its state at the time of the view and how to label it."""

    view: DeviceRowNow
    label: str
    badge: str


@dataclass
class HostCard:
    """One host on the Now page with its devices (MIG instances after their GPU)."""

    host: HostNow
    badge: str
    devices: list[DeviceRow] = field(default_factory=list)


def device_label(view: DeviceView, parents: dict[int, DeviceView]) -> str:
    """The device's name for people (``GPU 0``, ``GPU 0 · MIG 4``: ``device_names.device_label``);
    ``parents``: the views on the page by device id."""
    parent = parents.get(view.device.parent_id) if view.device.parent_id is not None else None
    return device_names.device_label(view.device, parent.device if parent is not None else None)


HOSTS_PER_PAGE = 25


def now_view(session: Session, *, now: datetime, page_no: int = 1, per_page: int | None = None,
             cache: NowCache | None = None, holds: HoldsCache | None = None) -> tuple[list[HostCard], int]:
    """The hosts of page ``page_no`` (``per_page`` hosts, ``None``: all) with their non-retired
    devices, telemetry, processes and holders at ``now`` (UTC); and the number of pages.
    ``cache``: devices of hosts without a new snapshot since the last view are taken from it
    (``None``: everything read afresh); ``holds``: the lab's holders, shared with the device
    list and ``/metrics`` (used with ``cache``; ``None``: holders read for the page's devices)."""
    hosts = now_state.read_hosts(session, now=now)
    pages = 1 if not per_page else max(1, -(-len(hosts) // per_page))
    if cache is not None:
        cache.prune(h.id for h in hosts)
    if per_page:
        page_no = min(max(page_no, 1), pages)
        hosts = hosts[(page_no - 1) * per_page : page_no * per_page]
    lab_holds = None
    if cache is not None:
        lab = now_state.lab_key(session)
        devices = cache.devices(session, hosts, lab)
        if holds is not None:
            lab_holds = holds.read(session, now=now, lab=lab)
    else:
        devices = now_state.read_devices(session, [h.id for h in hosts])
    listed = [d for h in hosts for d in devices.get(h.id, ())]
    host_of = {d.device.id: h.id for h in hosts for d in devices.get(h.id, ())}
    rows = now_state.device_rows(session, devices=listed, host_status={h.id: h.status for h in hosts},
                                 host_of=host_of, now=now, holds=lab_holds)
    per_host: dict[int, list[DeviceRow]] = defaultdict(list)
    for r in rows:
        per_host[host_of[r.state.device.id]].append(DeviceRow(view=r, label=r.state.label,
                                                              badge=DEVICE_BADGES.get(r.status, r.status)))
    cards = [HostCard(host=h, badge=HOST_BADGES.get(h.status, h.status), devices=per_host.get(h.id, [])) for h in hosts]
    return cards, pages


# drawings kept per device between two snapshots of its host (its status, holder or quarantine
# changed, or readers of both languages look at it)
DRAWN_PER_DEVICE = 2 * len(i18n.LANGUAGES)


def device_html(row: DeviceRow, *, template: Template, settings: Settings, now: datetime, locale: str) -> bytes:
    """The ``<article>`` of one device (``_now_device.html``, UTF-8) in ``locale`` (a key of
    :data:`app.i18n.LANGUAGES`), reused from its cached state while its status, holder,
    next reservation and the lab's date stay the same: times print as a clock time today
    and with their date on other days, so the date is part of what is reused; so are the
    open quarantine (read on every view: opening or clearing one draws the device again)
    and the language. ``template``: ``_now_device.html``, looked up once per view by the
    caller (each lookup checks the file's modification time)."""
    v = row.view
    key = (locale, v.status, v.holder, v.next_reservation, v.quarantine, now.astimezone(settings.tz).date())
    drawn = v.state.drawn
    html = drawn.get(key)
    if html is None:
        if len(drawn) >= DRAWN_PER_DEVICE:
            drawn.clear()
        with i18n.use_locale(locale):
            html = template.render(row=row, settings=settings, now=now).encode()
        drawn[key] = html
    return html


# where the drawn head of a host card says how old its last snapshot is, and where the page
# takes the drawn cards; user data cannot hold them: autoescaping turns its "<" into "&lt;"
AGO_MARKER = Markup("<ago/>")
CARDS_MARKER = Markup("<cards/>")


def host_html(card: HostCard, *, template: Template, cache: NowCache, now: datetime, locale: str) -> list[bytes]:
    """The opening of ``card``'s ``<section>`` (``_now_host.html``: the host's head and notes,
    up to its devices) in ``locale``, with the age of its last snapshot at ``now`` (UTC), as
    UTF-8 pieces. The drawing is reused while what it shows stays the same
    (``cache.drawn``); only the age, which changes on every view, is put in afresh.
    ``template``: ``_now_host.html``, looked up once per view by the caller."""
    h = card.host
    key = (locale, h.status, card.badge, bool(card.devices), h.name, h.policy, h.source, h.driver_version,
           h.cuda_version, h.monitoring_message, tuple(h.replay_of or ()), h.suspect, tuple(h.suspect_reasons or ()),
           h.clock_offset_s, h.clock_trouble)
    drawn = cache.drawn(h.id)
    head = drawn.get(key)
    if head is None:
        if len(drawn) >= len(i18n.LANGUAGES):
            drawn.clear()
        with i18n.use_locale(locale):
            text = template.render(card=card, ago_marker=AGO_MARKER)
        before, _, after = text.partition(AGO_MARKER)
        head = drawn[key] = (before.encode(), after.encode())
    with i18n.use_locale(locale):
        age = str(escape(ago({"now": now}, h.last_seen_at))).encode()
    return [head[0], age, head[1]]


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
    cache = request.app.state.now_cache  # the app's caches: built by create_app
    cards, pages = now_view(session, now=now, page_no=page_no, per_page=None if show_all else HOSTS_PER_PAGE,
                            cache=cache,
                            # every host: the lab-wide holders (computed once per change, shared with the
                            # device list and /metrics); a page of 25 hosts reads its own devices' holders
                            holds=request.app.state.holds_cache if show_all else None)
    page_no = min(page_no, pages)
    settings = request.app.state.settings
    locale = page_locale(request, {"viewer": viewer})
    # the cards are drawn from reused UTF-8 pieces and spliced into the rendered page: passed
    # through the template as one string, 1,000 hosts (18 MB) cost more than the rest of the view
    chunks: list[bytes] = []
    host_template = templates.get_template("_now_host.html")
    device_template = templates.get_template("_now_device.html")
    for card in cards:
        chunks += host_html(card, template=host_template, cache=cache, now=now, locale=locale)
        for row in card.devices:
            chunks += (b"\n", device_html(row, template=device_template, settings=settings, now=now, locale=locale))
        chunks.append(b"\n</section>\n")
    poll_url = "/?all=1" if show_all else (f"/?page={page_no}" if page_no > 1 else "/")
    ctx = {"viewer": viewer, "active": "now", "cards": cards, "cards_html": CARDS_MARKER,
           "now": now, "refresh": REFRESH_SECONDS, "page_no": page_no, "pages": pages, "show_all": show_all,
           "poll_url": poll_url,
           # the viewer's reservations waiting for "keep it" / "release now" (outside the polled block)
           "asked": checkin.asked(session, user_id=viewer.user.id, now=now),
           "question_of": lambda r: reservation_service.checkin_question(r, now)}
    return splice(page(request, "now.html", ctx, block="hosts"), CARDS_MARKER, chunks)
