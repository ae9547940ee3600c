"""The ``curl`` examples of docs/lifecycle.md, run in order by bash against a live
``gpuroster serve`` (SQLite and PostgreSQL): each ``sh`` block's output must equal the
``text`` block that follows it."""

from __future__ import annotations

import re
import shutil
import subprocess

import httpx
import pytest

from app.config import Settings
from app.db import build_engine, build_session_factory, run_in_transaction
from tests.conftest import REPO, gpu, snapshot_body
from testkit.live import gpuroster_env, live_server

DOC = REPO / "docs" / "lifecycle.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
MARK = "@@@ next block @@@"


def examples() -> list[tuple[str, list[str]]]:
    """(script, expected output lines) for every ``sh`` block that is not the setup."""
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]
    out = []
    for i, (lang, body) in enumerate(blocks):
        if lang != "sh" or body.startswith("# setup"):
            continue
        lang_next, expected = blocks[i + 1]
        assert lang_next == "text", f"sh block {body[:40]!r} has no text block after it"
        out.append((body, expected.strip().splitlines()))
    return out


def test_doc_has_examples_for_each_part():
    text = "\n".join(s for s, _ in examples())
    for needle in ("Idempotency-Key", "fold", "/release", "DELETE", "/me/password", '"active": false', "/approve",
                   "/deny", "/approvals", "/maintenance", '"override": true', "/api/v1/waitlist"):
        assert needle in text


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None, reason="needs curl and jq")
def test_curl_examples_run_against_a_live_server(db_url, tmp_path):
    from app.services import hosts as host_service
    from app.services import users as user_service

    engine = build_engine(Settings(database_url=db_url))

    def work(s):
        alice = user_service.create_user(s, username="alice", password="correct horse battery")
        boss = user_service.create_user(s, username="boss", admin=True)
        return (user_service.create_api_token(s, user=alice)[1], user_service.create_api_token(s, user=boss)[1],
                host_service.create_host(s, name="node-01")[1])

    token, admin_token, host_token = run_in_transaction(build_session_factory(engine), work)
    engine.dispose()
    env = gpuroster_env(db_url, tmp_path / "data", GPUROSTER_TIMEZONE="Europe/Berlin")
    with live_server(env, migrate=False, log=tmp_path / "server.log") as url:
        devices = [gpu(f"GPU-{i}{i}{i}{i}ffff-0000-0000-0000-00000000000{i}", i) for i in range(4)]
        r = httpx.post(url + "/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices),
                       headers={"Authorization": f"Bearer {host_token}"}, timeout=10)
        assert r.status_code == 200, r.text
        cases = examples()
        script = "set -euo pipefail\n" + "".join(f"echo '{MARK}'\n{body}\n" for body, _ in cases)
        shell_env = {"PATH": "/usr/bin:/bin", "GPUROSTER": url, "TOKEN": token, "ADMIN_TOKEN": admin_token, "TZ": "UTC"}
        run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=shell_env, capture_output=True, text=True,
                             timeout=120)
    outputs = run.stdout.split(MARK + "\n")[1:]
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert len(outputs) == len(cases)
    for (body, expected), got in zip(cases, outputs, strict=True):
        assert got.strip().splitlines() == expected, f"{body}\n---\n{got}\n{run.stderr}"
