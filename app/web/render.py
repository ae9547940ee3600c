"""Templates and rendering for the pages: one Jinja2 environment, display filters, and
:func:`page`, which renders a whole page or, for htmx, just the block that changes.

Times are shown in the lab's time zone (``settings.timezone``) inside ``<time>`` elements
whose ``datetime`` attribute and ``title`` carry UTC. Telemetry that NVML could not give
(``None``) is shown as "n/a", never as 0.

Pages are rendered in the reader's language (:mod:`app.i18n`): the templates use the Jinja2
i18n extension (``{% trans %}``, ``_()``), and dates, numbers and sizes are formatted with
Babel for that language.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import Request
from jinja2 import pass_context
from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup
from starlette.responses import Response

from app import i18n
from app.i18n import N_, NC_, _, lazy_gettext
from app.services.health_rule import local_reason
from app.timeutil import fmt_duration

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"
NA = lazy_gettext("n/a")


def is_htmx(request: Request) -> bool:
    """True for an htmx request that wants a fragment: ``HX-Request``, but neither a boosted
    page load nor a history restore (both replace the whole page)."""
    h = request.headers
    return h.get("hx-request") == "true" and h.get("hx-boosted") != "true" and h.get("hx-history-restore-request") != "true"


def _tz(ctx: Mapping[str, Any]):
    settings = ctx.get("settings")
    return settings.tz if settings is not None else UTC


def _local(dt: datetime, tz, now: datetime | None) -> str:
    return i18n.when_text(dt, tz, now=now)


@pass_context
def when(ctx: Mapping[str, Any], dt: datetime | None, *, full: bool = False) -> Markup:
    """``<time>`` in the lab zone with UTC on hover; ``full`` always shows the date."""
    if dt is None:
        return Markup("—")
    tz = _tz(ctx)
    if full:
        try:
            text = i18n.format_when(dt, tz, full=True)
        except OverflowError:
            text = _("open-ended")
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
    """"12s ago" / "3h5m ago" in the reader's language; "never" for ``None``."""
    if dt is None:
        return _("never")
    now = ctx.get("now") or datetime.now(UTC)
    secs = (now - dt).total_seconds()
    if secs < 0:
        return _("in %(duration)s", duration=fmt_duration(-secs))
    return _("%(duration)s ago", duration=fmt_duration(secs))


def mib(value: float | None) -> str:
    """Memory in MiB as text: ``512 MiB``, ``79.6 GiB``; "n/a" when unknown."""
    if value is None:
        return str(NA)
    return i18n.format_mib(value)


def unit(value: float | None, suffix: str, digits: int = 0) -> str:
    """A number with its unit (``73 %``, ``61 °C``); "n/a" when unknown."""
    if value is None:
        return str(NA)
    return i18n.format_number(value, digits) + suffix


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
    return {"settings": request.app.state.settings, "languages": i18n.LANGUAGES}


def splice(response: Response, marker: str, chunks: Iterable[bytes]) -> Response:
    """``response`` (a rendered page) with the first ``marker`` in its body replaced by
    ``chunks`` (UTF-8), its other headers kept and its length counted again. For a page whose
    bulk is drawn and cached in pieces: they reach the body in one copy, where passing them
    through the template as one string costs each time it is escaped, joined and encoded
    (about 20 ms per pass over 18 MB on a 2-core machine). Raises ``ValueError`` when the
    body has no ``marker``."""
    before, found, after = bytes(response.body).partition(marker.encode())
    if not found:
        raise ValueError(f"{marker!r} is not in the page")
    body = b"".join([before, *chunks, after])
    spliced = Response(body, status_code=response.status_code)
    spliced.raw_headers = [(k, v) for k, v in response.raw_headers if k != b"content-length"]
    spliced.raw_headers.append((b"content-length", str(len(body)).encode()))
    return spliced


def page_locale(request: Request, context: Mapping[str, Any]) -> str:
    """The language of a page: the signed-in viewer's stored preference, else the browser's
    ``Accept-Language``, else English (:func:`app.i18n.negotiate`)."""
    viewer = context.get("viewer")
    preference = getattr(getattr(viewer, "user", None), "language", None)
    return i18n.negotiate(request.headers.get("accept-language"), preference)


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR), context_processors=[_context])
templates.env.add_extension("jinja2.ext.i18n")
def _plural(singular: str, plural: str, num: int) -> str:
    # unformatted: the i18n extension fills in ``num`` and the other variables itself
    return i18n.translations(i18n.current_locale()).ngettext(singular, plural, num)


templates.env.install_gettext_callables(i18n.gettext, _plural, newstyle=True, pgettext=i18n.pgettext)
templates.env.policies["ext.i18n.trimmed"] = True
_jinja_gettext = templates.env.globals["_"]
_translated: dict[tuple[str, str], Any] = {}
_TRANSLATED_MAX = 8192  # (locale, message) pairs: the catalog holds about 700 messages


