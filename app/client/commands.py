"""The lab members' commands of ``gpuroster`` (registered on the server CLI by :func:`register`).

``login`` once, then ``reserve``, ``list``, ``cancel``, ``release``, ``extend``, ``status``,
``env``, ``run``, ``usage`` and ``keep``. Listings take ``--json``. Times are shown in the lab's time
zone. Exit codes are listed in :data:`EXIT_CODES` (and in ``--help``).
"""

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from app.i18n import gettext as _
from app.client import config as client_config
from app.client.context import (EXIT_CODES, USAGE, Ctx, Fail, busy_notes, command, duration_option, parse_start, pick,
                                requested_start, reservation_body)
from app.client.formatting import (HelpGroup, as_datetime, devices_text, fmt_amount, fmt_span, fmt_time, gib, print_json,
                                   reservation_line, table)
from app.client.run import docker_args, run

# ---------------------------------------------------------------------------- commands


def login(
    ctx: Ctx,
    server: Annotated[str | None, typer.Option(help="the service's URL, e.g. https://gpus.lab.example")] = None,
    token: Annotated[str | None, typer.Option(help="use this API token instead of a password")] = None,
    username: Annotated[str | None, typer.Option("--username", "-u", help="default: your login name")] = None,
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from standard input")] = False,
) -> None:
    """Sign in once: stores the server URL and an API token (mode 0600) under ~/.config/gpuroster/."""
    url = (server or ctx.cfg.server or "").rstrip("/")
    if not url:
        raise Fail(_("--server: give the service's URL"), USAGE)
    if not url.startswith(("http://", "https://")):
        raise Fail(_("--server: %(url)r must start with http:// or https://", url=url), USAGE)
    # imported here, as by every command that needs them: --help and the other commands do not
    import getpass
    import socket

    from app.client.api import Api

    if token is None:
        user = username or typer.prompt("Username", default=getpass.getuser())
        if password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = typer.prompt("Password", hide_input=True)
        anon = Api(url)
        try:
            created = anon.post("/auth/token", {"username": user, "password": password, "name": f"cli@{socket.gethostname()}"[:128]})
        finally:
            anon.close()
        token = created["token"]
    api = Api(url, token)
    try:
        me = api.get("/me")
        tz = api.get("/me/usage")["timezone"]
    finally:
        api.close()
    path = client_config.save(client_config.ClientConfig(server=url, token=token, username=me["username"], timezone=tz))
    typer.echo(_("signed in to %(url)s as %(user)s (lab time zone %(tz)s); token stored in %(path)s",
                 url=url, user=me["username"], tz=tz, path=path))


def reserve(
    ctx: Ctx,
    duration: Annotated[str, typer.Option("--for", help="how long: 90m, 4h, 2d")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=64, help="how many GPUs")] = 1,
    start: Annotated[str, typer.Option(help="asap, HH:MM (the next one, lab time), 'YYYY-MM-DD HH:MM' or ISO 8601")] = "asap",
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    model: Annotated[str | None, typer.Option(help="GPU model contains this, e.g. A100")] = None,
    min_memory: Annotated[str | None, typer.Option(help="per GPU, e.g. 40G (decimal, as in GPU names), 80GiB, 24000 (MiB)")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", "-d", help="these devices (UUID or index; needs --host) instead of -n")] = None,
    note: Annotated[str | None, typer.Option(help="shown to the lab")] = None,
    share: Annotated[list[str] | None, typer.Option(help="share with a user or group:<name> (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the reservation as JSON")] = False,
) -> None:
    """Reserve GPUs.

    With -n the server picks the GPUs and the earliest start at which they are free throughout.

    It prefers idle GPUs, GPUs close together and the tightest fit; with -d you name the GPUs.
    """
    body = reservation_body(ctx, duration=duration, count=count, start=start, host=host, model=model,
                             min_memory=min_memory, device=device, note=note, share=share)
    r = ctx.api.create("/reservations", body)
    if as_json:
        print_json(r)
        return
    typer.echo(_("reserved %(reservation)s", reservation=reservation_line(r, ctx.tz)))
    wanted = requested_start(body)
    if wanted is not None and as_datetime(r["start"]) > wanted + timedelta(minutes=1):  # type: ignore[operator]
        typer.echo(_("note: %(count)s GPU(s) are free only from %(start)s, not %(wanted)s", count=count,
                     start=fmt_time(as_datetime(r["start"]), ctx.tz), wanted=fmt_time(wanted, ctx.tz)))
    for line in busy_notes(ctx, r):
        typer.echo(line)
    typer.echo(f"CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}")
    typer.echo(_("on %(host)s: eval \"$(gpuroster env)\"   or   gpuroster run --id %(id)s -- <command>", host=r["host"], id=r["id"]))



