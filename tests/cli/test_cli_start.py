"""What ``gpuroster`` imports before it has work to do: module sets, never times.

``--help`` needs typer and the command definitions only; a member's command imports httpx
when it sends its first request, Babel when it formats a date or a number in a language,
and never the service's packages (bench/cli_start.py times the same starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit.live import free_port

# Runs the command as the console script does (app.cli:main) and writes the modules loaded
# when it ends (None entries are imports refused on purpose, see agent/httpx_lean.py).
CHILD = """
import json, sys
sys.argv = ["gpuroster", *{args!r}]
from app.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
with open({out!r}, "w") as fh:
    json.dump({{"code": code, "modules": sorted(k for k, v in sys.modules.items() if v is not None)}}, fh)
"""
SERVICE_PACKAGES = {"fastapi", "starlette", "sqlalchemy", "uvicorn", "jinja2", "alembic", "pydantic_settings"}


def run_cli(tmp_path, *args: str, **env: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUROSTER_", "LC_", "LANG"))}
    proc = subprocess.run([sys.executable, "-c", CHILD.format(args=list(args), out=str(out))], capture_output=True,
                          text=True, timeout=120, env={**base, "XDG_CONFIG_HOME": str(tmp_path), **env})
    assert out.exists(), proc.stderr
    result = json.loads(out.read_text())
    return result["code"], {m.split(".")[0] for m in result["modules"]} | set(result["modules"])


def test_help_imports_neither_httpx_nor_babel_nor_the_service(tmp_path):
    code, modules = run_cli(tmp_path, "--help")
    assert code == 0 and "typer" in modules
    # rich: the help is plain (rich_markup_mode=None in app.cli)
    assert modules & ({"httpx", "httpcore", "babel", "zoneinfo", "pydantic", "rich", "pygments"} | SERVICE_PACKAGES) == set()
    # standard modules only some commands use (login, env --docker, pages), imported there
    assert modules & {"tempfile", "socket", "html", "getpass", "shlex"} == set()


def test_plain_help_lists_each_command_with_its_whole_first_paragraph():
    out = subprocess.run([sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "80"})
    text = " ".join(out.stdout.split())
    commands = out.stdout.partition("Commands:")[2]
    assert out.returncode == 0 and commands and "..." not in commands  # click's own listing cuts lines with "..."
    assert "login Sign in once: stores the server URL and an API token (mode 0600) under ~/.config/gpuroster/." in text
    assert "waitlist Your waitlist entries (admins: --everyone); 'gpuroster waitlist cancel ID' withdraws one." in text


def test_a_command_imports_httpx_for_its_first_request_and_not_its_cli(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    code, modules = run_cli(tmp_path, "status", GPUROSTER_SERVER=dead, GPUROSTER_TOKEN="t")
    assert code == 5  # unreachable: the request was sent
    assert "httpx" in modules and "httpx._main" not in modules
    # pydantic: typer 0.29 coerces every parameter through pydantic (pyproject.toml pins below it)
    assert modules & ({"babel", "rich", "pygments", "pydantic", "pydantic_core"} | SERVICE_PACKAGES) == set()


def test_a_command_loads_the_ca_bundle_only_where_tls_can_be_spoken(monkeypatch):
    """Loading certifi's bundle costs each command about 40 ms; a plain-HTTP server never uses it."""
    from app.client.api import Api

    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)

    def context(server: str):
        return Api(server, "t")._http._transport._pool._ssl_context

    plain = context("http://gpus.lab.example")
    assert plain.cert_store_stats()["x509_ca"] == 0 and plain.check_hostname  # verifying, never unchecked
    assert context("https://gpus.lab.example").cert_store_stats()["x509_ca"] > 0


def test_admin_commands_load_the_database_layer_but_no_web_framework(tmp_path):
    """An administrator's command works on the database through the services; the services'
    errors (app.errors) carry no HTTP machinery, so FastAPI and Starlette stay unloaded."""
    db = f"sqlite:///{tmp_path / 'gpuroster.db'}"
    env = {"GPUROSTER_DATABASE_URL": db, "GPUROSTER_DATA_DIR": str(tmp_path)}
    assert run_cli(tmp_path, "migrate", **env)[0] == 0
    code, modules = run_cli(tmp_path, "admin", "add-host", "node-01", **env)
    assert code == 0 and "sqlalchemy" in modules and "app.services.hosts" in modules
    assert modules & {"fastapi", "starlette", "jinja2", "uvicorn"} == set()


def test_command_parameters_are_annotated_with_objects_not_strings():
    """typer reads every command's parameters on every start, the one run included; an
    annotation kept as a string (``from __future__ import annotations``) is compiled and
    evaluated each time (about 10 ms of ``gpuroster``'s start over its commands)."""
    import inspect

    import typer.main

    from app.cli import cli

    def callbacks(app: typer.Typer):
        for info in app.registered_commands:
            yield info.callback
        yield app.registered_callback.callback if app.registered_callback else None
        for group in app.registered_groups:
            yield from callbacks(group.typer_instance)

    found = [fn for fn in callbacks(cli) if fn is not None]
    assert len(found) > 20  # every command, sub-apps included
    stringly = {f"{fn.__module__}.{fn.__qualname__}": name for fn in found
                for name, ann in inspect.get_annotations(fn).items() if isinstance(ann, str)}
    assert stringly == {}
    assert typer.main.get_command(cli).name == "gpuroster"
