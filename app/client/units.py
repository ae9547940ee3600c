"""Pure parsers for human input: durations (``90m``, ``4h``, ``2d``, ``PT4H``) and memory
sizes (``40G``, ``80GiB``, ``40960``). Standard library only: the CLI and the API's query
parameters share them."""

from __future__ import annotations

import re
from datetime import timedelta

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_ISO = re.compile(
    r"^P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$", re.IGNORECASE
)


def parse_duration(text: str, *, allow_seconds: bool = False) -> timedelta:
    """``90m``, ``4h``, ``1h30m``, ``2d``, ``1w``, ISO 8601 ``PT4H``/``P1D`` (and a plain
    number of seconds when ``allow_seconds``) → a positive timedelta.

    Raises ValueError with a message that shows the accepted forms.
    """
    raw = (text or "").strip()
    if allow_seconds and re.fullmatch(r"\d+(?:\.\d+)?", raw):
        td = timedelta(seconds=float(raw))
    elif raw[:1].upper() == "P":
        m = _ISO.match(raw)
        if not m or raw.upper() in ("P", "PT") or raw.upper().endswith("T"):
            raise ValueError(f"{text!r} is not a duration (e.g. 90m, 4h, 2d, PT4H)")
        parts = {k: float(v) if v else 0.0 for k, v in m.groupdict().items()}
        td = timedelta(weeks=parts["w"], days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    else:
        compact = raw.replace(" ", "")
        pieces = _HUMAN.findall(compact)
        if not pieces or "".join(n + u for n, u in pieces).lower() != compact.lower():
            raise ValueError(f"{text!r} is not a duration (e.g. 90m, 4h, 1h30m, 2d)")
        td = timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in pieces))
    if td <= timedelta(0):
        raise ValueError(f"{text!r}: a duration must be positive")
    return td


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)$", re.IGNORECASE)
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_memory_mib(text: str) -> float:
    """A memory size → MiB. ``G``/``GB`` are decimal gigabytes as in GPU names (``80G`` fits
    an "80GB" card of 81559 MiB), ``GiB`` binary; ``M``, ``MB``, ``MiB``, ``T``… alike; a
    plain number is MiB. Raises ValueError."""
    m = _SIZE.match((text or "").strip())
    if not m:
        raise ValueError(f"{text!r} is not a memory size (e.g. 40G, 80GiB, 24000M)")
    value, prefix, binary, _b = m.groups()
    n = float(value)
    if not prefix:
        if binary:
            raise ValueError(f"{text!r} is not a memory size (e.g. 40G, 80GiB, 24000M)")
        return n
    base = 1024 if binary else 1000
    return n * base ** _POWER[prefix.lower()] / 1024**2
