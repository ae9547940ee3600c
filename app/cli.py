"""The ``gpuroster`` command: server administration (``serve``, ``migrate``, ``admin …``)
and, for lab members, the booking client (``login``, ``reserve``, ``status``, … see
``app.client``)."""

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.client import boosts as boost_commands
from app.client import commands as client_commands
from app.client.formatting import HelpGroup

if TYPE_CHECKING:
    from app.config import Settings


def get_settings() -> "Settings":
    """The server's settings (``GPUROSTER_*``), imported on first use: pydantic-settings
    costs more to import than a member's command takes to run, and only the server
    commands need it."""
    from app.config import get_settings as load

    return load()


cli = typer.Typer(
    cls=HelpGroup,
    name="gpuroster",
    help="GPU reservations for shared lab servers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and usage errors (click's layout): rendering them with rich imports rich and
    # pygments, which took longer than everything else `gpuroster --help` does
    # (bench/cli_start.py); no help text here uses rich markup. Sub-apps inherit the mode.
    rich_markup_mode=None,
)
admin = typer.Typer(cls=HelpGroup, help="Administration on the server machine (talks to the database directly).", no_args_is_help=True)
cli.add_typer(admin, name="admin")


def _session_factory(settings: "Settings"):
    from app.db import build_engine, build_session_factory

    return build_session_factory(build_engine(settings))


@cli.command()
def migrate() -> None:
    """Apply pending database migrations (GPUROSTER_DATABASE_URL)."""
    from app.migrate import upgrade

    settings = get_settings()
    upgrade(settings.sqlalchemy_url)
    typer.echo(f"database at head: {_redact(settings.sqlalchemy_url)}")


@cli.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="worker processes (SQLite: keep 1, see docs/deploy.md)")] = 1,
    no_migrate: Annotated[bool, typer.Option("--no-migrate", help="skip applying migrations")] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Apply pending migrations, then run the service with uvicorn."""
    import uvicorn

    settings = get_settings()
    if "base_url" not in settings.model_fields_set:
        # links in notices and feeds: where this server listens, unless the admin said otherwise;
        # the environment carries it to uvicorn's worker processes, and the app built in this
        # process reads its settings afresh
        url = os.environ["GPUROSTER_BASE_URL"] = listen_url(host, port)
        from app.config import get_settings as load

        load.cache_clear()
        typer.echo(f"links in notices point to {url} (set GPUROSTER_BASE_URL to the public address)", err=True)
    note = sqlite_workers_note(settings.sqlalchemy_url, workers)
    if note:
        typer.echo(note, err=True)
    if not no_migrate:
        from app.migrate import upgrade

        upgrade(settings.sqlalchemy_url)
    uvicorn.run(
        "app.main:create_app", factory=True, host=host, port=port, workers=workers, log_level=log_level,
        # the app believes X-Forwarded-* only from GPUROSTER_TRUSTED_PROXIES (app.main), never uvicorn's default
        proxy_headers=False, timeout_keep_alive=65,
    )


def listen_url(host: str, port: int) -> str:
    """The URL people reach ``serve --host HOST --port PORT`` at (``http://gpu-node-7.lab:8000``):
    a wildcard address (``0.0.0.0``, ``::``) stands for this machine's name (its fully qualified
    name, else its host name), an IPv6 address goes in brackets."""
    if host in ("", "0.0.0.0", "::"):
        import socket

        # getfqdn() answers "localhost" where /etc/hosts lists the machine's name on 127.0.0.1
        fqdn = socket.getfqdn()
        host = socket.gethostname() if fqdn in ("", "localhost") or fqdn.startswith("localhost.") else fqdn
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def sqlite_workers_note(url: str, workers: int) -> str | None:
    """A warning for ``serve --workers N>1`` on SQLite, else ``None``.

    SQLite has one writer per database file. One process queues its writers on an in-process
    lock and hands the file lock straight on; several processes wait for it through SQLite's
    busy handler, which sleeps in steps of up to 100 ms, so booking latency at a few clients
    rises several-fold (see bench/booking.py --workers) while CPU is rarely what SQLite
    deployments lack. Hence the default of 1, and this note when more are asked for.
    """
    if workers <= 1 or not url.startswith("sqlite"):
        return None
    return (f"note: {workers} workers on SQLite contend for its single write lock; 1 worker gives lower "
            "latency for writes (bookings, agent snapshots). Use PostgreSQL to run several processes.")


DEMO_SOURCES = ("auto", "nvml", "replay")


@cli.command()
def demo(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port of the service (on 127.0.0.1)")] = 8000,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="SQLite database, host tokens, agent state and logs (default: GPUROSTER_DATA_DIR or ./data)")] = None,
    source: Annotated[str, typer.Option(help="auto: NVML if this machine has NVIDIA GPUs, else replay the bundled captures; or nvml, replay")] = "auto",
) -> None:
    """Run the service on SQLite with agents attached (NVML, or the bundled captures replayed) and
    print the URL and, on first start, the admin's password. Ctrl-C stops everything."""
    from app.demo import run_demo

    if source not in DEMO_SOURCES:
        raise typer.BadParameter(f"must be one of {', '.join(DEMO_SOURCES)}", param_hint="--source")
    raise typer.Exit(run_demo(port=port, data_dir=data_dir or get_settings().data_dir, source=source))


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        pw = sys.stdin.readline().rstrip("\n")
    else:
        pw = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    return pw