def list_(
    ctx: Ctx,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include ended, cancelled and released ones")] = False,
    user: Annotated[str | None, typer.Option(help="someone else's (default: yours)")] = None,
    everyone: Annotated[bool, typer.Option(help="the whole lab's")] = False,
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Your reservations that are active or upcoming (--all: with history)."""
    if everyone and user is not None:
        raise Fail(_("--user or --everyone, not both"), USAGE)
    who = None if everyone else (user or ctx.username)
    now = datetime.now(UTC)
    items: list[dict] = []
    offset = 0
    while True:
        page = ctx.api.get("/reservations", user=who, host=host, limit=500, offset=offset,
                           **({} if all_ else {"from": now.isoformat()}))
        items += page["items"]
        offset += len(page["items"])
        if offset >= page["total"] or not page["items"]:
            break
    if not all_:
        items = [r for r in items if r["state"] in ("active", "upcoming")]
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo(_("no reservations") if all_ else _("no reservations (active or upcoming; --all for history)"))
        return
    tz = ctx.tz
    rows = [[f"#{r['id']}", _(r["state"]), r["user"], r["host"], devices_text(r), fmt_time(as_datetime(r["start"]), tz, now),
             fmt_time(as_datetime(r["end"]), tz, now), (r.get("note") or "")[:40]] for r in items]
    typer.echo(table(rows, [_("ID"), _("STATE"), _("USER"), _("HOST"), "GPU", _("START"), _("END"), _("NOTE")]))
    typer.echo(_("times in %(zone)s", zone=tz.key))


def cancel(
    ctx: Ctx,
    ids: Annotated[list[int], typer.Argument(help="reservation ids (with --series: series ids)")],
    series: Annotated[bool, typer.Option("--series", help="cancel whole recurring series")] = False,
) -> None:
    """Cancel reservations (an active one is released: it ends now). The history is kept."""
    for rid in ids:
        if series:
            s = ctx.api.delete(f"/series/{rid}")
            typer.echo(_("series #%(id)s: cancelled %(count)s occurrence(s)", id=rid, count=s["cancelled"]) +
                       (_("; kept %(ids)s", ids=", ".join("#" + str(k) for k in s["kept"])) if s["kept"] else ""))
        else:
            r = ctx.api.delete(f"/reservations/{rid}")
            typer.echo(f"#{r['id']} {_(r['state'])}")


def release(
    ctx: Ctx,
    rid: Annotated[int | None, typer.Argument(help="reservation id (default: your active one on this host)")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine")] = None,
) -> None:
    """Give GPUs back now: the reservation ends now (an upcoming one is cancelled)."""
    r = pick(ctx, rid, host, "release")
    out = ctx.api.post(f"/reservations/{r['id']}/release")
    typer.echo(_("#%(id)s %(state)s at %(end)s", id=out["id"], state=_(out["state"]), end=fmt_time(as_datetime(out["end"]), ctx.tz)))


def extend(
    ctx: Ctx,
    by: Annotated[str, typer.Option("--by", help="how much longer: 30m, 1h, 1d")],
    rid: Annotated[int | None, typer.Argument(help="reservation id (default: your active one on this host)")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the reservation as JSON")] = False,
) -> None:
    """Extend a reservation.

    Exit 3 when the GPUs are booked after it, exit 4 when a sharing rule refuses.
    """
    more = duration_option(by, "--by")
    r = pick(ctx, rid, host, "extend")
    end = as_datetime(r["end"]) + more  # type: ignore[operator]
    out = ctx.api.patch(f"/reservations/{r['id']}", {"end": end.isoformat()})
    if as_json:
        print_json(out)
    else:
        typer.echo(_("#%(id)s now ends %(end)s (%(zone)s)", id=out["id"], end=fmt_time(as_datetime(out["end"]), ctx.tz), zone=ctx.tz.key))


def status(
    ctx: Ctx,
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """The whole lab like nvidia-smi: GPUs, memory, utilization, holder, until when, what runs."""
    devices = ctx.api.get("/devices", host=host)
    if as_json:
        print_json(devices)
        return
    if not devices:
        typer.echo(_("no GPUs known on %(host)s", host=host) if host else _("no GPUs known"))
        return
    tz = ctx.tz
    now = datetime.now(UTC)
    rows = []
    for d in devices:
        t = d.get("telemetry") or {}
        mem = f"{gib(t.get('memory_used_mib'))}/{gib(d.get('memory_total_mib'))}"
        util = "-" if t.get("utilization_gpu") is None else f"{t['utilization_gpu']:.0f}%"
        holder = d.get("holder")
        nxt = d.get("next_reservation")
        who = holder["user"] if holder else (_("(open)") if d.get("is_open") else "")
        until = fmt_time(as_datetime(holder["end"]), tz, now) if holder else ""
        if nxt and not holder:
            until = _("next %(user)s %(start)s", user=nxt["user"], start=fmt_time(as_datetime(nxt["start"]), tz, now))
        procs = " ".join(f"{_owner_text(p)}:{p.get('name') or p['pid']}({p['pid']})"
                         + (f" {gib(p['used_memory_mib'])}" if p.get("used_memory_mib") else "")
                         for p in d.get("processes", []))
        data = t.get("process_data") or "ok"
        if data in ("unlisted", "defunct"):
            who_was = _(", last seen: %(owner)s", owner=t["last_owner"]) if t.get("last_owner") else ""
            what = _("defunct (zombie) process") if data == "defunct" else _("unlisted process")
            procs = (f"[{what}{who_was}] " + procs).strip()
        elif data == "unreliable":
            procs = ("[" + _("process data unreliable") + "] " + procs).strip()
        if d.get("quarantine"):
            procs = ("[" + _("quarantined: %(reason)s", reason=d["quarantine"]["reason"]) + "] " + procs).strip()
        gpu = d["label"].removeprefix("GPU ")  # the column says GPU already
        if d.get("mig_profile"):
            gpu += f" {d['mig_profile']}"
        rows.append([d["host"], gpu, (d.get("name") or "?").replace("NVIDIA ", ""), mem, util, _(d["status"]), who, until, procs])
    typer.echo(table(rows, [_("HOST"), "GPU", _("MODEL"), _("MEMORY"), _("UTIL"), _("STATUS"), _("HOLDER"), _("UNTIL"),
                            _("PROCESSES")]))
    for h in ctx.api.get("/hosts"):
        if host and h["name"] != host:
            continue
        if h.get("source") == "replay":
            typer.echo(_("%(host)s: replay of %(captures)s (recorded captures, not live GPUs)", host=h["name"],
                         captures=", ".join(h.get("replay_of") or []) or "?"))
        offset = h.get("clock_offset_s")
        if offset is not None and abs(offset) > 2:
            msg = (_("%(host)s: host clock %(s).1f s behind the service's", host=h["name"], s=abs(offset)) if offset > 0
                   else _("%(host)s: host clock %(s).1f s ahead of the service's", host=h["name"], s=abs(offset)))
            typer.echo(msg)
        if h.get("clock_trouble"):
            typer.echo(_("%(host)s: clock trouble: %(trouble)s", host=h["name"], trouble=h["clock_trouble"]))
    typer.echo(_("times in %(zone)s", zone=tz.key))


def _owner_text(p: dict) -> str:
    """A process's owner for the status table; an owner nobody can name is said so."""
    if p.get("owner_status") == "unattributed":
        return "[unattributed container]"
    if p.get("owner_status") == "uid_only":
        return f"[{p.get('owner') or 'uid ' + str(p.get('uid'))}]"
    return p.get("unix_user") or "?"
def move_device(
    ctx: Ctx,
    uuid: Annotated[str, typer.Argument(help="the GPU's UUID (GPU-...)")],
    to: Annotated[str, typer.Option("--to", help="the host it now belongs to")],
) -> None:
    """Admins: register a GPU to another host (it was moved, or a host reported it: see conflicts)."""
    d = ctx.api.post(f"/devices/{uuid}/move", {"host": to})
    typer.echo(_("%(uuid)s now belongs to %(host)s", uuid=d["uuid"], host=d["host"]))


def env(
    ctx: Ctx,
    host: Annotated[str | None, typer.Option(help="instead of this machine (socket.gethostname())")] = None,
    rid: Annotated[int | None, typer.Option("--id", help="this reservation instead of your active one")] = None,
    docker: Annotated[bool, typer.Option("--docker", help="print the --gpus value and the owner label for docker run")] = False,
) -> None:
    """Print shell exports for your active reservation on this host.

    Use it as: eval "$(gpuroster env)"

    GPUs are named by UUID and CUDA_DEVICE_ORDER is PCI_BUS_ID: CUDA cannot pick another GPU.
    """
    r = pick(ctx, rid, host, "env")
    uuids = r["cuda_visible_devices"]
    if docker:
        import shlex

        typer.echo(" ".join(shlex.quote(a) for a in docker_args(ctx, uuids)))
        return
    typer.echo(f"export CUDA_VISIBLE_DEVICES={uuids}")
    typer.echo("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    typer.echo(f"export GPUROSTER_RESERVATION_ID={r['id']}")


def usage(
    ctx: Ctx,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Your limits: what applies, what is used and what is left; your pending and active boosts."""
    u = ctx.api.get("/me/usage")
    if as_json:
        print_json(u)
        return
    rows = []
    for item in u["limits"]:
        lim, used, left, unit = item["limit"], item["used"], item["left"], item["unit"]

        def show(v: Any) -> str:
            if v is None:
                return "-"
            if unit == "seconds":
                return fmt_span(v)
            if isinstance(v, list):
                return ", ".join(v)
            return fmt_amount(v) if isinstance(v, (int, float)) else str(v)

        rows.append([item["rule"], "unlimited" if lim is None else show(lim), show(used), show(left),
                     item["scope"] or "", item["detail"]])
    typer.echo(table(rows, [_("LIMIT"), _("VALUE"), _("USED"), _("LEFT"), _("FROM"), _("DETAIL")]))
    from app.client.boosts import value_text

    for b in u.get("boosts", []):
        typer.echo(_("boost #%(id)s %(state)s: %(limit)s to %(value)s until %(end)s (%(reason)s)", id=b["id"],
                     state=b["state"], limit=b["limit"], value=value_text(b),
                     end=fmt_time(as_datetime(b["end"]), ctx.tz), reason=b["reason"]))


# ---------------------------------------------------------------------------- registration


def _unless_subcommand(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A group callback that runs ``fn`` only when no subcommand follows (``gpuroster waitlist``
    lists; ``gpuroster waitlist cancel 7`` cancels)."""
    import functools
    import inspect

    @functools.wraps(fn)
    def callback(typer_ctx: typer.Context, *args: Any, **kwargs: Any) -> Any:
        if typer_ctx.invoked_subcommand is None:
            return fn(*args, **kwargs)
        return None

    sig = inspect.signature(fn)
    callback.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        inspect.Parameter("typer_ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        *sig.parameters.values()])
    return callback


def register(cli: typer.Typer) -> None:
    """Add the lab members' commands to the ``gpuroster`` typer app."""
    def add(fn: Callable[..., Any], name: str, **kw: Any) -> None:
        cli.command(name, epilog=EXIT_CODES, **kw)(command(fn))

    add(login, "login")
    add(reserve, "reserve")
    add(list_, "list")
    add(cancel, "cancel")
    add(release, "release")
    add(extend, "extend")
    add(status, "status")
    add(move_device, "move-device")
    add(env, "env")
    add(run, "run")
    add(usage, "usage")
    from app.client import approvals as approval_commands

    add(approval_commands.approvals, "approvals")
    add(approval_commands.approve, "approve")
    add(approval_commands.deny, "deny")
    add(approval_commands.maintenance, "maintenance")
    from app.client import waitlist as waitlist_commands

    add(waitlist_commands.wait, "wait")
    group = typer.Typer(cls=HelpGroup, help=waitlist_commands.GROUP_HELP)
    group.callback(invoke_without_command=True, epilog=EXIT_CODES)(
        _unless_subcommand(command(waitlist_commands.list_entries)))
    group.command("cancel", epilog=EXIT_CODES)(command(waitlist_commands.cancel))
    cli.add_typer(group, name="waitlist")
    from app.client import checkin as checkin_commands

    add(checkin_commands.keep, "keep")
    if not cli.info.epilog:
        cli.info.epilog = EXIT_CODES


__all__ = ["register", "EXIT_CODES", "parse_start", "fmt_time"]
