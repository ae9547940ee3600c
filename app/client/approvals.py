"""``gpuroster approvals``, ``approve``, ``deny`` and ``maintenance`` (registered by
:func:`app.client.commands.register`). Exit codes as in :data:`app.client.context.EXIT_CODES`:
a decision that lost a race (no longer pending) and a maintenance that meets reservations
without ``--override`` exit 3 with the server's message naming them."""

from typing import Annotated

import typer

from app.i18n import gettext as _
from app.client.context import Ctx
from app.client.formatting import as_datetime, fmt_time, print_json, reservation_line


def approvals(
    ctx: Ctx, as_json: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """Pending reservations you may approve or deny (admins: all; group managers: their groups')."""
    rows = ctx.api.get("/approvals")
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo(_("nothing awaits your approval"))
    for r in rows:
        typer.echo(_("%(reservation)s by %(user)s", reservation=reservation_line(r, ctx.tz), user=r["user"]))


def _decide(ctx: Ctx, rid: int, verb: str, reason: str | None) -> None:
    out = ctx.api.post(f"/reservations/{rid}/{verb}", {"reason": reason} if reason else None)
    done = _("approved by %(user)s", user=ctx.username) if verb == "approve" else _("denied by %(user)s", user=ctx.username)
    typer.echo(f"#{out['id']} {_(out['state'])} ({done})")


def approve(
    ctx: Ctx, rid: Annotated[int, typer.Argument(help="pending reservation id")],
    reason: Annotated[str | None, typer.Option("--reason", help="told to the requester")] = None,
) -> None:
    """Approve a pending reservation; its owner is told."""
    _decide(ctx, rid, "approve", reason)


def deny(
    ctx: Ctx, rid: Annotated[int, typer.Argument(help="pending reservation id")],
    reason: Annotated[str | None, typer.Option("--reason", help="told to the requester")] = None,
) -> None:
    """Deny a pending reservation (its GPUs are freed); its owner is told, with the reason."""
    _decide(ctx, rid, "deny", reason)


def maintenance(
    ctx: Ctx, host: Annotated[str, typer.Argument(help="host name")],
    reason: Annotated[str, typer.Option("--reason", help="told to every holder it overrides")],
    devices: Annotated[list[str] | None, typer.Option("--device", help="UUID or index (repeat); default all")] = None,
    start: Annotated[str, typer.Option("--start", help="ISO 8601 with offset, or now")] = "now",
    end: Annotated[str | None, typer.Option("--end", help="ISO 8601 with offset; default: until you end it")] = None,
    override: Annotated[bool, typer.Option("--override", help="shorten or cancel conflicting reservations")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Admins: hold a host (or some GPUs) for maintenance; end it with ``gpuroster release ID``."""
    body: dict = {"host": host, "reason": reason, "start": start, "override": override}
    if devices:
        body["devices"] = devices
    if end:
        body["end"] = end
    out = ctx.api.create("/maintenance", body)
    if as_json:
        print_json(out)
        return
    m = out["maintenance"]
    typer.echo(reservation_line(m, ctx.tz) + (" " + _("(open-ended)") if m["end"].startswith("9999") else ""))
    for o in out["overridden"]:
        typer.echo("  " + _("#%(id)s of %(user)s %(action)s", id=o["id"], user=o["user"], action=_(o["action"]))
                   + (" " + _("(now ends %(end)s)", end=fmt_time(as_datetime(o["end"]), ctx.tz)) if o["action"] == "shortened" else ""))


__all__ = ["approvals", "approve", "deny", "maintenance"]
