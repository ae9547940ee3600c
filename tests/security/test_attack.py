"""Attack replay: the D inputs of CASES.md against a live ``gpuroster serve`` (real HTTP,
real processes) on PostgreSQL, each asserting the safe outcome.

D5 database renamed under the running server, D7 chat markup in a command line (webhook to
a local HTTP receiver), D8 terminal escapes in a note read with ``gpuroster list/status``,
D9 CR/LF in a device name (e-mail to a local SMTP server), D10 sign-in throttling with a
rotating ``X-Forwarded-For``, D11 framing and headers, D13 the Book check's CSRF token,
D14 the offender's view of a finding, D15 a world-readable agent token file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from aiosmtpd.controller import Controller

from tests.conftest import PG_SERVER, _create_pg_database, _drop_pg_database, require_pg
from testkit.live import BIN, Seeder, free_port, gpuroster_env, live_server
from tests.security.test_outage import _rename

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery"
D7 = "python <!channel> <http://x.example|click here>"
D8 = "\u001b]0;PWNED\u0007\u001b]52;c;ZWNobyBwd25lZA==\u0007"
G0, G1 = "GPU-0000d0d0-0000-4000-8000-000000000000", "GPU-1111d1d1-0000-4000-8000-000000000000"


class _Hook(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server hook name
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):  # quiet
        pass


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], bytes]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        self.messages.append((list(envelope.rcpt_tos), envelope.content))
        return "250 OK"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A seeded live server on a new PostgreSQL database, with a webhook receiver and an SMTP server."""
    require_pg()
    data_dir = tmp_path_factory.mktemp("attack")
    name = _create_pg_database()
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    box, smtp_port = _Mailbox(), free_port()
    smtp = Controller(box, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    env = gpuroster_env(f"{PG_SERVER}/{name}", data_dir, GPUROSTER_WEBHOOK_URL=f"http://127.0.0.1:{hook.server_port}/hook",
                        GPUROSTER_SMTP_HOST="127.0.0.1", GPUROSTER_SMTP_PORT=str(smtp_port),
                        GPUROSTER_LOGIN_WINDOW_SECONDS="10")
    try:
        with live_server(env, log=data_dir / "serve.log") as url:
            with Seeder(env["GPUROSTER_DATABASE_URL"]) as seed:
                tokens = {user: seed.user(user, email=f"{user}@lab.example", password=PASSWORD)
                          for user in ("alice", "bob", "carol")}
                host = seed.host("node-01")
            yield {"url": url, "env": env, "tokens": tokens, "host": host, "db": name, "hook": _Hook.bodies,
                   "mail": box, "dir": data_dir}
    finally:
        smtp.stop()
        hook.shutdown()
        _drop_pg_database(name)


def _auth(target, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {target['tokens'][user]}"}


def _snapshot(target, seq: int, devices: list[dict], findings: list[dict]) -> None:
    body = {"host": "node-01", "seq": seq, "collected_at": datetime.now(UTC).isoformat(), "devices": devices,
            "processes": [], "findings": findings}
    r = httpx.post(target["url"] + "/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {target['host']}"})
    assert r.status_code == 200, r.text


def _finding(uuid: str, pid: int, *, kind="unreserved", user="alice", command="python train.py", holder=None) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"key": f"{uuid}:{pid}:1.0:{kind}", "kind": kind, "device_uuid": uuid, "pid": pid, "unix_user": user,
            "command": command, "holder": holder, "first_seen": now, "last_seen": now, "state": "notified"}


