"""Findings (``/findings``): open and recent findings with offender, device, process,
state and the notices sent about them.

The page reads findings with the enforcement service's own query
(:func:`app.services.findings.list_findings`) and views (:func:`~app.services.findings.to_reads`),
as the JSON API does, so an e-mail address is shown to admins and its owner only (others
see the username, :mod:`app.services.disclosure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.i18n import N_
from app.api.deps import SessionDep
from app.models import User, utcnow
from app.models.states import LIVE_FINDING_STATES
from app.schemas.finding import FindingRead
from app.services import findings as findings_service
from app.services import hosts as host_service
from app.web.deps import PageViewer
from app.web.render import page
from app.web.routing import page_router

router = page_router()

RECENT_DAYS = 7
LIMIT = 500
OPEN_STATES = LIVE_FINDING_STATES
KIND_TEXT = {
    "unreserved": N_("unreserved: no reservation covers the process"),
    "foreign": N_("foreign: the device is reserved by someone else"),
    "overrun": N_("overrun: still running after the reservation ended"),
    "idle": N_("idle: reserved devices stay idle"),
    "unattributed": N_("unattributed: a container whose owner cannot be found (admins are told)"),
    "unknown_uid": N_("unknown uid: a uid no gpuroster user has (admins are told)"),
}


@dataclass
class FindingsView:
    """Open findings (open, notified) and those closed in the last ``RECENT_DAYS`` days."""

    open: list[FindingRead]
    recent: list[FindingRead]


def findings_view(session: Session, *, viewer: User, now: datetime) -> FindingsView:
    """Open findings and recently closed ones (terminated, resolved), most recently seen first."""
    open_rows = []
    for state in OPEN_STATES:
        rows, _ = findings_service.list_findings(
            session, flt=findings_service.FindingFilter(state=state), limit=LIMIT, offset=0
        )
        open_rows.extend(rows)
    open_rows.sort(key=lambda f: (f.last_seen_at, f.id), reverse=True)
    recent, _ = findings_service.list_findings(
        session, flt=findings_service.FindingFilter(since=now - timedelta(days=RECENT_DAYS)), limit=LIMIT, offset=0
    )
    closed = [f for f in recent if f.state not in OPEN_STATES]
    reads = findings_service.to_reads(session, open_rows[:LIMIT] + closed, viewer=viewer)
    n_open = min(len(open_rows), LIMIT)
    return FindingsView(open=reads[:n_open], recent=reads[n_open:])


@router.get("/findings")
def findings_page(request: Request, viewer: PageViewer, session: SessionDep) -> Response:
    """Processes running where their owner holds no covering reservation, and idle reservations."""
    now = utcnow()
    ctx = {
        "viewer": viewer, "active": "findings", "view": findings_view(session, viewer=viewer.user, now=now),
        "now": now, "recent_days": RECENT_DAYS, "kind_text": KIND_TEXT,
        "replay_hosts": host_service.host_names(session)[1],  # findings replayed from captures are marked so
    }
    return page(request, "findings.html", ctx)
