"""The message catalogs and Babel formatting (:mod:`app.i18n`): the Chinese catalog translates
every message the code, the templates and the CLI use, with the same placeholders; the reader's
language is negotiated from a stored preference, ``Accept-Language`` or the locale variables;
dates, numbers, sizes and durations come out in the reader's format in the lab's zone."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.pofile import read_po

from app import i18n
from app.timeutil import fmt_duration
from tests.conftest import REPO

KEYWORDS = {"_": None, "gettext": None, "ngettext": (1, 2), "pgettext": ((1, "c"), 2), "lazy_gettext": None,
            "_l": None, "N_": None, "NC_": ((1, "c"), 2)}
BERLIN = ZoneInfo("Europe/Berlin")


def extracted_messages() -> set[tuple[str | None, str]]:
    """Every ``(context, message id)`` the code and the templates mark, as ``pybabel extract
    -F babel.cfg`` finds them."""
    with (REPO / "babel.cfg").open() as fh:
        method_map, options_map = parse_mapping_cfg(fh)
    found = set()
    for _file, _line, message, _comments, context in extract_from_dir(
            str(REPO), method_map, options_map, keywords=KEYWORDS, strip_comment_tags=True):
        found.add((context, message if isinstance(message, str) else message[0]))
    return found


def zh_catalog():
    with i18n.po_path("zh_CN").open("rb") as fh:
        return read_po(fh, locale="zh_CN")


def test_every_marked_message_has_a_chinese_translation():
    catalog = zh_catalog()
    translated = {(m.context, m.id if isinstance(m.id, str) else m.id[0]) for m in catalog
                  if m.id and m.string and "fuzzy" not in m.flags}
    used = extracted_messages()
    assert len(used) > 400  # pages, notices and CLI
    assert sorted(used - translated) == []


def test_translations_keep_their_placeholders():
    assert [(m.id, str(e)) for m, e in zh_catalog().check()] == []


def test_the_catalog_is_read_without_a_build_step():
    assert i18n.translations("zh_CN").gettext("Sign in") == "登录"
    assert i18n.translations("en").gettext("Sign in") == "Sign in"
    with i18n.use_locale("zh_CN"):
        assert i18n.gettext("Reservation #%(id)s", id=7) == "预约 #7"
        assert str(i18n.lazy_gettext("Token revoked.")) == "令牌已吊销。"
    assert i18n.gettext("Reservation #%(id)s", id=7) == "Reservation #7"


def test_lazy_text_is_translated_when_rendered_and_escaped_in_html():
    text = i18n.lazy_gettext("there is no page at %(path)s", path="/<x>")
    with i18n.use_locale("zh_CN"):
        assert text.__html__() == "/&lt;x&gt; 处没有页面"
    assert str(text) == "there is no page at /<x>"


@pytest.mark.parametrize(("header", "preference", "expected"), [
    (None, None, "en"),
    ("zh-CN,zh;q=0.9,en;q=0.8", None, "zh_CN"),
    ("en-US,en;q=0.9,zh;q=0.8", None, "en"),
    ("fr-FR,zh-TW;q=0.8,en;q=0.5", None, "zh_CN"),  # French is not offered: the next choice
    ("en;q=0.2,zh-Hans;q=0.9", None, "zh_CN"),  # quality, not position, decides
    ("de, *;q=0.5", None, "en"),
    ("zh-CN", "en", "en"),  # the stored preference wins over the browser
    ("en", "zh_CN", "zh_CN"),
    ("en", "xx", "en"),  # an unknown stored value is ignored
    ("zh;q=bogus", None, "en"),
])
def test_language_from_preference_then_accept_language_then_english(header, preference, expected):
    assert i18n.negotiate(header, preference) == expected


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "en"),
    ({"LANG": "zh_CN.UTF-8"}, "zh_CN"),
    ({"LANG": "zh_CN.UTF-8", "LC_ALL": "C.UTF-8"}, "en"),  # LC_ALL overrides LANG
    ({"LC_MESSAGES": "zh_TW.UTF-8", "LANG": "en_US.UTF-8"}, "zh_CN"),
    ({"GPUROSTER_LANG": "en", "LANG": "zh_CN.UTF-8"}, "en"),
])
def test_cli_language_from_the_environment(environ, expected):
    assert i18n.cli_locale(environ) == expected


def test_dates_in_the_lab_zone_per_language():
    t = datetime(2026, 12, 1, 13, 5, tzinfo=UTC)  # 14:05 in Berlin
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert i18n.format_when(t, BERLIN, now=now) == "Tue 01 Dec 14:05"
    assert i18n.format_when(t, BERLIN, full=True) == "Tue 01 Dec 2026 14:05"
    assert i18n.format_when(t, BERLIN, now=t) == "14:05"
    assert i18n.format_day(date(2026, 12, 1)) == "Tue 01 Dec 2026"
    with i18n.use_locale("zh_CN"):
        assert i18n.format_when(t, BERLIN, now=now) == "12月1日 周二 14:05"
        assert i18n.format_when(t, BERLIN, full=True) == "2026年12月1日 周二 14:05"
        assert i18n.format_when(t, BERLIN, now=datetime(2025, 1, 1, tzinfo=UTC)) == "2026年12月1日 周二 14:05"
        assert i18n.format_local(t, BERLIN, "weekday_day") == "1日 周二"
        assert i18n.format_day(date(2026, 12, 1)) == "2026年12月1日 周二"
        assert i18n.pgettext("start", "Now") == "现在" and i18n.gettext("Now") == "现状"  # one word, two meanings


def test_numbers_sizes_and_durations_per_language():
    assert i18n.format_mib(512) == "512 MiB"
    assert i18n.format_mib(81920) == "80.0 GiB"
    assert i18n.format_mib(3 * 1024 * 1024) == "3.0 TiB"
    assert i18n.format_number(12345.678, 1) == "12,345.7"
    assert fmt_duration(5400) == "1h30m" and fmt_duration(45) == "45s" and fmt_duration(2 * 86400 + 3 * 3600) == "2d3h"
    with i18n.use_locale("zh_CN"):
        assert i18n.format_mib(81920) == "80.0 GiB"
        assert i18n.format_number(12345.678, 1) == "12,345.7"
        assert fmt_duration(5400) == "1小时30分" and fmt_duration(45) == "45秒"
        assert fmt_duration(2 * 86400 + 3 * 3600) == "2天3小时"


@pytest.mark.parametrize("locale", sorted(i18n.LANGUAGES))
def test_format_number_is_babels_format_decimal(locale):
    """The parsed locale and pattern are kept between calls; the text is babel's own."""
    from babel.numbers import format_decimal

    values = [0, -0.0, 1, -1, 0.5, 1.5, 2.5, 2.675, 99.95, 1e-9, 123456.789, -98765.4321, 10**12, 81559, 143771.0]
    with i18n.use_locale(locale):
        for digits in (0, 1, 2):
            pattern = "#,##0" + ("." + "0" * digits if digits else "")
            assert [i18n.format_number(v, digits) for v in values] == [
                format_decimal(v, format=pattern, locale=locale) for v in values]


def test_templates_translate_fill_in_and_escape():
    from app.web.render import templates

    t = templates.env.from_string(
        '{% trans count=n, host=h %}{{ count }} device on {{ host }}{% pluralize %}{{ count }} devices on {{ host }}'
        '{% endtrans %}|{{ _("Reservation #%(id)s", id=i) }}|{{ pgettext("start", "Now") }}|{{ tr("ok") }}')
    assert t.render(n=3, h="<b>", i=7) == "3 devices on &lt;b&gt;|Reservation #7|Now|ok"
    with i18n.use_locale("zh_CN"):
        assert t.render(n=1, h="node-01", i="<7>") == "1 device on node-01|预约 #&lt;7&gt;|现在|ok"
