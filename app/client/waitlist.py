"""``gpuroster wait`` and ``gpuroster waitlist [cancel ID]`` (registered by
:func:`app.client.commands.register`): wait for GPUs, see your entries, withdraw one.
Times are shown in the lab's zone; exit codes as in :data:`app.client.context.EXIT_CODES`
(cancelling an entry that is no longer waiting exits 3 saying what became of it)."""

from typing import Annotated, Any

import typer

from app.client.context import Ctx, busy_notes, duration_option, parse_start, placement_constraints
from app.client.formatting import as_datetime, fmt_span, fmt_time, print_json, reservation_line, table
from app.i18n import gettext as _


def entry_line(e: dict, tz) -> str:
    """``#7 waiting (2nd in line): 2 GPU(s) for 4h within Tue 10:00 – Thu 10:00, book``."""
    what = _("%(n)s GPU(s) for %(length)s", n=e["count"], length=fmt_span(e["duration_seconds"]))
    where = _(" on %(host)s", host=e["host"]) if e.get("host") else ""
    window = f"{fmt_time(as_datetime(e['window_start']), tz)} – {fmt_time(as_datetime(e['window_end']), tz)}"
    state = _(e["state"]) + (_(" (#%(n)s in line)", n=e["position"]) if e.get("position") else "")
    then = {"booked": _(" → reservation #%(id)s", id=e["reservation_id"]),
            "notified": _(" → you were told it is free")}.get(e["state"], "")
    mode = _("book") if e["book"] else _("notify")
    line = _("#%(id)s %(state)s: %(what)s%(where)s within %(window)s, %(mode)s%(then)s", id=e["id"], state=state,
             what=what, where=where, window=window, mode=mode, then=then)
    if e["state"] == "waiting" and e.get("last_refusal"):
        line += "\n  " + _("last try refused: %(reason)s", reason=e["last_refusal"])
    return line


def wait(
    ctx: Ctx,
    duration: Annotated[str, typer.Option("--for", help="how long: 90m, 4h, 2d")],
    within: Annotated[str, typer.Option("--within", help="how long to wait from the start: 12h, 2d")] = "1d",
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=64, help="how many GPUs, on one host")] = 1,
    book: Annotated[bool, typer.Option("--book", help="book them for me when free (default: tell me)")] = False,
    start: Annotated[str, typer.Option(help="window start: now, HH:MM (lab time), 'YYYY-MM-DD HH:MM' or ISO 8601")] = "now",
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    model: Annotated[str | None, typer.Option(help="GPU model contains this, e.g. A100")] = None,
    min_memory: Annotated[str | None, typer.Option(help="per GPU, e.g. 40G, 80GiB, 24000 (MiB)")] = None,
    note: Annotated[str | None, typer.Option(help="note of the booking it makes")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the entry as JSON")] = False,
) -> None:
    """Wait for GPUs: when -n GPUs are free for --for within --within, book them (--book) or tell you.

    Served first come, first served whenever a reservation frees GPUs; if free already, at once.
    """
    length = duration_option(duration, "--for")
    window = duration_option(within, "--within")
    start_value, tz = parse_start(start, ctx.tz)
    body: dict[str, Any] = {"count": count, "duration": int(length.total_seconds()),
                            "within": int(window.total_seconds()), "book": book, "host": host, "note": note,
                            "start": "now" if start_value == "asap" else start_value, "tz": tz}
    body["constraints"] = placement_constraints(model, min_memory)
    e = ctx.api.create("/waitlist", {k: v for k, v in body.items() if v is not None})
    if as_json:
        print_json(e)
        return
    typer.echo(entry_line(e, ctx.tz))
    if e["state"] == "booked":  # what was booked, as reserve says it: host, GPUs, interval, and who else runs there
        r = ctx.api.get(f"/reservations/{e['reservation_id']}")
        typer.echo(_("reserved %(reservation)s", reservation=reservation_line(r, ctx.tz)))
        for line in busy_notes(ctx, r):
            typer.echo(line)
        typer.echo(_("booked at once: gpuroster list   or   gpuroster run --id %(id)s -- <command>", id=e["reservation_id"]))


GROUP_HELP = "Your waitlist entries (admins: --everyone); 'gpuroster waitlist cancel ID' withdraws one."


def list_entries(
    ctx: Ctx,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include booked, told, cancelled and expired ones")] = False,
    everyone: Annotated[bool, typer.Option(help="admins: the whole lab's")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Your waiting entries with their place in line (--all: with what became of the others)."""
    rows = ctx.api.get("/waitlist", **({} if everyone else {"user": ctx.username}))
    if not all_:
        rows = [e for e in rows if e["state"] == "waiting"]
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo(_("no waitlist entries") if all_ else _("nothing waiting (see --all)"))
        return
    if everyone:
        typer.echo(table([[f"#{e['id']}", e["user"], _(e["state"]), str(e["count"]), fmt_span(e["duration_seconds"]),
                           fmt_time(as_datetime(e["window_end"]), ctx.tz)] for e in rows],
                         ["ID", _("USER"), _("STATE"), "GPUS", _("FOR"), _("UNTIL")]))
        return
    for e in rows:
        typer.echo(entry_line(e, ctx.tz))


def cancel(ctx: Ctx, entry_id: Annotated[int, typer.Argument(help="waitlist entry id")]) -> None:
    """Withdraw a waiting entry."""
    e = ctx.api.delete(f"/waitlist/{entry_id}")
    typer.echo(f"#{e['id']} {_(e['state'])}")


__all__ = ["GROUP_HELP", "cancel", "entry_line", "list_entries", "wait"]
