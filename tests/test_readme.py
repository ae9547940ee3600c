"""The README's curl session, run verbatim by bash against a live server, on both databases."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.live import gpuroster_env, live_server, run_cli

REPO = Path(__file__).resolve().parents[1]


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- readme-curl:begin -->\s*```sh\n(.*?)```\s*<!-- readme-curl:end -->", text, re.S)
    assert m, "README.md lost its curl example block"
    return m.group(1)


@pytest.mark.slow
def test_readme_curl_session(db_url, tmp_path):
    if shutil.which("curl") is None:
        pytest.fail("curl is needed for the README test (apt-get install curl)")
    env = gpuroster_env(db_url, tmp_path / "data", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    run_cli(["admin", "create-user", "admin", "--admin", "--no-password"], env)  # the demo's admin name
    env["ADMIN"] = run_cli(["admin", "create-token", "admin"], env)
    work = tmp_path / "work"
    work.mkdir()
    script = "set -euo pipefail\n" + readme_block()
    with live_server(env, migrate=False) as url:
        env["SERVER"] = url
        out = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    check_output(out.stdout)


def check_output(lines: str) -> None:
    """What the README session prints: the user, the booking, the conflict, the devices, the cancel."""
    assert '"username":"erin"' in lines
    answers = [line for line in lines.splitlines() if line.startswith(("{", "["))]
    assert len(answers) == 6, lines  # each printed answer on a line of its own, whole
    for line in answers:
        json.loads(line)
    assert '"cuda_visible_devices":"GPU-' in lines  # the 201 booking
    assert '"status":409' in lines and '"earliest_free_start"' in lines  # the conflict
    assert '"host":"node-42"' in lines and '"index":3' in lines  # the four GPUs it reported
    assert '"state":"cancelled"' in lines
