"""The lab members' CLI against a live ``gpuroster serve`` (one per database, tables emptied
after each test): sign-in, reserve/list/extend/cancel/release, status, env (evaluated by
bash), run (exit status, release on failure, Ctrl-C and SIGTERM, waiting for the start),
usage and the exit codes. Most commands run in the test's process through typer's runner
(``invoke``); those that exec, handle signals or read server settings run as processes of their
own, and ``tests/cli/test_cli_start.py`` and ``test_exit_codes.py`` run the installed command."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from app.config import Settings
from app.db import build_engine, build_session_factory, run_in_transaction
from tests.conftest import gpu, snapshot_body, truncate_all
from testkit.live import BIN, free_port, gpuroster_env, live_server

pytestmark = pytest.mark.commits  # CLI commands and live servers read what the test committed

BERLIN = ZoneInfo("Europe/Berlin")
PASSWORD = "correct horse battery"


@dataclass
class Server:
    db_url: str
    url: str


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory):
    db_url = request.getfixturevalue("_sqlite_url" if request.param == "sqlite" else "_pg_url")
    truncate_all(db_url)
    env = gpuroster_env(db_url, tmp_path_factory.mktemp("server"), GPUROSTER_TIMEZONE="Europe/Berlin",
                        GPUROSTER_MIN_RESERVATION_SECONDS="1", GPUROSTER_BASE_URL="http://gpus.lab.example")
    with live_server(env, migrate=False, log=tmp_path_factory.mktemp("log") / "server.log") as url:
        yield Server(db_url, url)


# run: execs the command and handles signals; admin: server settings are read once per
# process; wait: polls until the start, bounded by the subprocess timeout
OWN_PROCESS = frozenset({"run", "admin", "wait"})


def invoke(args: list[str], env: dict[str, str], input: str | None) -> subprocess.CompletedProcess:
    """``gpuroster args`` in this process, as ``app.cli.main`` runs it (language from the
    environment, then the command), with exactly ``env`` as the environment; an unexpected
    exception is a traceback on stderr and status 1, as from the real command."""
    import traceback

    from typer.testing import CliRunner

    from app.cli import cli
    from app.i18n import cli_locale, use_locale

    environ = {k: None for k in os.environ if k not in env} | env
    with use_locale(cli_locale(env)):  # what main() sets, undone afterwards
        res = CliRunner().invoke(cli, args, env=environ, input=input)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["gpuroster", *args], res.exit_code, res.stdout, stderr)


@dataclass
class Lab:
    url: str
    alice: str
    bob: str
    admin: str
    devices: list[str]
    config_home: Path
    tmp: Path
    db_url: str = ""

    def env(self, token: str | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUROSTER_")}
        env.update({"XDG_CONFIG_HOME": str(self.config_home), "PYTHONUNBUFFERED": "1"})
        if token is not None:
            env.update({"GPUROSTER_SERVER": self.url, "GPUROSTER_TOKEN": token})
        env.update(extra)
        return env

    def cli(self, *args: str, token: str | None = "alice", input: str | None = None, **extra: str):
        """``gpuroster *args`` as ``token``'s member: a CompletedProcess (returncode, stdout,
        stderr). Commands in :data:`OWN_PROCESS` run as a process of their own; the others in
        this process (:func:`invoke`), which spares a Python start and the CLI's imports per
        call (most of these tests' CPU time)."""
        tok = {"alice": self.alice, "bob": self.bob, "admin": self.admin}.get(token, token) if token else None
        env = self.env(tok, **extra)
        if not args or args[0] in OWN_PROCESS:
            return subprocess.run([str(BIN / "gpuroster"), *args], env=env, input=input,
                                  capture_output=True, text=True, timeout=120)
        return invoke(list(args), env, input)

    def api(self, method: str, path: str, token: str, **kw):
        return httpx.request(method, self.url + "/api/v1" + path, headers={"Authorization": f"Bearer {token}"},
                             timeout=30, **kw)


@pytest.fixture
def lab(server, tmp_path):
    from app.services import hosts as host_service
    from app.services import users as user_service

    engine = build_engine(Settings(database_url=server.db_url))

    def work(s):
        tokens = {}
        for name, admin, pw in (("boss", True, None), ("alice", False, PASSWORD), ("bob", False, None)):
            u = user_service.create_user(s, username=name, admin=admin, password=pw)
            tokens[name] = user_service.create_api_token(s, user=u, name="test")[1]
        return tokens, host_service.create_host(s, name="node-01")[1]

    tokens, host_token = run_in_transaction(build_session_factory(engine), work)
    engine.dispose()
    devices = [gpu(f"GPU-{i}{i}{i}{i}cccc-0000-0000-0000-00000000000{i}", i) for i in range(4)]
    devices[1]["memory_used_mib"] = 20480.0
    procs = [{"device_uuid": devices[1]["uuid"], "pid": 5101, "type": "C", "used_memory_mib": 20000.0, "unix_user": "bob",
              "uid": 1001, "name": "python", "create_time": 1.0}]
    r = httpx.post(server.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {host_token}"},
                   json=snapshot_body("node-01", 1, devices, procs))
    assert r.status_code == 200, r.text
    yield Lab(server.url, tokens["alice"], tokens["bob"], tokens["boss"], [d["uuid"] for d in devices],
              tmp_path / "config", tmp_path, server.db_url)
    truncate_all(server.db_url)


def _json(out) -> object:
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def _mine(lab: Lab, token: str | None = None) -> list[dict]:
    r = lab.api("GET", "/reservations", token or lab.alice, params={"user": "alice"})
    return r.json()["items"]


# ---------------------------------------------------------------------------- sign-in and config


def test_login_with_password_stores_a_0600_token_that_later_commands_use(lab):
    out = lab.cli("login", "--server", lab.url + "/", "--username", "alice", "--password-stdin", token=None,
                  input=PASSWORD + "\n")
    assert out.returncode == 0, out.stderr
    assert "signed in" in out.stdout and "alice" in out.stdout and "Europe/Berlin" in out.stdout
    path = lab.config_home / "gpuroster" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    stored = json.loads(path.read_text())
    assert stored["server"] == lab.url and stored["token"].startswith("gpr_") and stored["username"] == "alice"
    assert _json(lab.cli("usage", "--json", token=None))["user"] == "alice"
    # the environment overrides the file
    assert _json(lab.cli("usage", "--json", token="bob"))["user"] == "bob"
    # a wrong password: exit 6, the stored login is kept
    out = lab.cli("login", "--server", lab.url, "-u", "alice", "--password-stdin", token=None, input="nope\n")
    assert out.returncode == 6 and "wrong username or password" in out.stderr
    assert json.loads(path.read_text())["token"] == stored["token"]


def test_login_with_a_token_and_xdg_config_home(lab):
    out = lab.cli("login", "--server", lab.url, "--token", lab.bob, token=None)
    assert out.returncode == 0 and "as bob" in out.stdout
    assert json.loads((lab.config_home / "gpuroster" / "config.json").read_text())["token"] == lab.bob
    out = lab.cli("login", "--server", lab.url, "--token", "gpr_not-a-token", token=None)
    assert out.returncode == 6
    out = lab.cli("login", "--server", "gpus.lab.example", "--token", lab.bob, token=None)
    assert out.returncode == 2 and "http" in out.stderr


# ---------------------------------------------------------------------------- booking


def test_reserve_on_a_host_whose_agent_went_stale_says_so(lab):
    from sqlalchemy import update

    from app.models import Host

    engine = build_engine(Settings(database_url=lab.db_url))
    run_in_transaction(build_session_factory(engine), lambda s: s.execute(
        update(Host).where(Host.name == "node-01").values(last_seen_at=datetime.now(UTC) - timedelta(hours=1))))
    engine.dispose()
    out = lab.cli("reserve", "-n", "1", "--for", "1h")
    assert out.returncode == 0, out.stderr
    assert "note: the agent of node-01 has not reported lately (stale): whether these GPUs are free now is unknown" in out.stdout
    later = lab.cli("reserve", "-n", "1", "--for", "1h", "--start", "2031-03-04 10:00")  # not held now: nothing to say
    assert later.returncode == 0 and "stale" not in later.stdout, later.stdout


def test_reserve_list_extend_cancel_and_release(lab):
    r = _json(lab.cli("reserve", "-n", "2", "--for", "2h", "--min-memory", "40G", "--note", "sweep", "--json"))
    assert r["state"] == "active" and len(r["devices"]) == 2 and r["note"] == "sweep"
    assert lab.devices[1] not in [d["uuid"] for d in r["devices"]]  # GPU 1 is busy with bob's job: idle ones first
    out = lab.cli("list")
    assert out.returncode == 0 and f"#{r['id']}" in out.stdout and "active" in out.stdout and "Europe/Berlin" in out.stdout
    listed = _json(lab.cli("list", "--json"))
    assert [x["id"] for x in listed] == [r["id"]]
    both = lab.cli("list", "--everyone", "--user", "bob")  # contradictory: refused, not half-obeyed
    assert both.returncode == 2 and "--user or --everyone, not both" in both.stderr, both.stdout + both.stderr
    end = datetime.fromisoformat(r["end"])
    out = lab.cli("extend", str(r["id"]), "--by", "90m", "--json")
    assert datetime.fromisoformat(_json(out)["end"]) == end + timedelta(minutes=90)
    # the active one on this host, without an id
    out = lab.cli("release", "--host", "node-01")
    assert out.returncode == 0 and f"#{r['id']} released" in out.stdout
    # GPU 1 runs bob's job: booked by name, the holder is told before sharing its memory
    out = lab.cli("reserve", "-d", "1", "--host", "node-01", "--for", "1h")
    assert out.returncode == 0, out.stderr
    assert "note: GPU 1 already runs python (pid 5101) of bob, which your reservation does not cover" in out.stdout
    assert lab.cli("release", "--host", "node-01").returncode == 0
    later = _json(lab.cli("reserve", "--for", "1h", "--start", "2031-03-04 10:00", "--json"))
    assert datetime.fromisoformat(later["start"]) == datetime(2031, 3, 4, 9, 0, tzinfo=UTC)
    out = lab.cli("cancel", str(later["id"]))
    assert out.returncode == 0 and f"#{later['id']} cancelled" in out.stdout
    assert _json(lab.cli("list", "--json")) == []
    assert {x["state"] for x in _json(lab.cli("list", "--all", "--json"))} == {"released", "cancelled"}


def test_keep_answers_a_no_show_warning_then_has_nothing_to_answer(lab):
    from sqlalchemy import update

    from app.models import Reservation

    r = _json(lab.cli("reserve", "--for", "2h", "--json"))
    out = lab.cli("keep", str(r["id"]))
    assert out.returncode == 3 and "nothing to answer" in out.stderr  # nothing asked yet
    engine = build_engine(Settings(database_url=lab.db_url))
    run_in_transaction(build_session_factory(engine), lambda s: s.execute(
        update(Reservation).where(Reservation.id == r["id"]).values(checkin_warned_at=datetime.now(UTC))))
    engine.dispose()
    assert _json(lab.cli("list", "--json"))[0]["question"] == "checkin"
    out = lab.cli("keep", str(r["id"]))
    assert out.returncode == 0 and f"#{r['id']} kept until" in out.stdout
    assert _json(lab.cli("list", "--json"))[0]["question"] is None
    assert lab.cli("keep", str(r["id"]), token="bob").returncode != 0


def test_reserve_at_hh_mm_means_the_next_such_time_in_the_lab_zone(lab):
    now = datetime.now(UTC)
    target = (now + timedelta(hours=3)).astimezone(BERLIN).replace(second=0, microsecond=0)
    hhmm = target.strftime("%H:%M")
    r = _json(lab.cli("reserve", "--for", "30m", "--start", hhmm, "--json"))
    assert datetime.fromisoformat(r["start"]) == target
    earlier = (now - timedelta(hours=1)).astimezone(BERLIN).replace(second=0, microsecond=0)
    r = _json(lab.cli("reserve", "--for", "30m", "--start", earlier.strftime("%H:%M"), "--json"))
    start = datetime.fromisoformat(r["start"]).astimezone(BERLIN)
    assert start > now and start.strftime("%H:%M") == earlier.strftime("%H:%M")  # tomorrow


def test_reserve_n_moves_to_the_earliest_free_start_and_says_so(lab):
    r = lab.api("POST", "/reservations", lab.bob, json={"host": "node-01", "devices": [0, 1, 2, 3], "start": "now",
                                                       "duration": "PT3H"})
    assert r.status_code == 201
    wanted = (datetime.now(UTC) + timedelta(hours=1)).astimezone(BERLIN).replace(second=0, microsecond=0)
    out = lab.cli("reserve", "-n", "1", "--for", "1h", "--start", wanted.strftime("%Y-%m-%d %H:%M"))
    assert out.returncode == 0, out.stderr
    assert "note: 1 GPU(s) are free only from" in out.stdout and wanted.strftime("%H:%M") in out.stdout
    [mine] = _mine(lab)
    assert mine["start"] == r.json()["end"]


def test_exit_codes_conflict_refusal_input_unreachable_not_signed_in_not_found(lab):
    start = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    r = lab.api("POST", "/reservations", lab.bob, json={"host": "node-01", "devices": [0], "start": start.isoformat(),
                                                       "duration": "PT2H"})
    assert r.status_code == 201
    out = lab.cli("reserve", "-d", "0", "--host", "node-01", "--for", "1h", "--start", start.isoformat())
    assert out.returncode == 3 and "bob" in out.stderr
    assert lab.api("POST", "/rules", lab.admin, json={"scope": "default", "max_devices": 1}).status_code == 201
    out = lab.cli("reserve", "-n", "2", "--for", "1h")
    assert out.returncode == 4 and "max_devices" in out.stderr
    assert lab.cli("reserve", "--for", "soon").returncode == 2
    assert lab.cli("reserve", "--for", "1h", "--min-memory", "lots").returncode == 2
    out = lab.cli("reserve", "--for", "1h", "--start", "2031-03-30 02:30")  # a DST gap in Berlin
    assert out.returncode == 2 and "DST" in out.stderr
    dead = f"http://127.0.0.1:{free_port()}"
    out = lab.cli("list", token=None, GPUROSTER_SERVER=dead, GPUROSTER_TOKEN=lab.alice)
    assert out.returncode == 5 and "cannot reach" in out.stderr
    out = lab.cli("list", token=None)
    assert out.returncode == 6 and "gpuroster login" in out.stderr
    assert lab.cli("cancel", "999999").returncode == 1


def test_help_documents_the_exit_codes(lab):
    out = lab.cli("--help", token=None)
    assert out.returncode == 0 and "Exit codes" in out.stdout and "unreachable" in out.stdout
    for cmd in ("login", "reserve", "list", "cancel", "release", "extend", "status", "env", "run", "usage", "keep"):
        assert cmd in out.stdout
    assert "conflict" in lab.cli("reserve", "--help", token=None).stdout


# ---------------------------------------------------------------------------- status, env, usage


def test_status_shows_holders_memory_utilization_and_processes(lab):
    assert lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [2], "start": "now",
                                                            "duration": "PT2H"}).status_code == 201
    out = lab.cli("status", token="bob")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["HOST", "GPU", "MODEL", "MEMORY"]
    row1 = next(x for x in lines if x.startswith("node-01") and x.split()[1] == "1")
    assert "20.0G/80.0G" in row1 and "bob:python(5101)" in row1 and "in-use" in row1
    row2 = next(x for x in lines if x.startswith("node-01") and x.split()[1] == "2")
    assert "alice" in row2 and "reserved-idle" in row2
    devices = _json(lab.cli("status", "--json", token="bob"))
    assert [d["index"] for d in devices] == [0, 1, 2, 3] and devices[2]["holder"]["user"] == "alice"


