"""The templates' ``_()`` remembers translations per language: every message of the catalog
comes out exactly as Jinja's own ``_()`` gives it, in each language, whatever the order of
the languages asked; a message with variables is formatted (and escaped) afresh each time."""

from __future__ import annotations

from babel.messages.pofile import read_po

from app import i18n
from app.web import render

ENV = render.templates.env
OURS = ENV.from_string("{{ _(m) }}")
JINJAS = ENV.from_string("{{ jinja_gettext(m) }}", globals={"jinja_gettext": render._jinja_gettext})


def _messages() -> list[str]:
    """The catalog's messages without variables (what ``_()`` may remember)."""
    path = render.TEMPLATES_DIR.parent / "locale" / "zh_CN" / "LC_MESSAGES" / "messages.po"
    with path.open("rb") as fh:
        catalog = read_po(fh)
    return [m.id for m in catalog if m.id and isinstance(m.id, str) and "%(" not in m.id]


def test_every_message_in_both_languages_in_any_order_is_jinjas_own():
    messages = _messages()
    assert len(messages) > 300
    for locale in ("en", "zh_CN", "en", "zh_CN"):  # remembered in one language, asked in the other
        with i18n.use_locale(locale):
            for m in messages:
                assert OURS.render(m=m) == JINJAS.render(m=m), (locale, m)
    with i18n.use_locale("zh_CN"):
        assert OURS.render(m="Book devices") == "预订设备"
    with i18n.use_locale("en"):
        assert OURS.render(m="Book devices") == "Book devices"


def test_a_message_with_variables_is_formatted_and_escaped_each_time():
    t = ENV.from_string('{{ _("Updated %(updated)s · refreshes every %(refresh)s s", updated=u, refresh=r) }}')
    with i18n.use_locale("en"):
        assert t.render(u="<b>", r=5) == "Updated &lt;b&gt; · refreshes every 5 s"
        assert t.render(u="12:00", r=7) == "Updated 12:00 · refreshes every 7 s"
    with i18n.use_locale("zh_CN"):
        assert t.render(u="12:00", r=7) == "更新于 12:00 · 每 7 秒刷新"
