"""Quota boosts on the pages: the Usage page (:mod:`app.web.reports`) shows the viewer's limits
and boosts and the form to ask for one (``POST /boosts``); the Approvals page
(:mod:`app.web.approvals`) lists the boosts the viewer may decide (``POST /approvals/boosts/{id}``).
See :mod:`app.services.boosts`."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app import i18n
from app.client.units import parse_duration
from app.config import Settings
from app.errors import InvalidInput
from app.models import utcnow
from app.services import boosts as svc
from app.services import limit_usage
from app.web.deps import Viewer
from app.web.idempotency import new_form_key

FIELDS = ("limit", "value", "end", "reason")


def usage_context(session: Session, *, viewer: Viewer, settings: Settings, locale: str | None = None) -> dict[str, Any]:
    """What the Usage page shows of the viewer's own limits: ``my_limits`` (usage items),
    ``my_boosts`` (pending and active), ``boostable`` limit names and a fresh form key;
    the texts in ``locale`` (the page's language)."""
    now = utcnow()
    with i18n.use_locale(locale):
        u = limit_usage.usage(session, user=viewer.user, now=now, tz=settings.tz)
        return {"my_limits": u["limits"], "my_boosts": [(b, svc.state(b, now), svc.fmt_value(b.limit_name, b.value))
                                                        for b in u["boosts"]],
                "boostable": svc.BOOSTABLE, "boost_form": {f: "" for f in FIELDS}, "idempotency_key": new_form_key()}


def approvals_context(session: Session, *, viewer: Viewer, locale: str | None = None) -> dict[str, Any]:
    """``boosts``: pending boosts the viewer may decide, with their value as text in ``locale``."""
    with i18n.use_locale(locale):
        return {"boosts": [(b, svc.fmt_value(b.limit_name, b.value))
                           for b in svc.to_decide(session, actor=viewer.user, now=utcnow())]}


def form_value(limit_name: str, text: str) -> float:
    """The form's value in the limit's unit: a duration (``12h``) for a ``*_seconds`` limit,
    else a number. Raises InvalidInput naming ``value``."""
    try:
        if limit_name.endswith("_seconds"):
            return parse_duration(text, allow_seconds=True).total_seconds()
        return float(text)
    except ValueError:
        raise InvalidInput(f"value: {text!r} is not " + ("a duration (e.g. 12h, 2d)" if limit_name.endswith("_seconds")
                                                        else "a number"), field="value") from None


__all__ = ["FIELDS", "approvals_context", "form_value", "usage_context"]
