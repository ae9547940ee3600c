"""What every member command shares: exit codes, the :class:`Fail` error, the :class:`Ctx`
(configuration, API client, lab zone) and the :func:`command` wrapper that turns API errors
into messages and exit codes; plus resolving which host and reservation a command means."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import typer

from app.i18n import gettext as _
from app.client import config as client_config
from app.client.errors import ApiError, NotConfigured, Unreachable
from app.client.units import parse_duration, parse_memory_mib
from app.sanitize import terminal_text

if TYPE_CHECKING:  # imported where used: --help needs neither httpx nor the time zone database
    from zoneinfo import ZoneInfo

    from app.client.api import Api

OK, ERROR, USAGE, CONFLICT, REFUSED, UNREACHABLE, AUTH = 0, 1, 2, 3, 4, 5, 6
EXIT_CODES = (
    "Exit codes: 0 ok; 1 other error (not found, server error); 2 bad usage or invalid input; "
    "3 conflict (the devices are reserved, or the state no longer allows it: the message says which); 4 refused (a sharing rule or a permission); "
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
                raise NotConfigured(_("not signed in: run 'gpuroster login --server URL' (or set GPUROSTER_SERVER and GPUROSTER_TOKEN)"))
            from app.client.api import Api

            self._api = Api(self.cfg.server, self.cfg.token)
        return self._api

    @functools.cached_property
    def username(self) -> str:
        return self.cfg.username or self.api.get("/me")["username"]

    @functools.cached_property
    def tz(self) -> ZoneInfo:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

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
            typer.echo(_("error: %(message)s", message=terminal_text(_problem_message(e), keep_newlines=True)), err=True)
            raise typer.Exit(_code_for(e.status)) from None
        except Unreachable as e:
            typer.echo(_("error: %(message)s", message=e), err=True)
            raise typer.Exit(UNREACHABLE) from None
        except NotConfigured as e:
            typer.echo(_("error: %(message)s", message=e), err=True)
            raise typer.Exit(AUTH) from None
        except Fail as e:
            typer.echo(_("error: %(message)s", message=e), err=True)
            raise typer.Exit(e.code) from None
        finally:
            ctx.close()

    # typer reads the signature: hide the injected ctx parameter
    sig = inspect.signature(fn, eval_str=True)
    wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    return wrapper


# ---------------------------------------------------------------------------- input


def duration_option(value: str, option: str) -> timedelta:
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
        raise Fail(_("--start: %(value)r is not asap, HH:MM, 'YYYY-MM-DD HH:MM' or ISO 8601", value=value), USAGE) from None
    if dt.tzinfo is None:
        return dt.isoformat(timespec="minutes"), tz.key
    return dt.isoformat(), None


def this_host(ctx: Ctx, given: str | None) -> str:
    if given:
        return given
    import socket  # only the commands that resolve this host need it

    names = {h["name"] for h in ctx.api.get("/hosts")}
    full = socket.gethostname()
    for cand in (full, full.split(".")[0]):
        if cand in names:
            return cand
    raise Fail(_("this machine (%(host)s) is not a GPU host known to the server; pass --host", host=full))


def active_on(ctx: Ctx, host: str) -> list[dict]:
    page = ctx.api.get("/reservations", user=ctx.username, host=host, state="active", limit=100)
    return page["items"]


def pick(ctx: Ctx, rid: int | None, host: str | None, what: str) -> dict:
    """The reservation ``rid``, or the caller's one active reservation on this host."""
    if rid is not None:
        return ctx.api.get(f"/reservations/{rid}")
    h = this_host(ctx, host)
    active = active_on(ctx, h)
    if not active:
        raise Fail(_("you hold no active reservation on %(host)s; give the reservation id to %(what)s", host=h, what=what))
    if len(active) > 1:
        ids = ", ".join(f"#{r['id']}" for r in active)
        raise Fail(_("you hold several active reservations on %(host)s (%(ids)s); give the id to %(what)s", host=h, ids=ids, what=what))
    return active[0]


def requested_start(body: dict) -> datetime | None:
    """The start the user asked for, as an instant (None for asap/now)."""
    start = body.get("start")
    if not start or start in ("asap", "now"):
        return None
    from zoneinfo import ZoneInfo

    dt = datetime.fromisoformat(start)
    return dt.replace(tzinfo=ZoneInfo(body["tz"])) if dt.tzinfo is None and body.get("tz") else dt


def placement_constraints(model: str | None, min_memory: str | None) -> dict[str, Any] | None:
    """The ``constraints`` of an "any N GPUs" request from ``--model`` and ``--min-memory``
    (``80GB``, ``80GiB`` or MiB); None when neither is given. Raises Fail (usage) for a
    memory size that does not parse."""
    constraints: dict[str, Any] = {}
    if model:
        constraints["model"] = model
    if min_memory:
        try:
            constraints["min_memory_mib"] = parse_memory_mib(min_memory)
        except ValueError as e:
            raise Fail(f"--min-memory: {e}", USAGE) from None
    return constraints or None


def reservation_body(ctx: Ctx, *, duration: str, count: int, start: str, host: str | None, model: str | None,
                      min_memory: str | None, device: list[str] | None, note: str | None, share: list[str] | None) -> dict:
    length = duration_option(duration, "--for")
    start_value, tz = parse_start(start, ctx.tz)
    body: dict[str, Any] = {"duration": int(length.total_seconds()), "note": note}
    if device:
        if not host:
            raise Fail(_("--device needs --host"), USAGE)
        if model or min_memory:
            raise Fail(_("--model and --min-memory choose devices; leave them out with --device"), USAGE)
        body.update(host=host, devices=[int(d) if d.isdigit() else d for d in device],
                    start="now" if start_value == "asap" else start_value)
    else:
        body.update(count=count, host=host, constraints=placement_constraints(model, min_memory),
                    start="asap" if start_value == "now" else start_value)
    if tz:
        body["tz"] = tz
    if share:
        body["share_with"] = share
    return {k: v for k, v in body.items() if v is not None}


def busy_notes(ctx: Ctx, r: dict) -> list[str]:
    """For a reservation that holds its devices now: a note when its host's agent has gone
    stale (nothing is known of the devices now: the placement takes such a host only when
    nothing known idle fits as early), and one per compute process of someone else already on
    one of them (the holder should know before their job shares its memory)."""
    if r.get("state") != "active":
        return []
    mine = {d["uuid"] for d in r["devices"]}
    listed = [d for d in ctx.api.get("/devices", host=r["host"], limit=5000) if d["uuid"] in mine]
    out = []
    if any(d.get("status") == "stale" for d in listed):
        out.append(_("note: the agent of %(host)s has not reported lately (stale): whether these GPUs are free now "
                     "is unknown, and the host may be down", host=r["host"]))
    for d in listed:
        for p in d.get("processes") or []:
            if p["type"] == "G" or (p.get("unix_user") and p["unix_user"] == ctx.username):
                continue
            out.append(_("note: %(device)s already runs %(process)s (pid %(pid)s) of %(owner)s, "
                         "which your reservation does not cover", device=d.get("label") or d["uuid"],
                         process=p.get("name") or "?", pid=p["pid"], owner=p.get("owner") or p.get("unix_user") or "?"))
    return out
