"""One sanitising function per sink that user text reaches outside HTML.

Process names, command lines, reservation notes, user, host and device names are chosen by
lab members (or by whoever starts a process on a GPU host). Jinja2 autoescaping covers the
pages; every other sink has its own function here:

- :func:`chat_text`: Slack and Mattermost webhook messages (markup, mentions, links);
- :func:`email_header`: e-mail header values (a CR/LF would start a new header, and the
  standard library refuses it with ``ValueError``);
- :func:`terminal_text`: terminals (``gpuroster list/status``, the agent's notices);
- :func:`csv_cell`: CSV exports opened in a spreadsheet (formulas).
"""

from __future__ import annotations

import re

from agent.textsafe import terminal_text

__all__ = ["chat_text", "csv_cell", "email_header", "terminal_text"]

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SPACES = re.compile(r"\s+")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def chat_text(text: object, *, limit: int = 300) -> str:
    """``text`` as an inline code span that Slack and Mattermost show literally.

    ``&``, ``<`` and ``>`` are escaped as Slack requires (so ``<!channel>`` and
    ``<http://x|label>`` are text, not a mention or a link); inside a code span neither
    service turns ``@here``, ``*bold*`` or a bare URL into markup. Backticks (which would
    end the span) become ``ˋ``, control characters and line breaks become spaces; at most
    ``limit`` characters of the text are kept. ``None`` is an empty span ``"` `"``.
    """
    s = "" if text is None else str(text)
    s = _SPACES.sub(" ", _CONTROLS.sub(" ", s)).strip()
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "ˋ")
    return f"`{s or ' '}`"


def email_header(text: object, *, limit: int = 200) -> str:
    """``text`` as one line fit for an e-mail header value (Subject, a display name).

    CR, LF and every other control character become spaces and runs of whitespace collapse
    to one, so the value can neither start another header nor be refused by
    :class:`email.message.EmailMessage`; cut to ``limit`` characters.
    """
    s = "" if text is None else str(text)
    s = _SPACES.sub(" ", _CONTROLS.sub(" ", s)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows as text, never runs as a formula.

    Text starting with ``=``, ``+``, ``-``, ``@``, tab, CR or LF gets a leading ``'``
    (OWASP's advice for CSV injection); numbers, dates and ``None`` pass unchanged (the
    ``csv`` module writes ``None`` as an empty cell).
    """
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value
