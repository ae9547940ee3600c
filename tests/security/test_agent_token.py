"""D15: the agent refuses a host token file that group or others may read, unless a flag
(or the config/environment equivalent) allows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import read_token

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "agent" / "captures" / "pai__nvidia_smi_out_of_order.xml"


@pytest.mark.parametrize(("mode", "refused"), [(0o600, False), (0o400, False), (0o644, True), (0o640, True),
                                               (0o604, True), (0o620, True)])
def test_read_token_by_mode(tmp_path, mode, refused):
    path = tmp_path / "host.token"
    path.write_text("gph_secret\n")
    path.chmod(mode)
    if refused:
        with pytest.raises(ValueError, match="chmod 600"):
            read_token(path)
        assert read_token(path, allow_readable=True) == "gph_secret"
    else:
        assert read_token(path) == "gph_secret"


def _agent(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    token = tmp_path / "host.token"
    (tmp_path / "none.toml").write_text("")
    # an unreachable service: --once fails its post (1) once the token was accepted
    cmd = [sys.executable, "-m", "agent", "--config", str(tmp_path / "none.toml"), "--replay", str(CAPTURE),
           "--server", "http://127.0.0.1:9", "--token-file", str(token), "--state-dir", str(tmp_path / "state"), "--once",
           *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


def test_d15_world_readable_token_file_refused_with_a_clear_message(tmp_path):
    token = tmp_path / "host.token"
    token.write_text("gph_secret\n")
    token.chmod(0o644)
    r = _agent(tmp_path)
    assert r.returncode == 2
    assert f"token file {token} is accessible to other users (mode 0644)" in r.stderr and "chmod 600" in r.stderr
    assert "gph_secret" not in r.stderr + r.stdout


def test_d15_the_flag_allows_it(tmp_path):
    token = tmp_path / "host.token"
    token.write_text("gph_secret\n")
    token.chmod(0o644)
    r = _agent(tmp_path, "--allow-readable-token-file")
    assert r.returncode == 1, r.stderr  # got past the token: the post to the closed port failed
    assert "accessible to other users" in r.stderr
    import os

    r = _agent(tmp_path, env={**os.environ, "GPUROSTER_AGENT_ALLOW_READABLE_TOKEN_FILE": "true"})
    assert r.returncode == 1, r.stderr
