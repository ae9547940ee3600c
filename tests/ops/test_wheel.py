"""The built wheel, installed as a user would: an agent-only install, then the service.

The tracked files are copied to a scratch folder (a fresh clone's view: no ``.venv``, no
build leftovers), ``pip wheel`` builds the wheel there, and a new virtual environment gets:

1. the wheel alone (the agent): ``agent.main`` imports and ``gpuroster-agent --help`` runs
   while FastAPI, SQLAlchemy and Jinja2 are absent;
2. the wheel with ``[server]``: ``gpuroster migrate`` and ``gpuroster demo`` run from a folder
   outside the repository, so templates, static files, migrations and ``alembic.ini`` must
   come from the installed package; ``/healthz`` and ``/`` (via the sign-in page) answer, and
   the sign-in page speaks Chinese to a Chinese browser (the catalogs are package data).

Packages come from the package index (pip's cache makes reruns quick).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from testkit.ports import free_port

pytestmark = pytest.mark.slow

SERVER_ONLY = ("fastapi", "sqlalchemy", "jinja2", "alembic", "uvicorn")


def _tracked_copy(dest: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:  # noqa: ANN003
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _tracked_copy(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(src)], timeout=600)
    (found,) = dist.glob("gpuroster-*.whl")
    return found


def test_wheel_carries_templates_static_files_migrations_and_alembic_ini(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("app/alembic.ini", "app/migrations/env.py", "app/migrations/script.py.mako",
                   "app/migrations/versions/0001_initial_schema.py", "app/templates/base.html",
                   "app/static/htmx.min.js", "app/static/app.css", "agent/captures/SOURCES.md",
                   "app/static/favicon.svg", "app/static/swagger-init.js", "app/static/vendor/SOURCES.md",
                   "app/static/vendor/swagger-ui/swagger-ui-bundle.js", "app/static/vendor/swagger-ui/LICENSE",
                   "app/static/vendor/redoc/redoc.standalone.js", "app/static/vendor/redoc/LICENSE",
                   "app/locale/zh_CN/LC_MESSAGES/messages.po"):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_agent_install_then_server_install_from_the_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    # without a pip of its own (installing one into a new environment took 7 s of the test's CPU):
    # the test's pip installs into it with --python, the same packages a user's pip would
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    py, bindir = venv / "bin" / "python", venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUROSTER_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    # --no-compile: the interpreter compiles what it imports when it imports it; byte-compiling
    # every file of every installed package up front only costs this test CPU time
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--disable-pip-version-check",
           "--no-compile"]

    # 1. the agent alone
    _run(pip + [str(wheel)], env=env, timeout=600)
    probe = ("import importlib.util, agent.main; "
             f"print(sorted(m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is not None))")
    assert _run([str(py), "-c", probe], env=env, cwd=tmp_path).stdout.strip() == "[]"
    assert "--server" in _run([str(bindir / "gpuroster-agent"), "--help"], env=env, cwd=tmp_path).stdout

    # 2. the service
    _run(pip + [f"{wheel}[server]"], env=env, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env["GPUROSTER_DATABASE_URL"] = f"sqlite:///{work / 'migrated.db'}"
    assert "database at head" in _run([str(bindir / "gpuroster"), "migrate"], env=env, cwd=work, timeout=120).stdout
    del env["GPUROSTER_DATABASE_URL"]

    port = free_port()
    env["PYTHONUNBUFFERED"] = "1"
    log = (tmp_path / "demo.log").open("w")
    proc = subprocess.Popen([str(bindir / "gpuroster"), "demo", "--port", str(port), "--data-dir", str(work / "data"),
                             "--source", "replay"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "demo.log").read_text()
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()
            time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=10, follow_redirects=True) as browser:
            page = browser.get("/", headers={"Accept": "text/html"})
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert re.search(r'name="csrf_token"', page.text), "a signed-out browser lands on the sign-in form"
            zh = browser.get("/login", headers={"Accept": "text/html", "Accept-Language": "zh-CN"})
            assert "<h1>登录</h1>" in zh.text, "the Chinese catalog comes with the installed package"
            css = browser.get("/static/app.css")
            assert css.status_code == 200 and css.text.strip()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