def _wait(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def test_d7_d9_d14_findings_webhook_mail_and_the_offenders_view(target):
    devices = [{"uuid": G0, "index": 0, "name": "NVIDIA A40\r\nBcc: evil@x.example"}, {"uuid": G1, "index": 1, "name": "NVIDIA A40"}]
    _snapshot(target, 1, devices, [])
    r = httpx.post(target["url"] + "/api/v1/reservations", headers=_auth(target, "bob"),
                   json={"host": "node-01", "devices": [1], "start": "now", "duration": "PT2H"})
    assert r.status_code == 201, r.text
    _snapshot(target, 2, devices, [_finding(G0, 9001, command=D7),
                                   _finding(G1, 9002, kind="foreign", holder="bob", command="python steal.py")])
    # D7: the chat message shows the markup literally
    texts = _wait(lambda: [b["text"] for b in target["hook"] if "9001" in b["text"]])
    assert "<!channel>" not in texts[0] and "<http" not in texts[0] and "&lt;!channel&gt;" in texts[0]
    # D9: both e-mails of the batch are sent; the subject is one line, no injected header
    mails = _wait(lambda: [message_from_bytes(c) for rcpts, c in target["mail"].messages if "alice@lab.example" in rcpts]
                  if len(target["mail"].messages) >= 3 else None)
    assert all(m["Bcc"] is None for m in mails)
    assert any("GPU 0 NVIDIA A40 Bcc: evil@x.example" in " ".join(m["Subject"].split()) for m in mails)
    assert not any("evil@x.example" in rcpts for rcpts, _ in target["mail"].messages)
    # D14: alice, the offender, sees the holder named, never the holder's e-mail address
    items = httpx.get(target["url"] + "/api/v1/findings", headers=_auth(target, "alice")).json()["items"]
    foreign = next(f for f in items if f["kind"] == "foreign")
    assert foreign["holder"] == "bob"
    assert "bob@lab.example" not in json.dumps(items)


def test_d8_terminal_escapes_in_a_note_are_shown_harmlessly_by_list_and_status(target):
    r = httpx.post(target["url"] + "/api/v1/reservations", headers=_auth(target, "carol"),
                   json={"host": "node-01", "devices": [0], "start": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
                         "duration": "PT1H", "note": D8})
    assert r.status_code == 201, r.text
    env = {**target["env"], "GPUROSTER_SERVER": target["url"], "GPUROSTER_TOKEN": target["tokens"]["bob"],
           "XDG_CONFIG_HOME": str(target["dir"] / "cfg")}
    for args in (["list", "--everyone"], ["status"]):
        out = subprocess.run([str(BIN / "gpuroster"), *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\x9b" not in out.stdout, args
    listed = subprocess.run([str(BIN / "gpuroster"), "list", "--everyone"], env=env, capture_output=True, text=True).stdout
    assert "\\x1b]0;PWNED" in listed


def test_d10_rotating_forwarded_for_is_throttled_and_the_password_works_after_the_window(target):
    url = target["url"] + "/api/v1/auth/token"
    codes = [httpx.post(url, json={"username": "carol", "password": "wrong"},
                        headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code for i in range(24)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
    assert httpx.post(url, json={"username": "carol", "password": PASSWORD}).status_code == 429
    time.sleep(10.2)  # GPUROSTER_LOGIN_WINDOW_SECONDS=10
    assert httpx.post(url, json={"username": "carol", "password": PASSWORD}).status_code == 201


def test_d11_d13_headers_framing_and_the_book_checks_token(target):
    with httpx.Client(base_url=target["url"]) as c:
        login = c.get("/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', login.text).group(1)
        assert c.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf, "next": "/"}).status_code == 303
        for path in ("/", "/timeline", "/book", "/me/reservations", "/findings", "/profile", "/reports/usage", "/login"):
            h = c.get(path).headers
            assert h["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in h["content-security-policy"], path
            assert h["x-content-type-options"] == "nosniff" and h["referrer-policy"], path
        book = c.get("/book").text
        assert 'hx-post="/book/check"' in book and not re.search(r'hx-get="/book/check', book)


def test_d15_agent_refuses_a_world_readable_token_file(target, tmp_path):
    token = tmp_path / "host.token"
    token.write_text(target["host"] + "\n")
    token.chmod(0o644)
    (tmp_path / "none.toml").write_text("")
    r = subprocess.run([sys.executable, "-m", "agent", "--config", str(tmp_path / "none.toml"), "--server", target["url"],
                        "--token-file", str(token), "--replay", str(REPO / "agent/captures/pai__nvidia_smi_out_of_order.xml"),
                        "--host", "node-01", "--state-dir", str(tmp_path / "state"), "--once"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "chmod 600" in r.stderr and target["host"] not in r.stderr


def test_d5_database_renamed_under_the_live_server_then_back(target):
    auth = _auth(target, "alice")
    page = {"Accept": "text/html", "Cookie": "gpuroster_session=" + "s" * 43}
    _rename(target["db"], target["db"] + "_away")
    try:
        r = httpx.get(target["url"] + "/api/v1/reservations", headers=auth)
        assert r.status_code == 503 and r.headers["content-type"].startswith("application/problem+json")
        assert int(r.headers["retry-after"]) >= 1
        p = httpx.get(target["url"] + "/me/reservations", headers=page)
        assert p.status_code == 503 and "<html" in p.text
    finally:
        _rename(target["db"] + "_away", target["db"])
    assert _wait(lambda: httpx.get(target["url"] + "/api/v1/reservations", headers=auth).status_code == 200)
    log = (target["dir"] / "serve.log").read_text()
    assert log.count("database unavailable") == 1 and "Traceback" not in log
