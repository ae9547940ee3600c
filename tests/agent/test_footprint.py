"""What the agent loads and keeps: module sets of a real start and poll, never times or bytes.

A GPU host runs the agent from the base install; a developer's venv also has typer's rich
and click, and the service's packages. Neither may end up in the agent's process.
"""

from __future__ import annotations

import json
import os
import platform
import ssl
import subprocess
import sys
from pathlib import Path

import agent.main as agent_main
from agent import memtrim
from agent.client import ServiceClient
from agent.httpx_lean import tls_verify
from agent.containers import ContainerDirectory
from agent.main import Agent
from tests.agent.conftest import nvml_builder
from tests.agent.test_loop import SimClock
from testkit.fake_nvml import busy_host

REPO = Path(__file__).resolve().parents[2]
# Nothing the agent runs needs these; httpx imports its CLI (click, rich, pygments) unless
# refused (agent/httpx_lean.py), and the service's packages are not installed on GPU hosts.
NOT_IN_THE_AGENT = {"rich", "click", "pygments", "typer", "fastapi", "starlette", "sqlalchemy", "jinja2", "babel",
                    "app", "httpx._main"}
# pydantic_settings imports asyncio for async CLI commands only; agent/settings_lean.py keeps it
# (and concurrent.futures, which only asyncio brought) out until something reads from it.
NOT_IMPORTED_AT_START = {"asyncio", "concurrent", "_asyncio"}

CHILD = """
import json, sys
sys.path.insert(0, {repo!r})
from testkit.fake_nvml import busy_host, patched_pynvml
import agent.main
with patched_pynvml(busy_host(2)):
    rc = agent.main.main(["--print", "--host", "footprint"])
print("MODULES " + json.dumps(sorted(k for k, v in sys.modules.items() if v is not None)))  # None: refused
sys.exit(rc)
"""


def test_a_start_and_poll_of_the_agent_load_no_cli_or_service_packages(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUROSTER_AGENT_")}
    env["GPUROSTER_AGENT_CONFIG"] = str(config)
    out = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO))], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modules = set(json.loads(out.stdout.rpartition("MODULES ")[2]))
    assert '"host": "footprint"' in out.stdout  # the snapshot was built and printed
    assert {"httpx", "pydantic_settings", "agent.collect"} <= modules  # the real wiring ran
    assert {m for m in modules if m.split(".")[0] in NOT_IN_THE_AGENT or m in NOT_IN_THE_AGENT} == set()
    assert {m for m in modules if m.split(".")[0] in NOT_IMPORTED_AT_START} == set()


def test_pydantic_settings_gets_the_real_asyncio_on_first_use_and_others_import_it_as_usual():
    code = """
import sys
import agent.config
import pydantic_settings.main as ps
assert "asyncio" not in sys.modules, "asyncio loaded at import"
run = ps.asyncio.run  # the first read imports the real module
import asyncio
assert run is asyncio.run and sys.modules["asyncio"] is asyncio and asyncio.__spec__ is not None
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_loop_trims_the_heap_after_the_first_poll_and_every_trim_every_polls(tmp_path, monkeypatch):
    trimmed_at: list[int] = []
    monkeypatch.setattr(agent_main, "trim", lambda: trimmed_at.append(agent.seq.next()) or True)
    clock = SimClock()
    agent = Agent(nvml_builder(busy_host(1)), None, state_dir=tmp_path, clock=clock, sleep=clock.sleep)
    agent.run(max_ticks=2 * memtrim.TRIM_EVERY + 1)
    # seq numbers drawn inside trim: one more than the polls before it
    assert [s - i for i, s in enumerate(trimmed_at)] == [1, 1 + memtrim.TRIM_EVERY, 1 + 2 * memtrim.TRIM_EVERY]


def test_trim_is_available_on_glibc_and_never_raises():
    if platform.libc_ver()[0] == "glibc":
        assert memtrim._TRIM is not None
    assert memtrim.trim() in (True, False)


def test_a_container_runtime_client_loads_no_ca_bundle(tmp_path):
    sock = tmp_path / "docker.sock"
    client = ContainerDirectory([sock], state_dirs=[])._client(sock)
    assert str(client.base_url).startswith("http://")  # plain HTTP over the socket: TLS never spoken
    assert client._transport._pool._ssl_context.cert_store_stats()["x509_ca"] == 0


def test_a_service_client_loads_the_ca_bundle_only_where_tls_can_be_spoken(monkeypatch):
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)

    def context(server: str) -> ssl.SSLContext:
        return ServiceClient(server, "token")._client._transport._pool._ssl_context

    plain = context("http://gpuroster.test")
    assert plain.cert_store_stats()["x509_ca"] == 0
    assert plain.verify_mode == ssl.CERT_REQUIRED and plain.check_hostname  # never unchecked TLS
    assert context("https://gpuroster.test").cert_store_stats()["x509_ca"] > 0
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.test:3128")  # a proxy may speak TLS: the bundle again
    assert tls_verify("http://gpuroster.test") is True
