"""The demo's pieces in-process: its owners map fits the bundled captures, its seeding is
idempotent, and its reservations put every Now-page state on the replayed devices."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from app import demo
from app.db import run_in_transaction
from app.models import Host, User
from app.security import token_hash, verify_password
from app.services.hosts import HOST_RE
from testkit.ports import free_port


def test_every_bundled_capture_is_replayed_under_its_own_valid_host_name():
    captures = demo.bundled_captures()
    assert captures, "the agent package bundles captures"
    names = [demo.replay_host_name(c) for c in captures]
    assert len(set(names)) == len(names)
    for n in names:
        assert HOST_RE.match(n) and n.startswith("replay-"), n


def test_owners_map_names_every_pid_of_the_bundled_captures():
    """If a capture is added or changed, the demo's owners map must follow (else its
    processes show 'owner unknown' and the demo loses its states)."""
    from agent.replay import parse_capture

    owners = demo.owners_map()
    pids = {p.pid for c in demo.bundled_captures() for p in parse_capture(c.read_bytes(), c.name).processes}
    assert pids == {int(k) for k in owners}
    demo_users = {name for name, _, _ in demo.DEMO_USERS}
    assert {v["user"] for v in owners.values()} <= demo_users
    assert demo.UNRESERVED_USER in {v["user"] for v in owners.values()}, "one process must become a finding"


def test_owners_map_is_what_the_agent_reads(tmp_path):
    from agent.replay import load_owners

    path = tmp_path / "owners.json"
    path.write_text(json.dumps({"_comment": "x", **demo.owners_map()}))
    loaded = load_owners(path)
    assert loaded[58642]["user"] == "bob" and loaded[58642]["uid"] == 2002


def test_seeding_is_idempotent_and_host_tokens_follow_the_database(session_factory, tmp_path):
    first = run_in_transaction(session_factory, demo.ensure_admin)
    assert first.created and len(first.password) >= 12 and first.token.startswith("gpr_")
    again = run_in_transaction(session_factory, demo.ensure_admin)
    assert not again.created and again.password is None
    with session_factory() as s:
        admin = s.scalar(select(User).where(User.username == demo.ADMIN))
        assert admin.is_admin and admin.password_hash and first.password not in admin.password_hash

    made = run_in_transaction(session_factory, demo.ensure_demo_users)
    assert list(made) == ["alice", "bob", "carol", "dave"] and all(len(pw) >= 12 for pw in made.values())
    assert run_in_transaction(session_factory, demo.ensure_demo_users) == {}
    with session_factory() as s:  # they can sign in with the printed password
        alice = s.scalar(select(User).where(User.username == "alice"))
        assert verify_password(made["alice"], alice.password_hash) and made["alice"] not in alice.password_hash

    token_file = tmp_path / "agents" / "h1" / "token"
    assert run_in_transaction(session_factory, lambda s: demo.ensure_host(s, name="h1", token_file=token_file))
    token = token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o077 == 0, "the host token is readable by its owner only"
    with session_factory() as s:
        host = s.scalar(select(Host).where(Host.name == "h1"))
        assert host.token_hash == token_hash(token)
        assert (host.policy, host.grace_seconds) == (demo.DEMO_POLICY, demo.DEMO_GRACE_SECONDS)
    assert not run_in_transaction(session_factory, lambda s: demo.ensure_host(s, name="h1", token_file=token_file))
    assert token_file.read_text().strip() == token, "a valid token file is kept"
    token_file.write_text("gph_from-an-older-database\n")
    run_in_transaction(session_factory, lambda s: demo.ensure_host(s, name="h1", token_file=token_file))
    with session_factory() as s:
        assert s.scalar(select(Host.token_hash).where(Host.name == "h1")) == token_hash(token_file.read_text().strip())


def _post_replayed(client, captures: list[Path], owners: Path, tokens: dict[str, str]) -> None:
    from agent.collect import SnapshotBuilder
    from agent.replay import ReplaySource

    for cap in captures:
        name = demo.replay_host_name(cap)
        snap = SnapshotBuilder(ReplaySource([cap], owners), host=name, interval=3).build(1, datetime.now(UTC))
        assert snap.source == "replay" and snap.replay_of == [cap.name]
        r = client.post("/api/v1/agent/snapshots", content=snap.model_dump_json(),
                        headers={"Authorization": f"Bearer {tokens[name]}", "Content-Type": "application/json"})
        assert r.status_code == 200, r.text


def test_planned_reservations_show_every_now_page_state(client, session_factory, settings, tmp_path):
    admin = run_in_transaction(session_factory, demo.ensure_admin)
    run_in_transaction(session_factory, demo.ensure_demo_users)
    captures = demo.bundled_captures()
    tokens = {}
    for cap in captures:
        name = demo.replay_host_name(cap)
        f = tmp_path / name / "token"
        run_in_transaction(session_factory, lambda s, n=name, f=f: demo.ensure_host(s, name=n, token_file=f))
        tokens[name] = f.read_text().strip()
    owners = tmp_path / "owners.json"
    owners.write_text(json.dumps(demo.owners_map()))
    _post_replayed(client, captures, owners, tokens)

    now = datetime.now(UTC)
    hosts = sorted(tokens)
    plan = run_in_transaction(session_factory, lambda s: demo.plan_reservations(s, hosts=hosts, now=now))
    done = run_in_transaction(session_factory, lambda s: demo.ensure_reservations(s, plan=plan, settings=settings, now=now))
    assert done and all(outcome.startswith("booked #") for _, outcome in done), done
    again = run_in_transaction(session_factory, lambda s: demo.ensure_reservations(
        s, plan=demo.plan_reservations(s, hosts=hosts, now=now), settings=settings, now=now))
    assert all(outcome == "exists" for _, outcome in again), again

    auth = {"Authorization": f"Bearer {admin.token}"}
    devices = client.get("/api/v1/devices", headers=auth).json()
    states = {d["status"] for d in devices}
    assert {"free", "reserved-idle", "in-use"} <= states, states
    for d in devices:
        users = {p["unix_user"] for p in d["processes"]}
        if "bob" in users:
            assert d["holder"] is None, "bob's process runs without a reservation: the finding to be"
        elif users:
            assert d["holder"] and d["holder"]["user"] in users, "in use by the holder"
    assert any(d["next_reservation"] and d["status"] == "free" for d in devices), "a free device booked later"

    # a user releases (or cancels) a demo booking: the next start of the demo leaves it ended
    first_id = int(done[0][1].removeprefix("booked #"))
    assert client.delete(f"/api/v1/reservations/{first_id}", headers={"Authorization": f"Bearer {admin.token}"}).status_code == 200
    later = datetime.now(UTC)
    third = run_in_transaction(session_factory, lambda s: demo.ensure_reservations(
        s, plan=demo.plan_reservations(s, hosts=hosts, now=later), settings=settings, now=later))
    ended = [p for p, outcome in third if outcome == "ended by a user; not booked again"]
    assert [(p.user, p.uuids) for p in ended] == [(done[0][0].user, done[0][0].uuids)], third
    assert not any(outcome.startswith("booked #") for _, outcome in third), third

    replayed = client.get("/api/v1/hosts", headers=auth).json()
    assert {h["name"]: h["source"] for h in replayed} == {n: "replay" for n in hosts}


def test_demo_refuses_a_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        lines: list[str] = []
        d = demo.Demo(data_dir=tmp_path, port=port, out=lines.append)
        assert d.run() == 2
        assert "in use" in lines[-1]
    assert not (tmp_path / "gpuroster.db").exists(), "nothing is set up before the port is known free"


def test_demo_source_nvml_without_gpus_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "nvml_device_count", lambda: (0, "NVML unavailable (test)"))
    lines: list[str] = []
    d = demo.Demo(data_dir=tmp_path, port=free_port(), source="nvml", out=lines.append)
    assert d.run() == 2
    assert lines[-1] == "error: --source nvml, but NVML unavailable (test)"


def test_demo_with_gpus_monitors_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "nvml_device_count", lambda: (2, "NVML sees 2 GPU(s)"))
    d = demo.Demo(data_dir=tmp_path, port=free_port())
    agents, why = d.choose_agents()
    assert len(agents) == 1 and agents[0].capture is None and "2 GPU" in why
    args = d.agent_args(agents[0], tmp_path / "agent.toml", tmp_path / "owners.json")
    assert "--replay" not in args and args[args.index("--host") + 1] == agents[0].host


def test_cli_rejects_an_unknown_source():
    from typer.testing import CliRunner

    from app.cli import cli

    result = CliRunner().invoke(cli, ["demo", "--source", "bogus"])
    assert result.exit_code == 2
    assert "--source" in result.output
