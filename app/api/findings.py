"""``/api/v1/findings``: what the host agents flagged, with notices and enforcement actions.

Every signed-in member sees every finding (lab transparency, as with reservations: who
occupies which GPU is no secret in a shared lab); notice recipients, which may be e-mail
addresses, are shown to admins and to the finding's own user only.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from app.routes import api_router
from app.api.deps import CurrentUser, SessionDep, SettingsDep
from app.schemas.common import Page
from app.schemas.finding import FindingRead
from app.services import findings as svc
from app.services.filter_names import require_known
from app.timeutil import parse_instant

router = api_router("/findings", tags=["findings"])


@router.get("", response_model=Page[FindingRead], responses={401: {}, 404: {}, 422: {}})
def list_findings(
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    host: Annotated[str | None, Query(max_length=128, description="host name")] = None,
    user_filter: Annotated[str | None, Query(alias="user", max_length=64, description="process owner (unix name)")] = None,
    kind: Annotated[str | None, Query(pattern="^(unreserved|foreign|overrun|idle|unattributed|unknown_uid)$")] = None,
    state: Annotated[str | None, Query(pattern="^(open|notified|terminated|resolved)$")] = None,
    since: Annotated[str | None, Query(max_length=64, description="seen at or after (ISO 8601 with offset)")] = None,
    until: Annotated[str | None, Query(max_length=64, description="first seen before (ISO 8601 with offset)")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Page[FindingRead]:
    """Findings, most recently seen first; ``since``/``until`` select those whose
    ``[first_seen, last_seen]`` overlaps ``[since, until)``. A ``host`` that does not exist is
    404 naming the field."""
    flt = svc.FindingFilter(
        host=host, user=user_filter, kind=kind, state=state,
        since=parse_instant(since, field="since") if since else None,
        until=parse_instant(until, field="until") if until else None,
    )
    limit = min(limit, settings.page_size_max)
    rows, total = svc.list_findings(session, flt=flt, limit=limit, offset=offset)
    if not total:  # (``user`` is a Unix name, which need not be anyone's account: not checked)
        require_known(session, host=host)
    return Page[FindingRead](items=svc.to_reads(session, rows, viewer=user), total=total, limit=limit, offset=offset)


@router.get("/{finding_id}", response_model=FindingRead, responses={401: {}, 404: {}})
def get_finding(finding_id: int, user: CurrentUser, session: SessionDep) -> FindingRead:
    """One finding with its notices and enforcement actions."""
    return svc.to_reads(session, [svc.get_finding(session, finding_id)], viewer=user)[0]
