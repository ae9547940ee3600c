"""One sanitising function per sink, each with a table (D7, D8, D9, CSV), and each sink
fed the case's input end to end: the chat webhook, an e-mail batch, the CLI's list/status
output and the agent's terminal notice."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session

from agent.schema import DeviceReport, FindingReport, Snapshot
from app.db import run_in_transaction
from app.sanitize import chat_text, csv_cell, email_header, terminal_text
from app.services import hosts as host_service
from app.services import ingest, notices
from tests.app.test_notices import T0, conf, factory, hook, lab, mailbox, notice_rows  # noqa: F401 - fixtures

D7 = "python <!channel> <http://x.example|click here>"
D8 = "\u001b]0;PWNED\u0007\u001b]52;c;ZWNobyBwd25lZA==\u0007"


@pytest.mark.parametrize(("given", "expected"), [
    (D7, "`python &lt;!channel&gt; &lt;http://x.example|click here&gt;`"),
    ("@here *bold* _it_ ~s~", "`@here *bold* _it_ ~s~`"),
    ("a `code` b", "`a ˋcodeˋ b`"),
    ("line1\nline2\r\n", "`line1 line2`"),
    ("fish & chips", "`fish &amp; chips`"),
    ("", "` `"),
    (None, "` `"),
    ("x" * 400, "`" + "x" * 299 + "…`"),
])
def test_chat_text_table(given, expected):
    assert chat_text(given) == expected


@pytest.mark.parametrize(("given", "expected"), [
    ("GPU 0 NVIDIA A40\r\nBcc: evil@x.example", "GPU 0 NVIDIA A40 Bcc: evil@x.example"),
    ("a\nb", "a b"),
    ("tab\there", "tab here"),
    ("nul\x00 and esc\x1b[31m", "nul and esc [31m"),
    ("line\u2028sep", "line sep"),
    ("plain", "plain"),
    (None, ""),
    ("y" * 300, "y" * 199 + "…"),
])
def test_email_header_table(given, expected):
    assert email_header(given) == expected


@pytest.mark.parametrize(("given", "kw", "expected"), [
    (D8, {}, "\\x1b]0;PWNED\\x07\\x1b]52;c;ZWNobyBwd25lZA==\\x07"),
    ("\x1b[2J\x1b[Hclear", {}, "\\x1b[2J\\x1b[Hclear"),
    ("one-byte CSI \x9b31m", {}, "one-byte CSI \\x9b31m"),
    ("rtl \u202egnp.exe", {}, "rtl \\u202egnp.exe"),
    ("cr\rover", {}, "cr\\x0dover"),
    ("a\nb", {}, "a\\x0ab"),
    ("a\nb\x1b", {"keep_newlines": True}, "a\nb\\x1b"),
    ("tab\tx", {}, "tab x"),
    ("ünïcödé GPU", {}, "ünïcödé GPU"),
    (None, {}, ""),
    ("abcdef", {"limit": 4}, "abc…"),
])
def test_terminal_text_table(given, kw, expected):
    assert terminal_text(given, **kw) == expected


@pytest.mark.parametrize(("given", "expected"), [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
    ("+1+1", "'+1+1"),
    ("-2+3", "'-2+3"),
    ("@SUM(A1)", "'@SUM(A1)"),
    ("\tcmd", "'\tcmd"),
    ("\rcmd", "'\rcmd"),
    ("alice", "alice"),
    ("a=b", "a=b"),
    (-3, -3),
    (1.5, 1.5),
    (None, None),
])
def test_csv_cell_table(given, expected):
    assert csv_cell(given) == expected


G_BAD = "GPU-dddd0000-0000-0000-0000-000000000000"
G_OK = "GPU-eeee0000-0000-0000-0000-000000000000"


def _post(factory, conf, reports, devices):  # noqa: F811 - fixtures imported above
    def work(s: Session):
        h = host_service.get_host(s, "node-01")
        snap = Snapshot(host="node-01", seq=1, collected_at=T0, devices=devices, findings=reports)
        return ingest.ingest_snapshot(s, host=h, snap=snap, settings=conf, now=T0)

    ack = run_in_transaction(factory, work)
    assert notices.wait_idle(30)
    return ack


def _finding(uuid, pid, command="python train.py"):
    return FindingReport(key=f"{uuid}:{pid}:1.00:unreserved", kind="unreserved", device_uuid=uuid, pid=pid, create_time=1.0,
                         unix_user="alice", command=command, first_seen=T0, last_seen=T0, state="notified",
                         message=f"Your process {pid} runs without a reservation")


def test_d7_webhook_shows_chat_markup_literally(factory, lab, conf, mailbox, hook):  # noqa: F811
    _post(factory, conf, [_finding(G_OK, 7001, command=D7)], [DeviceReport(uuid=G_OK, index=0, name="NVIDIA A40")])
    [body] = hook.bodies
    text = body["text"]
    assert "<!channel>" not in text and "<http" not in text and "|click here>" not in text
    assert "`python &lt;!channel&gt; &lt;http://x.example|click here&gt;`" in text


def test_d9_line_break_in_a_device_name_gives_a_safe_subject_and_the_batch_goes_out(factory, lab, conf, mailbox, hook):  # noqa: F811
    box, _ = mailbox
    devices = [DeviceReport(uuid=G_BAD, index=0, name="NVIDIA A40\r\nBcc: evil@x.example"),
               DeviceReport(uuid=G_OK, index=1, name="NVIDIA A40")]
    _post(factory, conf, [_finding(G_BAD, 7101), _finding(G_OK, 7102)], devices)
    mails = box.to("alice@lab.example")
    assert len(mails) == 2
    subjects = sorted(" ".join(m["Subject"].split()) for m in mails)  # unfold long header lines
    assert subjects == ["[gpuroster] unreserved on node-01: GPU 0 NVIDIA A40 Bcc: evil@x.example",
                        "[gpuroster] unreserved on node-01: GPU 1 NVIDIA A40"]
    assert all(m["Bcc"] is None for m in mails)
    assert not any("evil@x.example" in rcpts for rcpts, _ in box.messages)
    assert {status for channel, _, status in notice_rows(factory) if channel == "email"} == {"sent"}


def test_d9_an_unusable_value_fails_only_its_own_notice(monkeypatch, conf):  # noqa: F811
    """Even a value the sanitiser did not anticipate fails its own row, never the batch."""
    sent = []

    class FakeSMTP:
        def __init__(self, *a, **kw): ...
        def send_message(self, msg): sent.append(msg["Subject"]); return {}
        def quit(self): ...

    monkeypatch.setattr(notices.smtplib, "SMTP", FakeSMTP)
    monkeypatch.setattr(notices, "email_header", lambda v: v)  # as if unsanitised
    items = [notices.Outgoing(1, "email", "a@lab.example", "bad\r\nsubject", "x"),
             notices.Outgoing(2, "email", "b@lab.example", "good subject", "y")]
    notices._send_emails(items, conf)
    assert sent == ["good subject"]
    assert (items[0].status, items[1].status) == ("failed", "sent") and "could not be composed" in items[0].detail


def test_d8_agent_terminal_notice_shows_escapes_harmlessly():
    from agent.notify import TerminalNotifier

    written = []
    notifier = TerminalNotifier(discover=lambda user, pids: {"/dev/pts/7"},
                                write=lambda path, text: (written.append(text), (True, "ok"))[1])
    notifier.notify(recipient="alice" + D8, pids=[1], text="note: " + D8 + "\nsecond line", at=datetime.now(UTC))
    [text] = written
    assert "\x1b" not in text and "\x07" not in text.replace("\n\a***", "")
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in text and "\nsecond line" in text


def test_csv_export_quotes_formula_like_cells():
    """Names are validated today (no leading '=' possible); the export does not rely on it."""
    import csv
    import io

    from app.schemas.report import ReservationUsage, UsageReport, UserUsage
    from app.services.report_csv import usage_csv

    figures = {"reserved_gpu_hours": 1.0, "used_gpu_hours": 0.5, "idle_gpu_hours": 0.5, "unmonitored_gpu_hours": 0.0,
               "used_fraction": 0.5}
    t = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    res = ReservationUsage(id=1, user="=cmd|' /C calc'!A0", host="@SUM(1)", devices=[G_OK], start=t, end=t,
                           status="confirmed", **figures)
    report = UsageReport(scope="user", name="x", start=t, end=t, until=t, threshold_pct=5,
                         totals=UserUsage(user="x", reservations=1, findings={}, **figures), users=[], reservations=[res])
    rows = list(csv.reader(io.StringIO(usage_csv(report))))
    assert rows[1][1:3] == ["'=cmd|' /C calc'!A0", "'@SUM(1)"] and rows[1][7] == "1.0"


def test_csv_export_over_the_api(client, make_user, make_host):
    from tests.conftest import book, gpu, snapshot_body

    actor = make_user("alice")
    host = make_host("node-01")
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, [gpu(G_OK, 0)]), headers=host.headers)
    assert r.status_code == 200
    assert book(client, actor, [0], "now").status_code == 201
    r = client.get("/api/v1/reports/usage.csv", headers=actor.headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = r.text.splitlines()
    assert lines[0].startswith("reservation,user,host") and lines[1].split(",")[1:3] == ["alice", "node-01"]
