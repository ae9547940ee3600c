"""``gpuroster run``: run a command on reserved GPUs (reserving them first if asked), with
``CUDA_VISIBLE_DEVICES`` set to their UUIDs, the terminal handed to the child and the
reservation given back when it was made for this run."""

import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from app.i18n import gettext as _
from app.client.errors import ApiError, Unreachable
from app.client.context import USAGE, Ctx, Fail, active_on, reservation_body, this_host
from app.client.formatting import as_datetime, devices_text, fmt_time

# ---------------------------------------------------------------------------- run


#: The container label the agent reads a container's owner from (its default owner label).
OWNER_LABEL = "org.gpuroster.user"


def docker_args(ctx: Ctx, uuids: str) -> list[str]:
    """``docker run`` arguments for the reserved GPUs: ``--gpus "device=<uuids>"`` and the owner
    label ``org.gpuroster.user=<your unix name>``, so the agent attributes the container's
    processes (which run as root on the host) to you."""
    me = ctx.api.get("/me")
    return ["--gpus", f'"device={uuids}"', "--label", f"{OWNER_LABEL}={me['unix_name']}"]


def run(
    ctx: Ctx,
    cmd: Annotated[list[str], typer.Argument(help="the command, after --")],
    count: Annotated[int | None, typer.Option("--count", "-n", min=1, max=64, help="how many GPUs (default: 1 to reserve, "
                                              "all of an active reservation of yours)")] = None,
    duration: Annotated[str | None, typer.Option("--for", help="how long to reserve: 90m, 4h, 2d (a new reservation only)")] = None,
    host: Annotated[str | None, typer.Option(help="instead of this machine (socket.gethostname())")] = None,
    model: Annotated[str | None, typer.Option(help="GPU model contains this")] = None,
    min_memory: Annotated[str | None, typer.Option(help="per GPU, e.g. 40G")] = None,
    rid: Annotated[int | None, typer.Option("--id", help="use this reservation")] = None,
    note: Annotated[str | None, typer.Option(help="note for a new reservation")] = None,
    docker: Annotated[bool, typer.Option("--docker", help="the command is 'docker run …' (or podman): add the "
                                          "--gpus value and the owner label after 'run'")] = False,
) -> None:
    """Run a command on reserved GPUs of this host, then release them.

    Reuses your active reservation with enough GPUs (or --id; with -n, the command sees that many of
    its GPUs), else reserves -n GPUs --for asap.

    It waits for the start, runs the command with CUDA_VISIBLE_DEVICES set and exits with its status.

    A reservation made by run is released when the command exits, also on Ctrl-C (signals go to it first).
    """
    if not cmd:
        raise Fail(_("give the command after --, e.g. gpuroster run -n 1 --for 2h -- python train.py"), USAGE)
    if docker and ("run" not in cmd[1:2] or os.path.basename(cmd[0]) not in ("docker", "podman")):
        raise Fail(_("--docker: give the container command after --, e.g. gpuroster run --docker -- docker run IMAGE"), USAGE)
    created = False
    if rid is not None:  # like ``env --id``: the reservation names its host, this machine need not be one
        r = ctx.api.get(f"/reservations/{rid}")
        h = host or r["host"]
    else:
        h = this_host(ctx, host)
        usable = [x for x in active_on(ctx, h) if len(x["devices"]) >= (count or 1)]
        if usable:
            r = usable[0]
        else:
            if not duration:
                raise Fail(_("you hold no active reservation with %(count)s GPU(s) on %(host)s; give --for to reserve one", count=count or 1, host=h), USAGE)
            body = reservation_body(ctx, duration=duration, count=count or 1, start="asap", host=h, model=model,
                                     min_memory=min_memory, device=None, note=note or f"gpuroster run: {' '.join(cmd)}"[:1024],
                                     share=None)
            r = ctx.api.create("/reservations", body)
            created = True
    if r["host"] != h:
        raise Fail(_("reservation #%(id)s is on %(host)s, not on this host (%(here)s)", id=r["id"], host=r["host"], here=h))
    uuids = r["cuda_visible_devices"].split(",")
    if not created:
        uuids = _reused(ctx, r, uuids, count=count, duration=duration)
    if docker:
        cmd = [cmd[0], "run", *docker_args(ctx, ",".join(uuids)), *cmd[2:]]
    code = _run_reserved(ctx, r, cmd, uuids=uuids, created=created)
    raise typer.Exit(code)


def _reused(ctx: Ctx, r: dict, uuids: list[str], *, count: int | None, duration: str | None) -> list[str]:
    """Of ``uuids`` (all of ``r``'s, in index order), those the command gets of a reservation
    it did not make (the first ``count``, all without ``-n``), told on stderr with the
    reservation's end, and that ``--for`` did not change it."""
    if count is not None and count > len(uuids):
        raise Fail(_("reservation #%(id)s has %(n)s GPU(s), fewer than -n %(count)s", id=r["id"], n=len(uuids), count=count),
                   USAGE)
    if count is not None and count < len(uuids):
        uuids = uuids[:count]
        shown = {d["uuid"]: str(d["index"]) if d.get("index") is not None else d["uuid"] for d in r["devices"]}
        typer.echo(_("gpuroster: using GPU %(used)s of your reservation #%(id)s (GPU %(devices)s) until %(end)s",
                     used=",".join(shown.get(u, u) for u in uuids), id=r["id"], devices=devices_text(r),
                     end=fmt_time(as_datetime(r["end"]), ctx.tz)), err=True)
    else:
        typer.echo(_("gpuroster: using your reservation #%(id)s (GPU %(devices)s) until %(end)s", id=r["id"],
                     devices=devices_text(r), end=fmt_time(as_datetime(r["end"]), ctx.tz)), err=True)
    if duration:
        typer.echo(_("gpuroster: --for applies to a new reservation only; 'gpuroster extend %(id)s' changes this one",
                     id=r["id"]), err=True)
    return uuids


def _run_reserved(ctx: Ctx, r: dict, cmd: list[str], *, uuids: list[str], created: bool) -> int:
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
        start = as_datetime(r["start"])
        if start and start > datetime.now(UTC):
            typer.echo(_("waiting for #%(id)s on %(host)s (GPU %(devices)s) to start at %(start)s (%(zone)s); Ctrl-C cancels it",
                         id=r["id"], host=r["host"], devices=devices_text(r), start=fmt_time(start, ctx.tz), zone=ctx.tz.key),
                       err=True)
            while not stop and (start - datetime.now(UTC)).total_seconds() > 0:
                time.sleep(min(0.5, max(0.0, (start - datetime.now(UTC)).total_seconds())))
            if stop:
                return 128 + stop[0]
        environ = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(uuids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "GPUROSTER_RESERVATION_ID": str(r["id"])}
        try:
            child = subprocess.Popen(cmd, env=environ, preexec_fn=_foreground_child(tty) if tty is not None else None,
                                     process_group=None if tty is not None else 0)
        except OSError as e:
            typer.echo(_("error: cannot start %(command)r: %(reason)s", command=cmd[0], reason=e.strerror or e), err=True)
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
        typer.echo(f"gpuroster: #{out['id']} {_(out['state'])}", err=True)
    except (ApiError, Unreachable) as e:
        typer.echo(_("gpuroster: could not release #%(id)s: %(error)s; run 'gpuroster release %(id)s'", id=r["id"], error=e), err=True)


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
