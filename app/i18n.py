"""Languages of the pages, notices and the CLI: English (the source text) and Simplified
Chinese (``zh_CN``), with Babel message catalogs and Babel formatting.

The catalogs are the ``.po`` files under ``app/locale/<locale>/LC_MESSAGES/messages.po``.
They are read directly and compiled in memory on first use (:func:`translations`), so a
checkout, an editable install and the wheel need no build step; the wheel ships the
``.po`` files as package data.

The language of a piece of text is the *current locale*, a context variable set around a
render (:func:`use_locale`): the page renderer sets it from the viewer's stored preference,
else the browser's ``Accept-Language`` (:func:`negotiate`), else English. Text that is
built before the locale is known (a flash notice chosen in a route) is made with
:func:`lazy_gettext` and translated when it is rendered.

Dates, numbers and sizes are formatted with Babel in the lab's time zone
(:func:`format_when`, :func:`format_number`, :func:`format_mib`).
"""

from __future__ import annotations

import gettext as _gettext
import io
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, date, datetime, tzinfo
from functools import lru_cache
from math import copysign
from pathlib import Path
from typing import Any

# Babel is imported by the functions that use it: English text (the source language) needs
# no catalog, so a ``gpuroster`` command in English imports Babel only when it formats a date
# or a number (the command line's start, bench/cli_start.py).

DEFAULT_LOCALE = "en"
# Each offered language with its name in itself (a language list is read by people who may
# not read the current one).
LANGUAGES: dict[str, str] = {"en": "English", "zh_CN": "简体中文"}
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
DOMAIN = "messages"

_current: ContextVar[str] = ContextVar("gpuroster_locale", default=DEFAULT_LOCALE)

# Date patterns (CLDR syntax) per locale and style. The English ones print what the pages
# printed before there were catalogs ("Tue 01 Dec 14:05").
_PATTERNS: dict[str, dict[str, str]] = {
    "en": {"time": "HH:mm", "datetime": "EEE dd MMM HH:mm", "datetime_year": "EEE dd MMM yyyy HH:mm",
           "date_year": "EEE dd MMM yyyy", "weekday_day": "EEE dd", "hour": "HH"},
    "zh_CN": {"time": "HH:mm", "datetime": "M月d日 EEE HH:mm", "datetime_year": "yyyy年M月d日 EEE HH:mm",
              "date_year": "yyyy年M月d日 EEE", "weekday_day": "d日 EEE", "hour": "HH"},
}


def po_path(locale: str) -> Path:
    """The catalog file of ``locale`` (``app/locale/zh_CN/LC_MESSAGES/messages.po``)."""
    return LOCALE_DIR / locale / "LC_MESSAGES" / f"{DOMAIN}.po"


@lru_cache(maxsize=None)
def translations(locale: str) -> _gettext.NullTranslations:
    """The translations of ``locale``, compiled in memory from its ``.po`` file once per process.

    English (the source language) and a locale without a catalog get identity translations.
    Fuzzy entries are left out, as ``msgfmt`` does.
    """
    path = po_path(locale)
    if locale == DEFAULT_LOCALE or not path.is_file():
        return _gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po
    from babel.support import Translations

    with path.open("rb") as fh:
        catalog = read_po(fh, locale=locale, domain=DOMAIN)
    buf = io.BytesIO()
    write_mo(buf, catalog, use_fuzzy=False)
    buf.seek(0)
    return Translations(fp=buf, domain=DOMAIN)


def current_locale() -> str:
    """The locale text is being rendered in now (``"en"`` or ``"zh_CN"``)."""
    return _current.get()


@contextmanager
def use_locale(locale: str | None) -> Iterator[str]:
    """Render in ``locale`` inside the block (an unknown or empty one means English)."""
    loc = locale if locale in LANGUAGES else DEFAULT_LOCALE
    token = _current.set(loc)
    try:
        yield loc
    finally:
        _current.reset(token)


def set_locale(locale: str | None) -> str:
    """Make ``locale`` (unknown: English) current for the rest of this context: the command
    line sets it once at start (:func:`cli_locale`); pages use :func:`use_locale`."""
    loc = locale if locale in LANGUAGES else DEFAULT_LOCALE
    _current.set(loc)
    return loc