@admin.command("create-user")
def create_user(
    name: Annotated[str, typer.Argument(help="username")],
    is_admin: Annotated[bool, typer.Option("--admin", help="give the admin role")] = False,
    email: Annotated[str | None, typer.Option(help="e-mail for notices")] = None,
    unix_name: Annotated[str | None, typer.Option(help="Unix account on the GPU hosts (default: username)")] = None,
    unix_uid: Annotated[int | None, typer.Option(help="Unix uid on the GPU hosts (directory users)", min=0)] = None,
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from standard input")] = False,
    no_password: Annotated[bool, typer.Option("--no-password", help="token-only account, no web sign-in")] = False,
) -> None:
    """Create a user (password from a prompt or --password-stdin)."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.services import users as user_service

    password = None if no_password else _read_password(password_stdin)
    try:
        run_in_transaction(
            _session_factory(get_settings()),
            lambda s: user_service.create_user(
                s, username=name, password=password, email=email, unix_name=unix_name, admin=is_admin, actor="cli",
                unix_uid=unix_uid,
            ),
        )
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"created user {name}" + (" (admin)" if is_admin else ""))


@admin.command("set-uid")
def set_uid(
    user: Annotated[str, typer.Argument(help="username")],
    uid: Annotated[str, typer.Argument(help="the Unix uid on the GPU hosts, or 'none' to clear it")],
) -> None:
    """Set USER's Unix uid: processes of that uid are theirs even where the host has no passwd entry."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.services import users as user_service

    value: int | None
    if uid.lower() == "none":
        value = None
    elif uid.isdigit():
        value = int(uid)
    else:
        typer.echo("error: unix_uid: a whole number from 0 to 4294967294, or 'none'", err=True)
        raise typer.Exit(2)

    def work(s):
        target = user_service.get_user(s, user)
        return user_service.update_user(s, actor=target, username=user, unix_uid=value, audit_actor="cli")

    try:
        run_in_transaction(_session_factory(get_settings()), work)
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{user}: unix uid " + ("cleared" if value is None else str(value)))
@admin.command("set-password")
def set_password(
    name: Annotated[str, typer.Argument(help="username")],
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from standard input")] = False,
) -> None:
    """Set USER's password (a reset): every web session of that user is signed out."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.services import credentials
    from app.services import users as user_service

    password = _read_password(password_stdin)
    try:
        ended = run_in_transaction(
            _session_factory(get_settings()),
            lambda s: credentials.set_password(s, actor="cli", user=user_service.get_user(s, name), password=password),
        )
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"password set for {name}; {ended} web session(s) signed out")


@admin.command("create-token")
def create_token(
    user: Annotated[str, typer.Argument(help="username")],
    name: Annotated[str, typer.Option(help="a label for the token")] = "cli",
    expires: Annotated[int | None, typer.Option(help="expiry in days")] = None,
) -> None:
    """Create an API token for USER and print it once."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.services import users as user_service

    def work(s):
        u = user_service.get_user(s, user)
        return user_service.create_api_token(s, user=u, name=name, expires_days=expires)[1]

    try:
        token = run_in_transaction(_session_factory(get_settings()), work)
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(token)


@admin.command("add-host")
def add_host(name: Annotated[str, typer.Argument(help="host name, as the agent reports it")]) -> None:
    """Register a GPU host and print its host token once (give it to the agent via --token-file)."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.services import hosts as host_service

    try:
        token = run_in_transaction(_session_factory(get_settings()), lambda s: host_service.create_host(s, name=name, actor="cli")[1])
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(token)


@admin.command("clear-quarantine")
def clear_quarantine(
    uuid: Annotated[str, typer.Argument(help="the device's NVML UUID (GPU-… or MIG-…)")],
    note: Annotated[str | None, typer.Option(help="what was done (reset, replaced), for the audit log")] = None,
) -> None:
    """Lift the health quarantine of device UUID once it is repaired (audited); conditions
    still showing are acknowledged until they change."""
    from app.db import run_in_transaction
    from app.errors import AppError
    from app.models import utcnow
    from app.services import quarantine

    try:
        q = run_in_transaction(_session_factory(get_settings()),
                               lambda s: quarantine.clear(s, actor="cli", uuid=uuid, note=note, now=utcnow()))
    except AppError as e:
        typer.echo(f"error: {e.detail}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{uuid}: quarantine cleared ({q.reason})")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# The members' commands, listed by name in app.client.commands.register.
client_commands.register(cli)
boost_commands.register(cli, admin)  # boost ask|list; admin boost approve|deny


def main() -> None:
    """The ``gpuroster`` command: messages in the language of ``GPUROSTER_LANG`` or the
    locale environment (``LC_ALL``, ``LC_MESSAGES``, ``LANG``), else English."""
    from app.i18n import cli_locale, set_locale

    set_locale(cli_locale(os.environ))
    cli()


if __name__ == "__main__":
    main()
