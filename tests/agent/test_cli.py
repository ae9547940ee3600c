"""Configuration layering and the command line: --print, --once, exit codes and hints."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import agent.main as agent_main
from agent.client import ServiceClient
from agent.config import load_settings
from agent.nvml import NvmlSource
from agent.owners import OwnerResolver
from agent.schema import HostPolicy, Snapshot, SnapshotAck
from testkit.fake_nvml import b09_version_mismatch, b10_no_library, b15_graphics_and_compute

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "agent" / "captures"


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch, tmp_path):
    for var in ("GPUROSTER_AGENT_SERVER", "GPUROSTER_AGENT_INTERVAL", "GPUROSTER_AGENT_HOST", "GPUROSTER_AGENT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("agent.config.DEFAULT_CONFIG", tmp_path / "absent.toml")


def test_flags_beat_environment_beat_toml_beat_defaults(tmp_path, monkeypatch):
    toml = tmp_path / "agent.toml"
    toml.write_text('server = "http://from-toml:8000"\ninterval = 30\nhost = "toml-host"\nhide_args = true\n'
                    'replay = ["a.xml", "b.xml"]\n')
    monkeypatch.setenv("GPUROSTER_AGENT_INTERVAL", "10")
    monkeypatch.setenv("GPUROSTER_AGENT_HOST", "env-host")
    s = load_settings({"host": "flag-host", "server": None}, toml)
    assert s.host == "flag-host"  # flag
    assert s.interval == 10  # env over toml
    assert s.server == "http://from-toml:8000" and s.hide_args is True  # toml over default
    assert s.replay == [Path("a.xml"), Path("b.xml")]
    assert s.state_dir == Path("/var/lib/gpuroster-agent") and s.dry_run is False  # defaults


def test_toml_agent_table_and_bad_values(tmp_path):
    toml = tmp_path / "agent.toml"
    toml.write_text('[agent]\nserver = "https://svc.example"\nexpect_gpus = true\n')
    s = load_settings({}, toml)
    assert s.server == "https://svc.example" and s.expect_gpus is True
    toml.write_text('server = "svc.example"\n')
    with pytest.raises(ValueError, match="http"):
        load_settings({}, toml)
    toml.write_text('tokn_file = "/x"\n')
    with pytest.raises(ValueError, match="tokn_file"):
        load_settings({}, toml)
    with pytest.raises(FileNotFoundError):
        load_settings({}, tmp_path / "missing.toml")


def test_token_is_never_a_flag():
    with pytest.raises(SystemExit):
        agent_main.parse_args(["--token", "secret"])


def test_print_replay_prints_a_snapshot(capsys):
    rc = agent_main.main(["--print", "--replay", str(CAPTURES / "telegraf__a100-sxm4-v12.xml"),
                          "--replay-owners", str(CAPTURES / "owners.example.json"), "--host", "node-01"])
    out = capsys.readouterr().out
    snap = Snapshot.model_validate_json(out)
    assert rc == 0
    assert snap.host == "node-01" and snap.source == "replay" and snap.replay_of == ["telegraf__a100-sxm4-v12.xml"]
    assert len(snap.devices) == 5 and sum(1 for d in snap.devices if d.parent_uuid) == 4


def _fake_nvml_source(fake):  # noqa: ANN001, ANN202
    def build_source(settings):  # noqa: ANN001, ANN202
        source = NvmlSource(lib=fake, expect_gpus=settings.expect_gpus, driver_present=lambda: False, pid_max=4_194_304)
        return source, True, OwnerResolver()
    return build_source


@pytest.mark.parametrize(("fake", "status", "hint"), [
    (b10_no_library, "no_driver", "no NVIDIA driver"),
    (b09_version_mismatch, "down", "reboot"),
])
def test_print_exits_non_zero_with_hint_when_nvml_is_missing(monkeypatch, capsys, fake, status, hint):
    monkeypatch.setattr(agent_main, "build_source", _fake_nvml_source(fake()))
    rc = agent_main.main(["--print"])
    captured = capsys.readouterr()
    assert rc != 0
    assert Snapshot.model_validate_json(captured.out).monitoring.status == status
    assert hint in captured.err


def test_print_nvml_missing_with_expect_gpus_is_misconfigured(monkeypatch, capsys):
    monkeypatch.setattr(agent_main, "build_source", _fake_nvml_source(b10_no_library()))
    rc = agent_main.main(["--print", "--expect-gpus"])
    captured = capsys.readouterr()
    assert rc != 0 and Snapshot.model_validate_json(captured.out).monitoring.status == "misconfigured"
    assert "NVML" in captured.err


def test_print_on_fake_nvml_host(monkeypatch, capsys):
    monkeypatch.setattr(agent_main, "build_source", _fake_nvml_source(b15_graphics_and_compute()))
    assert agent_main.main(["--print", "--hide-args"]) == 0
    snap = Snapshot.model_validate_json(capsys.readouterr().out)
    assert snap.source == "nvml" and len(snap.processes) == 3


def _with_service(monkeypatch, handler):  # noqa: ANN001, ANN202
    real = ServiceClient.__init__

    def init(self, server, token, **kw):  # noqa: ANN001, ANN003
        real(self, server, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(ServiceClient, "__init__", init)


def test_once_replay_posts_one_snapshot_and_exits_zero(tmp_path, monkeypatch, capsys):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers["authorization"], json.loads(request.content)))
        ack = SnapshotAck(accepted=True, seq=seen[-1][1]["seq"], server_time="2026-05-04T09:00:00Z", policy=HostPolicy(), reservations=[])
        return httpx.Response(200, json=ack.model_dump(mode="json"))

    _with_service(monkeypatch, handler)
    token = tmp_path / "host.token"
    token.write_text("tok-123\n")
    token.chmod(0o600)
    rc = agent_main.main(["--replay", str(CAPTURES / "pai__nvidia_smi_out_of_order.xml"), "--replay-owners",
                          str(CAPTURES / "owners.example.json"), "--server", "http://svc.test", "--token-file", str(token),
                          "--state-dir", str(tmp_path / "state"), "--once"])
    assert rc == 0
    (auth, body), = seen
    assert auth == "Bearer tok-123"
    assert body["source"] == "replay" and body["replay_of"] == ["pai__nvidia_smi_out_of_order.xml"]
    assert {p["pid"]: p["unix_user"] for p in body["processes"]} == {58813: "user-a", 58642: "user-b"}
    assert "tok-123" not in capsys.readouterr().out
    assert (tmp_path / "state" / "ack.json").exists()


@pytest.mark.parametrize("status", [401, 503])
def test_once_exits_non_zero_when_the_post_fails(tmp_path, monkeypatch, status):
    _with_service(monkeypatch, lambda request: httpx.Response(status, text="no"))
    token = tmp_path / "host.token"
    token.write_text("tok")
    token.chmod(0o600)
    rc = agent_main.main(["--replay", str(CAPTURES / "pai__nvidia_smi_out_of_order.xml"), "--server", "http://svc.test",
                          "--token-file", str(token), "--state-dir", str(tmp_path / "state"), "--once"])
    assert rc == 1


def test_once_without_server_or_token_file_is_a_usage_error(tmp_path, capsys):
    rc = agent_main.main(["--replay", str(CAPTURES / "pai__nvidia_smi_out_of_order.xml"), "--once"])
    assert rc == 2 and "--token-file" in capsys.readouterr().err


def test_agent_imports_nothing_from_app():
    for path in (REPO / "agent").glob("*.py"):
        text = path.read_text()
        assert "from app" not in text and "import app" not in text, path.name


def test_example_config_and_systemd_unit_agree_with_the_settings():
    s = load_settings({}, REPO / "deploy" / "agent.toml.example")
    assert s.server == "https://gpuroster.lab.example" and s.token_file == Path("/etc/gpuroster/host.token")
    assert s.expect_gpus is True and s.interval == 5
    unit = (REPO / "deploy" / "gpuroster-agent.service").read_text()
    assert "ExecStart=/opt/gpuroster/.venv/bin/gpuroster-agent --config /etc/gpuroster/agent.toml" in unit
    assert "StateDirectory=gpuroster-agent" in unit and str(s.state_dir) == "/var/lib/gpuroster-agent"