def cli_locale(environ: Mapping[str, str]) -> str:
    """The language of the ``gpuroster`` command: ``GPUROSTER_LANG`` (``zh_CN``, ``en``), else
    the POSIX locale variables in their order of precedence (``LC_ALL``, ``LC_MESSAGES``,
    ``LANG``, e.g. ``zh_CN.UTF-8``), else English. ``C``/``POSIX`` mean English."""
    for name in ("GPUROSTER_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        value = (environ.get(name) or "").split(".")[0].split("@")[0]
        if value:
            return negotiate(value.replace("_", "-"))
    return DEFAULT_LOCALE


def gettext(message: str, /, **variables: Any) -> str:
    """``message`` in the current locale, ``%``-formatted with ``variables`` when given."""
    text = translations(_current.get()).gettext(message)
    return text % variables if variables else text


def ngettext(singular: str, plural: str, num: int, /, **variables: Any) -> str:
    """The singular or plural form for ``num`` in the current locale; ``%(num)d`` is filled in."""
    text = translations(_current.get()).ngettext(singular, plural, num)
    return text % {"num": num, **variables}


def pgettext(context: str, message: str, /, **variables: Any) -> str:
    """``message`` as meant in ``context`` (one English word, two Chinese ones: "Now" the page
    and "now" the start time), ``%``-formatted with ``variables`` when given."""
    text = translations(_current.get()).pgettext(context, message)
    return text % variables if variables else text


_ = gettext


class LazyText:
    """A message translated when it is turned into text, in the locale current at that time.

    Routes pick a notice before the page knows its language; the template renders it inside
    :func:`use_locale`. Works with Jinja2 autoescaping (``__html__``) and ``str()``.
    """

    __slots__ = ("message", "variables")

    def __init__(self, message: str, variables: dict[str, Any]) -> None:
        self.message = message
        self.variables = variables

    def __str__(self) -> str:
        return gettext(self.message, **self.variables)

    def __html__(self) -> str:
        import html  # the pages' renderer calls this; the command line never does

        return html.escape(str(self), quote=True)

    def __repr__(self) -> str:
        return f"LazyText({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return str(self) == (str(other) if isinstance(other, LazyText) else other)

    def __hash__(self) -> int:
        return hash(self.message)


def lazy_gettext(message: str, /, **variables: Any) -> LazyText:
    """``message`` (with ``variables``) to be translated when rendered; see :class:`LazyText`."""
    return LazyText(message, variables)


def negotiate(accept_language: str | None, preference: str | None = None) -> str:
    """The locale for a reader: their stored ``preference`` when it is offered, else the first
    offered language of the ``Accept-Language`` header by quality, else English.

    Any Chinese tag (``zh``, ``zh-CN``, ``zh-Hans``, ``zh-TW``) picks ``zh_CN``, the only
    Chinese catalog; ``*`` and unknown languages are skipped.
    """
    if preference in LANGUAGES:
        return preference  # type: ignore[return-value]
    ranked: list[tuple[float, int, str]] = []
    for pos, part in enumerate((accept_language or "").split(",")[:32]):
        tag, _sep, params = part.strip().partition(";")
        q = 1.0
        for p in params.split(";"):
            name, _eq, value = p.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if tag and q > 0:
            ranked.append((-q, pos, tag.strip().lower()))
    for _q, _pos, tag in sorted(ranked):
        lang = tag.replace("_", "-").split("-")[0]
        if lang == "zh":
            return "zh_CN"
        if lang == "en":
            return "en"
    return DEFAULT_LOCALE


def html_lang(locale: str | None = None) -> str:
    """The BCP 47 tag for ``<html lang>``: ``en``, ``zh-CN``."""
    return (locale or current_locale()).replace("_", "-")


def format_local(dt: datetime, tz: tzinfo, style: str) -> str:
    """An instant in zone ``tz`` in one of the styles of the current locale: ``time``
    (``14:05``), ``datetime`` (``Tue 01 Dec 14:05`` / ``12月1日 周二 14:05``),
    ``datetime_year``, ``date_year``, ``weekday_day`` (``Tue 01``), ``hour`` (``14``).
    Raises OverflowError past the zone's range (year 9999)."""
    from babel.dates import format_datetime as _babel_datetime

    locale = current_locale()
    patterns = _PATTERNS.get(locale, _PATTERNS["en"])
    return _babel_datetime(dt.astimezone(tz), patterns[style], tzinfo=tz, locale=babel_locale(locale))


def format_day(day: date) -> str:
    """A calendar day with its weekday: ``Tue 01 Dec 2026`` / ``2026年12月1日 周二``."""
    from babel.dates import format_date as _babel_date

    locale = current_locale()
    patterns = _PATTERNS.get(locale, _PATTERNS["en"])
    return _babel_date(day, patterns["date_year"], locale=babel_locale(locale))


def format_when(dt: datetime, tz: tzinfo, *, now: datetime | None = None, full: bool = False) -> str:
    """An instant in zone ``tz`` for the current locale: the time alone when it is today
    (relative to ``now``), the date without the year this year, else with it; ``full`` always
    shows the year. Raises OverflowError past the zone's range (year 9999)."""
    if full:
        return format_local(dt, tz, "datetime_year")
    loc = dt.astimezone(tz)
    ref = (now or datetime.now(UTC)).astimezone(tz)
    style = "time" if loc.date() == ref.date() else "datetime" if loc.year == ref.year else "datetime_year"
    return format_local(dt, tz, style)


def when_text(dt: datetime, tz: tzinfo, *, now: datetime | None = None) -> str:
    """:func:`format_when` for text read by people (pages, notices, translated messages):
    "open-ended", translated, for an instant past the zone's range (an open-ended hold ends
    at the end of year 9999 UTC)."""
    try:
        return format_when(dt, tz, now=now)
    except OverflowError:
        return gettext("open-ended")


@lru_cache(maxsize=None)
def babel_locale(locale: str) -> Any:
    """The ``babel.Locale`` of ``locale`` (``"zh_CN"``), parsed once per process.

    Babel's formatting functions accept a locale name and parse it on every call; the Now
    page formats a dozen numbers and times per device, and parsing was about a quarter of
    that work."""
    from babel import Locale

    return Locale.parse(locale)


@lru_cache(maxsize=None)
def _number_pattern(digits: int) -> Any:
    """Babel's parsed ``#,##0.0…`` pattern with ``digits`` decimals (what ``format_decimal``
    would parse on every call)."""
    from babel.numbers import parse_pattern

    return parse_pattern("#,##0" + ("." + "0" * digits if digits > 0 else ""))


def format_number(value: float, digits: int = 0) -> str:
    """``value`` with ``digits`` decimals and the current locale's separators (``1,234.5``):
    ``babel.numbers.format_decimal`` with that pattern, its parsing done once.

    A page shows the same few values again and again (memory sizes of one GPU model, power
    limits, temperatures, utilization), so the texts are kept per value, digits and locale;
    the sign of a zero is part of the key, since babel writes ``-0``."""
    return _formatted(value, digits, current_locale(), copysign(1.0, value) < 0)


@lru_cache(maxsize=8192)
def _formatted(value: float, digits: int, locale: str, negative: bool) -> str:
    return _number_pattern(digits).apply(value, babel_locale(locale))


def format_mib(value: float) -> str:
    """A memory size given in MiB: ``512 MiB``, ``79.6 GiB``, ``1.5 TiB`` (binary units, as
    nvidia-smi reports them), with the current locale's number format."""
    if value >= 1024 * 1024:
        return f"{format_number(value / (1024 * 1024), 1)} TiB"
    if value >= 1024:
        return f"{format_number(value / 1024, 1)} GiB"
    return f"{format_number(value)} MiB"



def N_(message: str) -> str:
    """Mark ``message`` for the catalog without translating it (a label chosen at run time,
    translated where it is shown)."""
    return message


def NC_(context: str, message: str) -> str:  # noqa: N802 - the gettext family's naming
    """Like :func:`N_` for a message meant in ``context`` (shown with ``pgettext``)."""
    return message
