"""The lab members' commands of ``gpuroster`` (registered on the server CLI by :func:`register`).

``login`` once, then ``reserve``, ``list``, ``cancel``, ``release``, ``extend``, ``status``,
``env``, ``run`` and ``usage``. Listings take ``--json``. Times are shown in the lab's time
zone. Exit codes are listed in :data:`EXIT_CODES` (and in ``--help``).
"""

from __future__ import annotations

import functools
import getpass
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer

from app.client import config as client_config
from app.client.api import Api, ApiError, NotConfigured, Unreachable
from app.client.units import parse_duration, parse_memory_mib

OK, ERROR, USAGE, CONFLICT, REFUSED, UNREACHABLE, AUTH = 0, 1, 2, 3, 4, 5, 6
EXIT_CODES = (
    "Exit codes: 0 ok; 1 other error (not found, server error); 2 bad usage or invalid input; "
    "3 conflict (the devices are reserved); 4 refused (a sharing rule or a permission); "
    "5 server unreachable; 6 not signed in, token rejected or too many sign-in attempts; "
    "run: the command's own exit status (128+N when killed by signal N, 127 when it cannot start)."
)


class Fail(Exception):
    """A message for the user and the exit code to leave with."""

    def __init__(self, message: str, code: int = ERROR) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- context


class Ctx:
    """Configuration, the API client and lazily fetched facts (who am I, lab zone)."""

    def __init__(self) -> None:
        self.cfg = client_config.load()
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            if not self.cfg.server or not self.cfg.token:
                raise NotConfigured("not signed in: run 'gpuroster login --server URL' (or set GPUROSTER_SERVER and GPUROSTER_TOKEN)")
            self._api = Api(self.cfg.server, self.cfg.token)
        return self._api

    @functools.cached_property
    def username(self) -> str:
        return self.cfg.username or self.api.get("/me")["username"]

    @functools.cached_property
    def tz(self) -> ZoneInfo:
        name = self.cfg.timezone or self.api.get("/me/usage")["timezone"]
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            return ZoneInfo("UTC")

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


def _problem_message(e: ApiError) -> str:
    msg = e.detail
    doc = e.doc
    if e.status == 409 and doc.get("occurrences"):
        msg += "".join(f"\n  {o['local_start']}: " + ", ".join(f"#{c['id']} by {c['user']}" for c in o["conflicts"])
                       for o in doc["occurrences"])
    if e.status == 422 and doc.get("errors"):
        msg = "; ".join(f"{x['field']}: {x['message']}" for x in doc["errors"])
    return msg


def _code_for(status: int) -> int:
    if status == 409:
        return CONFLICT
    if status == 403:
        return REFUSED
    if status in (401, 429):
        return AUTH
    if status in (400, 413, 422):
        return USAGE
    return ERROR


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command with a :class:`Ctx`; map failures to a message on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = Ctx()
        try:
            return fn(ctx, *args, **kwargs)
        except ApiError as e:
            typer.echo(f"error: {_problem_message(e)}", err=True)
            raise typer.Exit(_code_for(e.status)) from None
        except Unreachable as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(UNREACHABLE) from None
        except NotConfigured as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(AUTH) from None
        except Fail as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.code) from None
        finally:
            ctx.close()

    # typer reads the signature: hide the injected ctx parameter
    sig = inspect.signature(fn, eval_str=True)
    wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    return wrapper


# ---------------------------------------------------------------------------- formatting


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def fmt_time(dt: datetime | None, tz: ZoneInfo, now: datetime | None = None) -> str:
    """``14:00`` today, ``Tue 24 Mar 14:00`` another day (year added if not this year)."""
    if dt is None:
        return "-"
    local = dt.astimezone(tz)
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


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}G"


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=False))


def _devices_text(r: dict) -> str:
    return ",".join(str(d["index"]) if d.get("index") is not None else d["uuid"] for d in r["devices"])


def _reservation_line(r: dict, tz: ZoneInfo) -> str:
    models = sorted({d.get("name") or "?" for d in r["devices"]})
    return (f"#{r['id']} {r['state']} on {r['host']}: GPU {_devices_text(r)} ({', '.join(models)}) "
            f"{fmt_time(_dt(r['start']), tz)} – {fmt_time(_dt(r['end']), tz)} ({tz.key})")