def test_env_prints_exports_that_bash_evaluates(lab):
    r = lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [lab.devices[2], 0], "start": "now",
                                                         "duration": "PT1H"})
    assert r.status_code == 201
    script = 'eval "$(gpuroster env --host node-01)"; echo "$CUDA_VISIBLE_DEVICES"; echo "$CUDA_DEVICE_ORDER"; echo "$GPUROSTER_RESERVATION_ID"'
    out = subprocess.run(["bash", "-c", script], env={**lab.env(lab.alice), "PATH": f"{BIN}:{os.environ['PATH']}"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{lab.devices[0]},{lab.devices[2]}", "PCI_BUS_ID", str(r.json()["id"])]
    # docker: the --gpus value with its quotes, as docker expects it
    script = 'eval "set -- $(gpuroster env --docker --host node-01)"; printf "%s\\n" "$@"'
    out = subprocess.run(["bash", "-c", script], env={**lab.env(lab.alice), "PATH": f"{BIN}:{os.environ['PATH']}"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["--gpus", f'"device={lab.devices[0]},{lab.devices[2]}"',
                                       "--label", "org.gpuroster.user=alice"]
    # no active reservation: nothing on stdout, exit 1
    out = lab.cli("env", "--host", "node-01", token="bob")
    assert out.returncode == 1 and out.stdout == "" and "no active reservation" in out.stderr


def test_env_finds_this_machine_by_its_hostname(lab, server):
    name = socket.gethostname().split(".")[0]
    from app.services import hosts as host_service

    engine = build_engine(Settings(database_url=server.db_url))
    try:
        host_token = run_in_transaction(build_session_factory(engine), lambda s: host_service.create_host(s, name=name)[1])
    except Exception as e:  # noqa: BLE001 - an unusual hostname the service refuses
        pytest.skip(f"hostname {name!r} cannot be a host name: {e}")
    finally:
        engine.dispose()
    uuid = "GPU-77777777-0000-0000-0000-000000000007"
    httpx.post(lab.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {host_token}"},
               json=snapshot_body(name, 1, [gpu(uuid, 0)]))
    assert lab.api("POST", "/reservations", lab.alice, json={"host": name, "devices": [0], "start": "now",
                                                            "duration": "PT1H"}).status_code == 201
    out = lab.cli("env")
    assert out.returncode == 0 and f"export CUDA_VISIBLE_DEVICES={uuid}" in out.stdout


def test_usage_table_and_json(lab):
    assert lab.api("POST", "/rules", lab.admin, json={"scope": "default", "max_devices": 3,
                                                     "max_duration_seconds": 8 * 3600}).status_code == 201
    assert lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [0], "start": "now",
                                                            "duration": "PT1H"}).status_code == 201
    out = lab.cli("usage")
    assert out.returncode == 0
    row = next(x for x in out.stdout.splitlines() if x.startswith("max_devices"))
    assert row.split()[:5] == ["max_devices", "3", "1", "2", "default"]
    assert any(x.startswith("max_duration_seconds") and " 8h " in x for x in out.stdout.splitlines())
    doc = _json(lab.cli("usage", "--json"))
    assert doc["timezone"] == "Europe/Berlin"


# ---------------------------------------------------------------------------- run


PY = sys.executable


def test_run_reserves_runs_with_the_environment_and_releases_with_the_exit_status(lab):
    code = "import os,sys; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER']); sys.exit(3)"
    out = lab.cli("run", "-n", "1", "--for", "1h", "--host", "node-01", "--", PY, "-c", code)
    assert out.returncode == 3, out.stderr
    [r] = _mine(lab)
    assert r["state"] == "released"
    assert out.stdout.split() == [r["cuda_visible_devices"], "PCI_BUS_ID"]
    out = lab.cli("run", "--for", "1h", "--host", "node-01", "--", "/nonexistent/command")
    assert out.returncode == 127 and "cannot start" in out.stderr
    assert {x["state"] for x in _mine(lab)} == {"released"}


def test_run_docker_passes_the_gpus_and_the_owner_label_after_run(lab):
    fake = lab.tmp / "bin" / "docker"  # stands in for the docker client: prints the argv it got
    fake.parent.mkdir()
    fake.write_text(f"#!{PY}\nimport sys; print('\\n'.join(sys.argv[1:]))\n")
    fake.chmod(0o755)
    out = lab.cli("run", "--docker", "--for", "1h", "--host", "node-01", "--", str(fake), "run", "--rm", "img", "nvidia-smi")
    assert out.returncode == 0, out.stderr
    [r] = _mine(lab)
    assert out.stdout.splitlines() == ["run", "--gpus", f'"device={r["cuda_visible_devices"]}"',
                                       "--label", "org.gpuroster.user=alice", "--rm", "img", "nvidia-smi"]
    out = lab.cli("run", "--docker", "--for", "1h", "--host", "node-01", "--", PY, "train.py")
    assert out.returncode == 2 and "docker run" in out.stderr


def test_status_says_which_hosts_are_replays_of_captures(lab, server):
    from app.services import hosts as host_service

    engine = build_engine(Settings(database_url=server.db_url))
    token = run_in_transaction(build_session_factory(engine), lambda s: host_service.create_host(s, name="lab-replay")[1])
    engine.dispose()
    r = httpx.post(server.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {token}"},
                   json=snapshot_body("lab-replay", 1, [gpu("GPU-7777cccc-0000-0000-0000-000000000007", 0)],
                                      source="replay", replay_of=["k80.xml"]))
    assert r.status_code == 200, r.text
    out = lab.cli("status")
    assert out.returncode == 0, out.stderr
    assert "lab-replay: replay of k80.xml (recorded captures, not live GPUs)" in out.stdout
    assert "node-01: replay" not in out.stdout


def test_status_names_unattributed_containers_and_unknown_uids(lab, server):
    from app.services import hosts as host_service

    engine = build_engine(Settings(database_url=server.db_url))
    token = run_in_transaction(build_session_factory(engine), lambda s: host_service.create_host(s, name="node-02")[1])
    engine.dispose()
    dev = gpu("GPU-5555cccc-0000-0000-0000-000000000005", 0)
    procs = [{"device_uuid": dev["uuid"], "pid": 41001, "uid": 0, "name": "python", "owner_status": "unattributed",
              "container_id": "f" * 64, "used_memory_mib": 1024.0},
             {"device_uuid": dev["uuid"], "pid": 20011, "uid": 20001, "name": "python", "owner_status": "uid_only"}]
    r = httpx.post(server.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {token}"},
                   json=snapshot_body("node-02", 1, [dev], procs))
    assert r.status_code == 200, r.text
    out = lab.cli("status", "--host", "node-02", token="bob")
    assert out.returncode == 0, out.stderr
    assert "[unattributed container]:python(41001)" in out.stdout
    assert "[uid 20001, unknown to gpuroster]:python(20011)" in out.stdout and "in-use" in out.stdout
def test_run_with_id_off_the_gpu_host_runs_like_env_with_id(lab):
    """This machine is no GPU host the server knows: ``run --id`` uses the reservation's own
    devices (as ``env --id`` prints them) instead of refusing, and keeps the reservation it
    did not make."""
    r = lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [3], "start": "now",
                                                         "duration": "PT1H"}).json()
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    out = lab.cli("run", "--id", str(r["id"]), "--", PY, "-c", code)
    assert out.returncode == 0, out.stderr
    env = lab.cli("env", "--id", str(r["id"]))
    assert f"CUDA_VISIBLE_DEVICES={out.stdout.strip()}" in env.stdout and out.stdout.strip() == lab.devices[3]
    assert lab.api("GET", f"/reservations/{r['id']}", lab.alice).json()["state"] == "active"
    out = lab.cli("run", "--id", str(r["id"]), "--host", "node-02", "--", PY, "-c", code)
    assert out.returncode == 1 and "not on this host (node-02)" in out.stderr
    out = lab.cli("run", "--id", str(r["id"]), "-n", "2", "--", PY, "-c", code)  # more than it holds: refused, not ignored
    assert out.returncode == 2 and f"reservation #{r['id']} has 1 GPU(s), fewer than -n 2" in out.stderr, out.stderr


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_passes_ctrl_c_and_sigterm_to_the_command_then_releases(lab, sig, expected):
    ready = lab.tmp / "ready"
    code = ("import pathlib,signal,sys,time\n"
            "p = pathlib.Path(sys.argv[1])\n"
            "signal.signal(signal.SIGTERM, lambda *a: (p.write_text('terminated'), sys.exit(143)))\n"
            "p.write_text('ready')\n"
            "try:\n    time.sleep(60)\n"
            "except KeyboardInterrupt:\n    p.write_text('interrupted'); raise\n")
    proc = subprocess.Popen([str(BIN / "gpuroster"), "run", "-n", "2", "--for", "1h", "--host", "node-01", "--",
                             PY, "-c", code, str(ready)], env=lab.env(lab.alice), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text() == "ready"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    [r] = _mine(lab)
    assert r["state"] == "active" and len(r["devices"]) == 2
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == expected, err
    assert ready.read_text() == ("interrupted" if sig == signal.SIGINT else "terminated")
    [r] = _mine(lab)
    assert r["state"] == "released" and "released" in err


def test_run_waits_for_the_start_and_reuses_an_active_reservation(lab):
    # bob holds every GPU for 3 more seconds: run has to wait for the start
    r = lab.api("POST", "/reservations", lab.bob, json={"host": "node-01", "devices": [0, 1, 2, 3], "start": "now",
                                                       "duration": "PT3S"})
    assert r.status_code == 201, r.text
    t0 = time.monotonic()
    out = lab.cli("run", "--for", "10m", "--host", "node-01", "--", PY, "-c", "print('ran')")
    assert out.returncode == 0 and out.stdout.strip() == "ran", out.stderr
    assert "waiting for" in out.stderr and time.monotonic() - t0 >= 1.5
    [mine] = _mine(lab)
    assert mine["state"] == "released" and datetime.fromisoformat(mine["start"]) >= datetime.fromisoformat(r.json()["end"])
    # an active reservation of the caller is reused and kept
    held = lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [3], "start": "now",
                                                            "duration": "PT1H"}).json()
    out = lab.cli("run", "--host", "node-01", "--", PY, "-c", "import os; print(os.environ['GPUROSTER_RESERVATION_ID'])")
    assert out.returncode == 0 and out.stdout.strip() == str(held["id"])
    assert f"using your reservation #{held['id']} (GPU 3) until" in out.stderr
    assert lab.api("GET", f"/reservations/{held['id']}", lab.alice).json()["state"] == "active"
    lab.api("POST", f"/reservations/{held['id']}/release", lab.alice)
    # a reused reservation of two GPUs and -n 1: the command sees one of them; --for does not change it
    pair = lab.api("POST", "/reservations", lab.alice, json={"host": "node-01", "devices": [2, 3], "start": "now",
                                                            "duration": "PT1H"}).json()
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    out = lab.cli("run", "-n", "1", "--for", "2h", "--host", "node-01", "--", PY, "-c", code)
    assert out.returncode == 0 and out.stdout.strip() == lab.devices[2], (out.stdout, out.stderr)
    assert f"using GPU 2 of your reservation #{pair['id']} (GPU 2,3) until" in out.stderr
    assert "--for applies to a new reservation only" in out.stderr
    after = lab.api("GET", f"/reservations/{pair['id']}", lab.alice).json()
    assert after["state"] == "active" and after["end"] == pair["end"]
    out = lab.cli("run", "--host", "node-01", "--", PY, "-c", code)  # without -n: all of its GPUs
    assert out.stdout.strip() == f"{lab.devices[2]},{lab.devices[3]}", out.stderr
    lab.api("POST", f"/reservations/{pair['id']}/release", lab.alice)
    # nothing to reuse and no --for: a usage error naming the option
    out = lab.cli("run", "-n", "2", "--host", "node-01", "--", "true")
    assert out.returncode == 2 and "--for" in out.stderr


def test_status_names_a_quarantined_gpu_and_its_reason(lab, server):
    from app.services import hosts as host_service

    engine = build_engine(Settings(database_url=server.db_url))
    token = run_in_transaction(build_session_factory(engine), lambda s: host_service.create_host(s, name="node-03")[1])
    engine.dispose()
    dev = gpu("GPU-6666dddd-0000-0000-0000-000000000006", 0, health_checks=[{"kind": "xid", "state": "bad", "value": 79}])
    r = httpx.post(server.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {token}"},
                   json=snapshot_body("node-03", 1, [dev]))
    assert r.status_code == 200, r.text
    out = lab.cli("status", "--host", "node-03", token="bob")
    assert out.returncode == 0, out.stderr
    assert "[quarantined: XID 79 error]" in out.stdout
