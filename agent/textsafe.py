"""Text for a terminal: control characters and escape sequences shown, never obeyed.

A process name, a command line, a reservation note or a device name may carry ``ESC ]``
(OSC: retitle the window, ``52`` writes the clipboard), ``ESC [`` (CSI: move the cursor,
erase the screen), C1 controls (``U+009B`` is a one-byte CSI) or bidirectional overrides
that reorder what is shown. :func:`terminal_text` escapes each of them as visible text
(``\\x1b``, ``\\x9b``, ``\\u202e``), so the reader sees what the text contains and the
terminal receives no control at all. It lives in the agent, which imports nothing from the
service; the service's CLI uses the same function through :mod:`app.sanitize`.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the Unicode bidi embeddings/overrides/isolates
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    if c == "\t":
        return " "
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: object, *, keep_newlines: bool = False, limit: int | None = None) -> str:
    """``text`` (``None`` is ``""``; other values through ``str``) safe to print on a terminal.

    Every C0/C1 control character, DEL and bidi control is replaced by a visible escape
    (``"\\x1b"``); a tab becomes a space. With ``keep_newlines`` a ``"\\n"`` stays a line
    break (a ``"\\r"`` is still escaped). ``limit`` cuts the result to that many characters
    (the last one ``…``).
    """
    if text is None:
        return ""
    s = str(text)
    if keep_newlines:
        out = "\n".join(_UNSAFE.sub(_escape, line) for line in s.split("\n"))
    else:
        out = _UNSAFE.sub(_escape, s)
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)] + "…"
    return out