# ---------------------------------------------------------------------------- input


def _duration(value: str, option: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as e:
        raise Fail(f"{option}: {e}", USAGE) from None


def parse_start(value: str, tz: ZoneInfo, now: datetime | None = None) -> tuple[str, str | None]:
    """``asap``/``now``, ``HH:MM`` (the next such wall time in the lab zone),
    ``YYYY-MM-DD HH:MM`` (lab zone) or ISO 8601 with an offset → (start, tz) for the API."""
    v = value.strip()
    if v.lower() in ("asap", "now"):
        return v.lower(), None
    now = now or datetime.now(UTC)
    try:
        if len(v) <= 5 and ":" in v:
            hh, mm = (int(x) for x in v.split(":"))
            today = now.astimezone(tz).date()
            for day in (today, today + timedelta(days=1)):
                cand = datetime(day.year, day.month, day.day, hh, mm, tzinfo=tz)
                if cand > now:
                    return f"{day.isoformat()}T{hh:02d}:{mm:02d}", tz.key
        dt = datetime.fromisoformat(v.replace(" ", "T", 1) if " " in v else v)
    except ValueError:
        raise Fail(f"--start: {value!r} is not asap, HH:MM, 'YYYY-MM-DD HH:MM' or ISO 8601", USAGE) from None
    if dt.tzinfo is None:
        return dt.isoformat(timespec="minutes"), tz.key
    return dt.isoformat(), None


def _this_host(ctx: Ctx, given: str | None) -> str:
    if given:
        return given
    names = {h["name"] for h in ctx.api.get("/hosts")}
    full = socket.gethostname()
    for cand in (full, full.split(".")[0]):
        if cand in names:
            return cand
    raise Fail(f"this machine ({full}) is not a GPU host known to the server; pass --host")


def _active_on(ctx: Ctx, host: str) -> list[dict]:
    page = ctx.api.get("/reservations", user=ctx.username, host=host, state="active", limit=100)
    return page["items"]


def _pick(ctx: Ctx, rid: int | None, host: str | None, what: str) -> dict:
    """The reservation ``rid``, or the caller's one active reservation on this host."""
    if rid is not None:
        return ctx.api.get(f"/reservations/{rid}")
    h = _this_host(ctx, host)
    active = _active_on(ctx, h)
    if not active:
        raise Fail(f"you hold no active reservation on {h}; give the reservation id to {what}")
    if len(active) > 1:
        ids = ", ".join(f"#{r['id']}" for r in active)
        raise Fail(f"you hold several active reservations on {h} ({ids}); give the id to {what}")
    return active[0]


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
        raise Fail("--server: give the service's URL", USAGE)
    if not url.startswith(("http://", "https://")):
        raise Fail(f"--server: {url!r} must start with http:// or https://", USAGE)
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
    typer.echo(f"signed in to {url} as {me['username']} (lab time zone {tz}); token stored in {path}")


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
    body = _reservation_body(ctx, duration=duration, count=count, start=start, host=host, model=model,
                             min_memory=min_memory, device=device, note=note, share=share)
    r = ctx.api.create("/reservations", body)
    if as_json:
        _print_json(r)
        return
    typer.echo("reserved " + _reservation_line(r, ctx.tz))
    wanted = _requested_start(body)
    if wanted is not None and _dt(r["start"]) > wanted + timedelta(minutes=1):  # type: ignore[operator]
        typer.echo(f"note: {count} GPU(s) are free only from {fmt_time(_dt(r['start']), ctx.tz)}, "
                   f"not {fmt_time(wanted, ctx.tz)}")
    typer.echo(f"CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}")
    typer.echo(f"on {r['host']}: eval \"$(gpuroster env)\"   or   gpuroster run --id {r['id']} -- <command>")


def _requested_start(body: dict) -> datetime | None:
    """The start the user asked for, as an instant (None for asap/now)."""
    start = body.get("start")
    if not start or start in ("asap", "now"):
        return None
    dt = datetime.fromisoformat(start)
    return dt.replace(tzinfo=ZoneInfo(body["tz"])) if dt.tzinfo is None and body.get("tz") else dt


def _reservation_body(ctx: Ctx, *, duration: str, count: int, start: str, host: str | None, model: str | None,
                      min_memory: str | None, device: list[str] | None, note: str | None, share: list[str] | None) -> dict:
    length = _duration(duration, "--for")
    start_value, tz = parse_start(start, ctx.tz)
    body: dict[str, Any] = {"duration": int(length.total_seconds()), "note": note}
    if device:
        if not host:
            raise Fail("--device needs --host", USAGE)
        if model or min_memory:
            raise Fail("--model and --min-memory choose devices; leave them out with --device", USAGE)
        body.update(host=host, devices=[int(d) if d.isdigit() else d for d in device],
                    start="now" if start_value == "asap" else start_value)
    else:
        constraints: dict[str, Any] = {}
        if model:
            constraints["model"] = model
        if min_memory:
            try:
                constraints["min_memory_mib"] = parse_memory_mib(min_memory)
            except ValueError as e:
                raise Fail(f"--min-memory: {e}", USAGE) from None
        body.update(count=count, host=host, constraints=constraints or None,
                    start="asap" if start_value == "now" else start_value)
    if tz:
        body["tz"] = tz
    if share:
        body["share_with"] = share
    return {k: v for k, v in body.items() if v is not None}


def list_(
    ctx: Ctx,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include ended, cancelled and released ones")] = False,
    user: Annotated[str | None, typer.Option(help="someone else's (default: yours)")] = None,
    everyone: Annotated[bool, typer.Option(help="the whole lab's")] = False,
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Your reservations that are active or upcoming (--all: with history)."""
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
        _print_json(items)
        return
    if not items:
        typer.echo("no reservations" + ("" if all_ else " (active or upcoming; --all for history)"))
        return
    tz = ctx.tz
    rows = [[f"#{r['id']}", r["state"], r["user"], r["host"], _devices_text(r), fmt_time(_dt(r["start"]), tz, now),
             fmt_time(_dt(r["end"]), tz, now), (r.get("note") or "")[:40]] for r in items]
    typer.echo(table(rows, ["ID", "STATE", "USER", "HOST", "GPU", "START", "END", "NOTE"]))
    typer.echo(f"times in {tz.key}")


def cancel(
    ctx: Ctx,
    ids: Annotated[list[int], typer.Argument(help="reservation ids (with --series: series ids)")],
    series: Annotated[bool, typer.Option("--series", help="cancel whole recurring series")] = False,
) -> None:
    """Cancel reservations (an active one is released: it ends now). The history is kept."""
    for rid in ids:
        if series:
            s = ctx.api.delete(f"/series/{rid}")
            typer.echo(f"series #{rid}: cancelled {s['cancelled']} occurrence(s)" +
                       (f"; kept {', '.join('#' + str(k) for k in s['kept'])}" if s["kept"] else ""))
        else:
            r = ctx.api.delete(f"/reservations/{rid}")
            typer.echo(f"#{r['id']} {r['state']}")


def release(
    ctx: Ctx,
    rid: Annotated[int | None, typer.Argument(help="reservation id (default: your active one on this host)")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine")] = None,
) -> None:
    """Give GPUs back now: the reservation ends now (an upcoming one is cancelled)."""
    r = _pick(ctx, rid, host, "release")
    out = ctx.api.post(f"/reservations/{r['id']}/release")
    typer.echo(f"#{out['id']} {out['state']} at {fmt_time(_dt(out['end']), ctx.tz)}")


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
    more = _duration(by, "--by")
    r = _pick(ctx, rid, host, "extend")
    end = _dt(r["end"]) + more  # type: ignore[operator]
    out = ctx.api.patch(f"/reservations/{r['id']}", {"end": end.isoformat()})
    if as_json:
        _print_json(out)
    else:
        typer.echo(f"#{out['id']} now ends {fmt_time(_dt(out['end']), ctx.tz)} ({ctx.tz.key})")


def status(
    ctx: Ctx,
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """The whole lab like nvidia-smi: GPUs, memory, utilization, holder, until when, what runs."""
    devices = ctx.api.get("/devices", host=host)
    if as_json:
        _print_json(devices)
        return
    if not devices:
        typer.echo("no GPUs known" + (f" on {host}" if host else ""))
        return
    tz = ctx.tz
    now = datetime.now(UTC)
    rows = []
    for d in devices:
        t = d.get("telemetry") or {}
        mem = f"{_gib(t.get('memory_used_mib'))}/{_gib(d.get('memory_total_mib'))}"
        util = "-" if t.get("utilization_gpu") is None else f"{t['utilization_gpu']:.0f}%"
        holder = d.get("holder")
        nxt = d.get("next_reservation")
        who = holder["user"] if holder else ("(open)" if d.get("is_open") else "")
        until = fmt_time(_dt(holder["end"]), tz, now) if holder else ""
        if nxt and not holder:
            until = f"next {nxt['user']} {fmt_time(_dt(nxt['start']), tz, now)}"
        procs = " ".join(f"{p.get('unix_user') or '?'}:{p.get('name') or p['pid']}({p['pid']})"
                         + (f" {_gib(p['used_memory_mib'])}" if p.get("used_memory_mib") else "")
                         for p in d.get("processes", []))
        gpu = str(d["index"]) if d.get("index") is not None else "-"
        if d.get("mig_profile"):
            gpu += f" {d['mig_profile']}"
        rows.append([d["host"], gpu, (d.get("name") or "?").replace("NVIDIA ", ""), mem, util, d["status"], who, until, procs])
    typer.echo(table(rows, ["HOST", "GPU", "MODEL", "MEMORY", "UTIL", "STATUS", "HOLDER", "UNTIL", "PROCESSES"]))
    typer.echo(f"times in {tz.key}")


def env(
    ctx: Ctx,
    host: Annotated[str | None, typer.Option(help="instead of this machine (socket.gethostname())")] = None,
    rid: Annotated[int | None, typer.Option("--id", help="this reservation instead of your active one")] = None,
    docker: Annotated[bool, typer.Option("--docker", help="print the --gpus value for docker run")] = False,
) -> None:
    """Print shell exports for your active reservation on this host.

    Use it as: eval "$(gpuroster env)"

    GPUs are named by UUID and CUDA_DEVICE_ORDER is PCI_BUS_ID: CUDA cannot pick another GPU.
    """
    r = _pick(ctx, rid, host, "env")
    uuids = r["cuda_visible_devices"]
    if docker:
        typer.echo(f"--gpus '\"device={uuids}\"'")
        return
    typer.echo(f"export CUDA_VISIBLE_DEVICES={uuids}")
    typer.echo("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    typer.echo(f"export GPUROSTER_RESERVATION_ID={r['id']}")


def usage(
    ctx: Ctx,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
) -> None:
    """Your limits: what applies, what is used and what is left."""
    u = ctx.api.get("/me/usage")
    if as_json:
        _print_json(u)
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
            return f"{v:g}" if isinstance(v, float) else str(v)

        rows.append([item["rule"], "unlimited" if lim is None else show(lim), show(used), show(left),
                     item["scope"] or "", item["detail"]])
    typer.echo(table(rows, ["LIMIT", "VALUE", "USED", "LEFT", "FROM", "DETAIL"]))


# ---------------------------------------------------------------------------- run


def run(
    ctx: Ctx,
    cmd: Annotated[list[str], typer.Argument(help="the command, after --")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=64, help="how many GPUs")] = 1,
    duration: Annotated[str | None, typer.Option("--for", help="how long to reserve: 90m, 4h, 2d")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine (socket.gethostname())")] = None,
    model: Annotated[str | None, typer.Option(help="GPU model contains this")] = None,
    min_memory: Annotated[str | None, typer.Option(help="per GPU, e.g. 40G")] = None,
    rid: Annotated[int | None, typer.Option("--id", help="use this reservation")] = None,
    note: Annotated[str | None, typer.Option(help="note for a new reservation")] = None,
) -> None:
    """Run a command on reserved GPUs of this host, then release them.

    Reuses your active reservation with enough GPUs (or --id), else reserves -n GPUs --for asap.

    It waits for the start, runs the command with CUDA_VISIBLE_DEVICES set and exits with its status.

    A reservation made by run is released when the command exits, also on Ctrl-C (signals go to it first).
    """
    if not cmd:
        raise Fail("give the command after --, e.g. gpuroster run -n 1 --for 2h -- python train.py", USAGE)
    h = _this_host(ctx, host)
    created = False
    if rid is not None:
        r = ctx.api.get(f"/reservations/{rid}")
    else:
        usable = [x for x in _active_on(ctx, h) if len(x["devices"]) >= count]
        if usable:
            r = usable[0]
        else:
            if not duration:
                raise Fail(f"you hold no active reservation with {count} GPU(s) on {h}; give --for to reserve one", USAGE)
            body = _reservation_body(ctx, duration=duration, count=count, start="asap", host=h, model=model,
                                     min_memory=min_memory, device=None, note=note or f"gpuroster run: {' '.join(cmd)}"[:1024],
                                     share=None)
            r = ctx.api.create("/reservations", body)
            created = True
    if r["host"] != h:
        raise Fail(f"reservation #{r['id']} is on {r['host']}, not on this host ({h})")
    code = _run_reserved(ctx, r, cmd, created=created)
    raise typer.Exit(code)


def _run_reserved(ctx: Ctx, r: dict, cmd: list[str], *, created: bool) -> int:
    stop: list[int] = []
    child: subprocess.Popen | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        stop.append(signum)
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signum)
            except ProcessLookupError:
                pass

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    tty = _controlling_tty()
    try:
        start = _dt(r["start"])
        if start and start > datetime.now(UTC):
            typer.echo(f"waiting for #{r['id']} on {r['host']} (GPU {_devices_text(r)}) to start at "
                       f"{fmt_time(start, ctx.tz)} ({ctx.tz.key}); Ctrl-C cancels it", err=True)
            while not stop and (start - datetime.now(UTC)).total_seconds() > 0:
                time.sleep(min(0.5, max(0.0, (start - datetime.now(UTC)).total_seconds())))
            if stop:
                return 128 + stop[0]
        environ = {**os.environ, "CUDA_VISIBLE_DEVICES": r["cuda_visible_devices"], "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "GPUROSTER_RESERVATION_ID": str(r["id"])}
        try:
            child = subprocess.Popen(cmd, env=environ, preexec_fn=_foreground_child(tty) if tty is not None else None,
                                     process_group=None if tty is not None else 0)
        except OSError as e:
            typer.echo(f"error: cannot start {cmd[0]!r}: {e.strerror or e}", err=True)
            return 127
        if stop:  # a signal arrived while the child was being started
            os.killpg(child.pid, stop[0])
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries wait() for us
                continue
        return 128 - rc if rc < 0 else rc
    finally:
        if tty is not None:
            _take_terminal_back(tty)
        if created:
            _give_back(ctx, r)
        for s, h in previous.items():
            signal.signal(s, h)


def _give_back(ctx: Ctx, r: dict) -> None:
    try:
        out = ctx.api.post(f"/reservations/{r['id']}/release")
        typer.echo(f"gpuroster: #{out['id']} {out['state']}", err=True)
    except (ApiError, Unreachable) as e:
        typer.echo(f"gpuroster: could not release #{r['id']}: {e}; run 'gpuroster release {r['id']}'", err=True)


def _controlling_tty() -> int | None:
    """stdin's fd if it is our controlling terminal and we are in its foreground group."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _foreground_child(tty: int) -> Callable[[], None]:
    """In the child: a process group of its own that owns the terminal, so Ctrl-C reaches
    the command exactly once (not forwarded a second time by us)."""

    def setup() -> None:
        os.setpgid(0, 0)
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(tty, os.getpgrp())
        finally:
            signal.signal(signal.SIGTTOU, old)

    return setup


def _take_terminal_back(tty: int) -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


# ---------------------------------------------------------------------------- registration


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
    add(env, "env")
    add(run, "run")
    add(usage, "usage")
    if not cli.info.epilog:
        cli.info.epilog = EXIT_CODES


__all__ = ["register", "EXIT_CODES", "parse_start", "fmt_time"]
