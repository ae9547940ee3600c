"""Templates and rendering for the pages: one Jinja2 environment, display filters, and
:func:`page`, which renders a whole page or, for htmx, just the block that changes.

Times are shown in the lab's time zone (``settings.timezone``) inside ``<time>`` elements
whose ``datetime`` attribute and ``title`` carry UTC. Telemetry that NVML could not give
(``None``) is shown as "n/a", never as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import Request
from jinja2 import pass_context
from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup
from starlette.responses import Response

from app.timeutil import fmt_duration

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"
NA = "n/a"


def is_htmx(request: Request) -> bool:
    """True for an htmx request that wants a fragment: ``HX-Request``, but neither a boosted
    page load nor a history restore (both replace the whole page)."""
    h = request.headers
    return h.get("hx-request") == "true" and h.get("hx-boosted") != "true" and h.get("hx-history-restore-request") != "true"


def _tz(ctx: Mapping[str, Any]):
    settings = ctx.get("settings")
    return settings.tz if settings is not None else UTC


def _local(dt: datetime, tz, now: datetime | None) -> str:
    try:
        loc = dt.astimezone(tz)
    except OverflowError:  # an open-ended hold ends at the end of year 9999 UTC, past the zone's range
        return "open-ended"
    ref = (now or datetime.now(UTC)).astimezone(tz)
    if loc.date() == ref.date():
        return loc.strftime("%H:%M")
    if loc.year == ref.year:
        return loc.strftime("%a %d %b %H:%M")
    return loc.strftime("%a %d %b %Y %H:%M")


@pass_context
def when(ctx: Mapping[str, Any], dt: datetime | None, *, full: bool = False) -> Markup:
    """``<time>`` in the lab zone with UTC on hover; ``full`` always shows the date."""
    if dt is None:
        return Markup("—")
    tz = _tz(ctx)
    if full:
        try:
            text = dt.astimezone(tz).strftime("%a %d %b %Y %H:%M")
        except OverflowError:
            text = "open-ended"
    else:
        text = _local(dt, tz, ctx.get("now"))
    utc = dt.astimezone(UTC)
    return Markup('<time datetime="{}" title="{} UTC">{}</time>').format(
        utc.isoformat(timespec="seconds").replace("+00:00", "Z"), utc.strftime("%Y-%m-%d %H:%M"), text
    )


@pass_context
def local_input(ctx: Mapping[str, Any], dt: datetime | None) -> str:
    """The value for an ``<input type="datetime-local">`` in the lab zone."""
    if dt is None:
        return ""
    try:
        return dt.astimezone(_tz(ctx)).strftime("%Y-%m-%dT%H:%M")
    except OverflowError:  # past the zone's range (an open-ended hold): the latest wall time it can show
        return "9999-12-31T00:00"


@pass_context
def ago(ctx: Mapping[str, Any], dt: datetime | None) -> str:
    """"12 s ago" / "3h5m ago"; "never" for ``None``."""
    if dt is None:
        return "never"
    now = ctx.get("now") or datetime.now(UTC)
    secs = (now - dt).total_seconds()
    if secs < 0:
        return "in " + fmt_duration(-secs)
    return fmt_duration(secs) + " ago"


def mib(value: float | None) -> str:
    """Memory in MiB as text: ``512 MiB``, ``79.6 GiB``; "n/a" when unknown."""
    if value is None:
        return NA
    if value >= 1024:
        return f"{value / 1024:.1f} GiB"
    return f"{value:.0f} MiB"


def unit(value: float | None, suffix: str, digits: int = 0) -> str:
    """A number with its unit (``73 %``, ``61 °C``); "n/a" when unknown."""
    if value is None:
        return NA
    return f"{value:.{digits}f}{suffix}"


def percent_of(part: float | None, whole: float | None) -> float | None:
    """``part`` as a percentage of ``whole`` (0–100), or ``None`` when either is unknown."""
    if part is None or not whole:
        return None
    return max(0.0, min(100.0, part * 100.0 / whole))


def duration(value: timedelta | float) -> str:
    """A human duration (``4h``, ``1h30m``)."""
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return fmt_duration(secs)


def short_id(value: str | None, n: int = 12) -> str:
    """The first ``n`` characters of an identifier, with an ellipsis when cut."""
    if not value:
        return ""
    return value if len(value) <= n else value[:n] + "…"


def _context(request: Request) -> dict[str, Any]:
    return {"settings": request.app.state.settings}


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR), context_processors=[_context])
templates.env.globals.update(when=when, local_input=local_input, ago=ago)
templates.env.filters.update(mib=mib, unit=unit, duration=duration, short_id=short_id, percent_of=percent_of)
templates.env.trim_blocks = True
templates.env.lstrip_blocks = True


def page(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    block: str | None = None,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Render template ``name``; on an htmx request render only ``block`` (when given).

    Every response carries ``Vary: HX-Request`` because one URL serves page and fragment.
    """
    context.setdefault("now", datetime.now(UTC))
    hdrs = {"Vary": "HX-Request", **(headers or {})}
    if block and is_htmx(request):
        return templates.TemplateResponse(request, name, context, status_code=status, headers=hdrs, block_name=block)
    return templates.TemplateResponse(request, name, context, status_code=status, headers=hdrs)