@pass_context
def _gettext(ctx: Any, message: str, /, **variables: Any) -> Any:
    """The templates' ``_()``: Jinja's own (the message in the current locale, marked safe
    and ``%``-formatted), remembered per locale and message when it has no variables. Jinja
    passes each call through three context calls and a ``Markup`` format, about a fifth of
    drawing a device on the Now page; a message without variables always comes out the same
    in one locale. Templates pass ``_()`` literal messages only (run-time text goes through
    ``tr``), so the catalog bounds what is remembered; :data:`_TRANSLATED_MAX` caps it anyway."""
    if variables or not ctx.eval_ctx.autoescape:
        return _jinja_gettext(ctx, message, **variables)
    key = (i18n.current_locale(), message)
    text = _translated.get(key)
    if text is None:
        text = _jinja_gettext(ctx, message)
        if len(_translated) < _TRANSLATED_MAX:
            _translated[key] = text
    return text


templates.env.globals["_"] = _gettext


def tr(text: Any) -> str:
    """A message chosen at run time (an error title, a state) in the reader's language; text
    without a translation (user data) comes back unchanged. Autoescaped like any value."""
    return _(str(text)) if text is not None else ""


# Values the pages show through ``tr`` (states, kinds, channels, roles), marked for the catalog.
VOCABULARY = (
    N_("confirmed"), N_("cancelled"), N_("released"), N_("pending"), N_("denied"), N_("expired"), N_("active"),
    N_("upcoming"), N_("ended"), N_("unreserved"), N_("foreign"), N_("overrun"), N_("idle"), N_("unattributed"),
    N_("unknown_uid"), N_("open"), N_("notified"), N_("terminated"), N_("resolved"), N_("terminal"), N_("web"),
    N_("email"), N_("webhook"), N_("sent"), N_("sending"), N_("skipped"), N_("failed"), N_("member"), N_("admin"),
    N_("findings"), N_("approvals"), N_("waitlist"), N_("no-shows"), N_("quarantine"), N_("sigterm"), N_("sigkill"),
    N_("waiting"), N_("booked"), N_("approved"), N_("default"),
    # host states (``HostStatus``, underscores shown as spaces), shown with pgettext("host", …)
    NC_("host", "never"), NC_("host", "stale"), NC_("host", "ok"), NC_("host", "degraded"), NC_("host", "down"),
    NC_("host", "no driver"), NC_("host", "misconfigured"),
    # error titles (the classes of app/errors.py and the services' own)
    N_("Error"), N_("Bad request"), N_("Authentication required"), N_("Forbidden"), N_("Not found"), N_("Conflict"),
    N_("Reservation conflict"), N_("Reservation is history"), N_("Invalid input"), N_("Refused by a sharing rule"),
    N_("Request body too large"), N_("Service unavailable"), N_("Sign-in provider unavailable"),
    N_("Single sign-on failed"), N_("Too many sign-in attempts"), N_("Directory unavailable"), N_("Sign-in failed"),
    N_("Form refused"), N_("Not configured"), N_("Method not allowed"),
    # error details that are whole sentences without data (shown with ``tr``; others stay as sent)
    N_("wrong username or password"),
    N_("the sign-in form had no valid security token (cookies off, or it was open too long); try again"),
    N_("the change conflicts with existing data (a duplicate or a referenced row); nothing was saved"),
)


def quarantine_reason(q: Any) -> str:
    """The reason of quarantine ``q`` (a :class:`~app.models.DeviceQuarantine` or a
    :data:`~app.services.quarantined.QuarantineNow`) in the reader's language."""
    conditions = getattr(q, "conditions", None) or getattr(q, "keys", None)
    return local_reason(conditions) if conditions else q.reason


def number(value: float | None, digits: int = 0) -> str:
    """A number with ``digits`` decimals in the reader's format; "n/a" when unknown."""
    return str(NA) if value is None else i18n.format_number(value, digits)


templates.env.globals.update(when=when, local_input=local_input, ago=ago, tr=tr, quarantine_reason=quarantine_reason)
templates.env.filters.update(number=number, day=i18n.format_day)
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
    locale = page_locale(request, context)
    context.setdefault("html_lang", i18n.html_lang(locale))
    # The language depends on the viewer and on Accept-Language; Content-Language names it.
    hdrs = {"Vary": "HX-Request, Accept-Language", "Content-Language": i18n.html_lang(locale), **(headers or {})}
    with i18n.use_locale(locale):  # TemplateResponse renders at once, inside the block
        if block and is_htmx(request):
            return templates.TemplateResponse(request, name, context, status_code=status, headers=hdrs, block_name=block)
        return templates.TemplateResponse(request, name, context, status_code=status, headers=hdrs)

