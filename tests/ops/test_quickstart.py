"""The README's quick start on a fresh clone, as a new user would follow it.

``git clone`` the repository (its committed HEAD) into a temporary folder, run
``gpuroster demo --port <free> --data-dir <tmp>`` there in the background, wait for the URL
it prints, sign in with the printed password (the API's password-for-token endpoint and the
web sign-in form), read the Now page and ``/api/v1/devices``, find the devices of every
bundled capture under its replay host and the finding (a process without a reservation),
then stop it with SIGINT and check that no process it started is left.

To stay fast it reuses this checkout's virtual environment instead of running ``./start``
(which would create ``.venv`` and pip-install): the clone's code is put first on
``PYTHONPATH`` so the console scripts run the clone, not this checkout. Set
``GPUROSTER_QUICKSTART_INSTALL=1`` to run ``./start`` exactly as the README says (creates the
clone's own ``.venv`` from the package index; minutes).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import REPO
from tests.test_readme import check_output, readme_block
from testkit.ports import free_port

pytestmark = pytest.mark.slow

FULL_INSTALL = os.environ.get("GPUROSTER_QUICKSTART_INSTALL", "") == "1"


class Output:
    """Collects a process's stdout lines on a thread; ``wait_for`` a regex with a deadline."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()

    def text(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, proc: subprocess.Popen) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if proc.poll() is not None and not self._t.is_alive():
                    raise AssertionError(f"demo exited ({proc.returncode}) before {pattern!r}:\n" + "\n".join(self.lines))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n" + "\n".join(self.lines))
                self._cv.wait(min(left, 0.5))


@pytest.fixture
def clone(tmp_path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    dest = tmp_path / "gpuroster"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(dest)], check=True, timeout=120)
    return dest


def _web_sign_in(client: httpx.Client, password: str) -> None:
    form = client.get("/login")
    assert form.status_code == 200, form.text
    m = re.search(r'name="csrf_token"\s+value="([^"]+)"', form.text) or re.search(r'value="([^"]+)"\s+name="csrf_token"', form.text)
    assert m, "the sign-in form carries a CSRF token"
    r = client.post("/login", data={"username": "admin", "password": password, "csrf_token": m.group(1), "next": "/"})
    assert r.status_code == 303, r.text


