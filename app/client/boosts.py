"""``gpuroster boost ask|list`` (members) and ``gpuroster admin boost approve|deny`` (admins
and group managers), registered by :func:`register`. They talk to the API with the signed-in
token, like the other members' commands; exit codes as in :data:`app.client.context.EXIT_CODES`
(a decision that lost a race, or a boost past its end, exits 3 naming why)."""

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import typer

from app.client.context import EXIT_CODES, USAGE, Ctx, Fail, command
from app.client.formatting import HelpGroup, as_datetime, fmt_amount, fmt_span, fmt_time, print_json, table
from app.client.units import parse_duration
from app.i18n import gettext as _


def value_text(b: dict) -> str:
    """A boost's value as people read it: ``12h``, ``80 GPU-hours``, ``2 devices``."""
    if b["unit"] == "seconds":
        return fmt_span(b["value"])
    v = b["value"]
    units = {"devices": _("%(n)s devices", n=fmt_amount(v)), "reservations": _("%(n)s reservations", n=fmt_amount(v)),
             "GPU-hours": _("%(n)s GPU-hours", n=fmt_amount(v))}
    return units.get(b["unit"], f"{fmt_amount(v)} {b['unit']}")


def _line(b: dict, ctx: Ctx) -> list[str]:
    decided = f"{b['decided_by']}" + (f": {b['decision_reason']}" if b["decision_reason"] else "") if b["decided_by"] else ""
    return [f"#{b['id']}", _(b["state"]), b["user"], b["limit"], value_text(b), fmt_time(as_datetime(b["end"]), ctx.tz),
            b["reason"], decided]


def _naive(text: str) -> bool:
    try:
        return datetime.fromisoformat(text.strip()).tzinfo is None
    except ValueError:
        return False  # the server names the field


def ask(
    ctx: Ctx,
    limit: Annotated[str, typer.Argument(help="the limit to raise, e.g. max_gpu_hours_week, max_devices")],
    value: Annotated[str, typer.Argument(help="the raised value: a number (devices, GPU-hours) or, for a "
                                              "*_seconds limit, a duration such as 12h")],
    until: Annotated[str, typer.Option("--until", help="last day (YYYY-MM-DD, lab time) or an ISO 8601 instant")],
    reason: Annotated[str, typer.Option("--reason", help="why; shown to whoever decides")],
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Ask for a temporary raise of one of your limits ("deadline mode"); you are told the decision."""
    if limit.endswith("_seconds"):
        try:
            number: float = parse_duration(value, allow_seconds=True).total_seconds()
        except ValueError as e:
            raise Fail(f"value: {e}", USAGE) from None
    else:
        try:
            number = float(value)
        except ValueError:
            raise Fail(f"value: {value!r} is not a number", USAGE) from None
    body: dict[str, Any] = {"limit": limit, "value": number, "end": until, "reason": reason}
    if len(until.strip()) > 10 and _naive(until):
        body["tz"] = ctx.tz.key  # a wall time is read in the lab's zone
    out = ctx.api.create("/boosts", body)
    if as_json:
        print_json(out)
        return
    typer.echo(_("boost #%(id)s %(state)s: %(limit)s to %(value)s until %(end)s", id=out["id"], state=_(out["state"]),
                 limit=out["limit"], value=value_text(out), end=fmt_time(as_datetime(out["end"]), ctx.tz)))


def list_(
    ctx: Ctx,
    state: Annotated[str | None, typer.Option("--state", help="pending, active, expired or denied")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """Your boosts and those you may decide (admins: all; group managers: their groups')."""
    rows = ctx.api.get("/boosts", state=state)
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo(_("no boosts"))
        return
    typer.echo(table([_line(b, ctx) for b in rows], ["ID", _("STATE"), _("USER"), _("LIMIT"), _("VALUE"), _("UNTIL"), _("REASON"), _("DECIDED")]))


def _decide(ctx: Ctx, bid: int, verb: str, reason: str | None) -> None:
    out = ctx.api.post(f"/boosts/{bid}/{verb}", {"reason": reason} if reason else None)
    said = (_("boost #%(id)s %(state)s (approved by %(actor)s); %(user)s was told", id=out["id"], state=_(out["state"]),
                actor=ctx.username, user=out["user"]) if verb == "approve" else
            _("boost #%(id)s %(state)s (denied by %(actor)s); %(user)s was told", id=out["id"], state=_(out["state"]),
              actor=ctx.username, user=out["user"]))
    typer.echo(said)


def approve(
    ctx: Ctx, bid: Annotated[int, typer.Argument(help="boost id")],
    reason: Annotated[str | None, typer.Option("--reason", help="told to the member")] = None,
) -> None:
    """Approve a pending quota boost: it applies at once, until its end."""
    _decide(ctx, bid, "approve", reason)


def deny(
    ctx: Ctx, bid: Annotated[int, typer.Argument(help="boost id")],
    reason: Annotated[str | None, typer.Option("--reason", help="told to the member")] = None,
) -> None:
    """Deny a pending quota boost; the member is told, with the reason."""
    _decide(ctx, bid, "deny", reason)


def register(cli: typer.Typer, admin: typer.Typer) -> None:
    """Add ``boost ask|list`` to ``cli`` and ``boost approve|deny`` to its ``admin`` group."""
    def add(group: typer.Typer, fn: Callable[..., Any], name: str) -> None:
        group.command(name, epilog=EXIT_CODES)(command(fn))

    member = typer.Typer(cls=HelpGroup, help="Quota boosts: ask for a temporary raise of a limit, list yours.", no_args_is_help=True)
    add(member, ask, "ask")
    add(member, list_, "list")
    cli.add_typer(member, name="boost")
    decider = typer.Typer(cls=HelpGroup, help="Decide quota boosts (admins; group managers for their groups).", no_args_is_help=True)
    add(decider, approve, "approve")
    add(decider, deny, "deny")
    admin.add_typer(decider, name="boost")


__all__ = ["register", "value_text"]
