"""``gpuroster keep ID`` (registered by :func:`app.client.commands.register`): answer "keep
it" to a no-show warning or a "still using it?" question; ``gpuroster release ID`` gives the
GPUs back instead. Exit 3 when nothing is asked or the reservation is no longer active (the
server's message says which)."""

from typing import Annotated

import typer

from app.client.context import Ctx, pick
from app.client.formatting import as_datetime, fmt_time
from app.i18n import gettext as _


def keep(
    ctx: Ctx,
    rid: Annotated[int | None, typer.Argument(help="reservation id (default: your active one on this host)")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine")] = None,
) -> None:
    """Keep a reservation you were asked about (no check-in yet, or idle GPUs): it is left alone until its end."""
    r = pick(ctx, rid, host, "keep")
    out = ctx.api.post(f"/reservations/{r['id']}/keep")
    typer.echo(_("#%(id)s kept until %(end)s (%(zone)s)", id=out["id"], end=fmt_time(as_datetime(out["end"]), ctx.tz),
                 zone=ctx.tz.key))


__all__ = ["keep"]