def test_readme_quick_start_on_a_fresh_clone(clone, tmp_path):
    from agent.replay import parse_capture

    port = free_port()
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUROSTER_")}
    env["PYTHONUNBUFFERED"] = "1"
    if FULL_INSTALL:
        env.pop("PYTHONPATH", None)  # the clone's own .venv, nothing from this checkout
        args = [str(clone / "start"), "--port", str(port), "--data-dir", str(data)]
    else:
        venv_bin = Path(sys.executable).parent
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(clone)
        args = ["gpuroster", "demo", "--port", str(port), "--data-dir", str(data)]
    from app.demo import nvml_device_count

    if nvml_device_count()[0] > 0:  # a GPU machine would monitor its own GPUs: ask for the replay explicitly
        args += ["--source", "replay"]
    proc = subprocess.Popen(args, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = Output(proc.stdout)
    descendants: dict[int, psutil.Process] = {}
    try:
        url = out.wait_for(r"Open (http://\S+?)/? and sign in", 600 if FULL_INSTALL else 120, proc).group(1)
        password = out.wait_for(r"Admin password \(shown once, stored hashed\): (\S+)", 5, proc).group(1)
        admin_token = out.wait_for(r"Admin API token \(shown once\): (\S+)", 5, proc).group(1)
        member_pw = dict(re.findall(r"(\w+) (\S+)(?:,|$)", out.wait_for(
            r"their passwords \(shown once, stored hashed\): (.+)", 5, proc).group(1)))
        assert url == f"http://127.0.0.1:{port}"
        for child in psutil.Process(proc.pid).children(recursive=True):
            descendants[child.pid] = child
        captures = sorted((clone / "agent" / "captures").glob("*.xml"))
        assert len(captures) >= 3
        assert len(descendants) >= 1 + len(captures), "the service and one agent per capture"

        with httpx.Client(base_url=url, timeout=10) as api:
            # the API token path: the printed password traded for a token
            r = api.post("/api/v1/auth/token", json={"username": "admin", "password": password})
            assert r.status_code == 201, r.text
            api.headers["Authorization"] = f"Bearer {r.json()['token']}"
            hosts = {h["name"]: h for h in api.get("/api/v1/hosts").json()}
            expected: dict[str, set[str]] = {}
            for cap in captures:
                name = "replay-" + re.sub(r"[^a-z0-9_.-]+", "-", cap.stem.replace("__", "-").replace("_", "-").lower()).strip("-")
                assert name in hosts, sorted(hosts)
                assert hosts[name]["source"] == "replay" and hosts[name]["replay_of"] == [cap.name]
                expected[name] = {d.uuid for d in parse_capture(cap.read_bytes(), cap.name).devices}

            deadline = time.monotonic() + 90
            while True:
                devices = api.get("/api/v1/devices").json()
                seen: dict[str, set[str]] = {}
                for d in devices:
                    seen.setdefault(d["host"], set()).add(d["uuid"])
                findings = [(d["host"], p["pid"], p["unix_user"]) for d in devices for p in d["processes"] if p["finding"]]
                if all(seen.get(h, set()) >= uuids for h, uuids in expected.items()) and findings:
                    break
                assert time.monotonic() < deadline, f"devices {seen} / findings {findings} after 90 s:\n{out.text()}"
                time.sleep(1)
            assert ("replay-pai-nvidia-smi-out-of-order", 58642, "bob") in findings
            states = {d["status"] for d in devices}
            assert {"free", "reserved-idle", "in-use", "finding"} <= states, states

            # the README's curl session, verbatim, leaves the demo's own data alone
            def demo_data() -> tuple:
                rs = api.get("/api/v1/reservations", params={"limit": 500}).json()["items"]
                return (sorted((r["id"], r["user"], r["state"], r["start"], r["end"]) for r in rs if r["user"] != "erin"),
                        sorted(u["username"] for u in api.get("/api/v1/users").json() if u["username"] != "erin"),
                        sorted(h["name"] for h in api.get("/api/v1/hosts").json() if h["name"] != "node-42"))

            before = demo_data()
            bins = clone / ".venv" / "bin" if FULL_INSTALL else Path(sys.executable).parent
            script_env = {**env, "ADMIN": admin_token, "SERVER": url, "PATH": f"{bins}{os.pathsep}{env['PATH']}"}
            run = subprocess.run(["bash", "-c", "set -euo pipefail\n" + readme_block()], cwd=clone, env=script_env,
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
            try:
                check_output(run.stdout)
            except AssertionError as e:
                raise AssertionError(f"README session output:\n{run.stdout}\n{run.stderr[-2000:]}") from e
            assert demo_data() == before

        with httpx.Client(base_url=url, timeout=10) as member:  # a demo user signs in with the printed password
            assert sorted(member_pw) == ["alice", "bob", "carol", "dave"]
            r = member.post("/api/v1/auth/token", json={"username": "carol", "password": member_pw["carol"]})
            assert r.status_code == 201, r.text

        with httpx.Client(base_url=url, timeout=10) as browser:
            _web_sign_in(browser, password)
            now_page = browser.get("/")
            assert now_page.status_code == 200
            for name in expected:
                assert name in now_page.text
            assert "replay" in now_page.text.lower()
            assert "58642" in now_page.text or "unreserved" in now_page.text.lower()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            raise AssertionError("the demo did not stop within 60 s of SIGINT:\n" + out.text()) from None
        time.sleep(0.5)
        left = [p.pid for p in descendants.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 0, out.text()
    assert left == [], f"processes left after Ctrl-C: {left}"
    assert "gpuroster demo stopped." in out.text()
