"""How the member commands print: times in the lab's zone, spans, sizes, tables, JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from app.sanitize import terminal_text

if TYPE_CHECKING:  # only annotations here; the zone comes from the caller (app.client.context)
    from zoneinfo import ZoneInfo


# ---------------------------------------------------------------------------- help


class HelpGroup(TyperGroup):
    """A command group whose plain help lists each command with the whole first paragraph of
    its help, wrapped, as typer's rich layout does; click's own listing cuts it to what fits
    on one line and ends it with "...". (The CLI prints plain help: ``app.cli``.)"""

    def format_commands(self, ctx: typer.Context, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                text = cmd.short_help or (cmd.help or "").split("\n\n")[0]
                rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# ---------------------------------------------------------------------------- formatting


def as_datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def fmt_time(dt: datetime | None, tz: ZoneInfo, now: datetime | None = None) -> str:
    """``14:00`` today, ``Tue 24 Mar 14:00`` another day (year added if not this year)."""
    if dt is None:
        return "-"
    try:
        local = dt.astimezone(tz)
    except OverflowError:  # the end of an open-ended hold (end of year 9999 UTC) is past the zone's range
        return "open-ended"
    ref = (now or datetime.now(UTC)).astimezone(tz)
    if local.date() == ref.date():
        return local.strftime("%H:%M")
    return local.strftime("%a %d %b %H:%M" if local.year == ref.year else "%a %d %b %Y %H:%M")


def fmt_span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m = s // 60
    return (f"{d}d" if d else "") + (f"{h}h" if h else "") + (f"{m}m" if m and not d else "") or f"{s}s"


def fmt_amount(v: float | int) -> str:
    """A count or GPU-hour amount as people read it: at most two decimals, none trailing
    (``9.0063`` -> ``9.01``, ``12.0`` -> ``12``, ``1234567.5`` -> ``1234567.5``)."""
    if isinstance(v, int):
        return str(v)
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}G"


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Aligned columns; every cell through :func:`app.sanitize.terminal_text` (a note or a
    process name can never send an escape sequence to the reader's terminal)."""
    rows = [[terminal_text(c) for c in r] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=False))


def devices_text(r: dict) -> str:
    return ",".join(str(d["index"]) if d.get("index") is not None else d["uuid"] for d in r["devices"])


def reservation_line(r: dict, tz: ZoneInfo) -> str:
    models = sorted({d.get("name") or "?" for d in r["devices"]})
    return terminal_text(f"#{r['id']} {r['state']} on {r['host']}: GPU {devices_text(r)} ({', '.join(models)}) "
                         f"{fmt_time(as_datetime(r['start']), tz)} – {fmt_time(as_datetime(r['end']), tz)} ({tz.key})")
