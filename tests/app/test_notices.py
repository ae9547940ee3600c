"""Service notices: web rows, e-mail through a real local SMTP server (aiosmtpd), the chat
webhook through httpx.MockTransport; rate limits, failures that never fail ingest, delivery
only after the commit, the outbox sweep, and one send per row across workers. Both databases."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email import message_from_bytes

import httpx
import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent.schema import DeviceReport, FindingReport, Snapshot
from app.db import build_engine, build_session_factory, run_in_transaction, transaction
from app.models import Host, Notice
from app.services import hosts as host_service
from app.services import ingest
from app.services import notices
from app.services import users as user_service

pytestmark = pytest.mark.commits  # delivery runs on its own engine and worker threads, after the commit

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
G0 = "GPU-cccc0000-0000-0000-0000-000000000000"
HOOK = "https://hooks.slack.example/services/T000/B000/secretsecret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], bytes]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        self.messages.append((list(envelope.rcpt_tos), envelope.content))
        return "250 OK"

    def to(self, addr: str) -> list:
        return [message_from_bytes(c) for rcpts, c in self.messages if addr in rcpts]


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    ctl = Controller(box, hostname="127.0.0.1", port=port)
    ctl.start()
    yield box, port
    ctl.stop()


class Hook:
    def __init__(self, status: int = 200, fail: bool = False) -> None:
        self.bodies: list[dict] = []
        self.status, self.fail = status, fail

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.fail:
            raise httpx.ConnectError("connection refused", request=request)
        assert str(request.url) == HOOK
        self.bodies.append(json.loads(request.content))
        return httpx.Response(self.status, text="ok" if self.status == 200 else "invalid_token")


@pytest.fixture
def hook(monkeypatch) -> Hook:
    h = Hook()
    monkeypatch.setattr(notices, "WEBHOOK_TRANSPORT", httpx.MockTransport(h))
    return h


@pytest.fixture
def conf(settings, mailbox):
    return settings.model_copy(update={"smtp_host": "127.0.0.1", "smtp_port": mailbox[1],
                                       "smtp_from": "gpuroster@lab.example", "webhook_url": HOOK})


@pytest.fixture
def factory(settings) -> Iterator[sessionmaker[Session]]:
    engine = build_engine(settings)
    yield build_session_factory(engine)
    assert notices.wait_idle(30)
    engine.dispose()


@pytest.fixture
def lab(factory):
    """alice (offender) and bob (holder) with e-mail, carol without; host node-01, policy notify."""
    def work(s: Session) -> None:
        user_service.create_user(s, username="alice", email="alice@lab.example")
        user_service.create_user(s, username="bob", email="bob@lab.example")
        user_service.create_user(s, username="carol")
        host, _ = host_service.create_host(s, name="node-01")
        host.notice_interval_seconds = 900

    run_in_transaction(factory, work)


def finding(kind="foreign", user="alice", holder="bob", state="notified", pid=5101) -> FindingReport:
    return FindingReport(key=f"{G0}:{pid}:1.00:{kind}", kind=kind, device_uuid=G0, pid=pid, create_time=1.0,
                         unix_user=user, command="python train.py", holder=holder, first_seen=T0, last_seen=T0,
                         state=state, message=f"Your process {pid} (python train.py) of {user} is running on GPU 0 ...")


def post(factory, conf, seq: int, reports: list[FindingReport], *, now=T0, host="node-01", source="nvml", fail=False):
    """Ingest one snapshot in its own transaction (as the API does); wait for delivery."""
    def work(s: Session):
        h = host_service.get_host(s, host)
        snap = Snapshot(host=host, seq=seq, collected_at=now, source=source,
                        devices=[DeviceReport(uuid=G0, index=0, pci_bus_id="00000000:3B:00.0", name="NVIDIA A40")],
                        findings=reports)
        ack = ingest.ingest_snapshot(s, host=h, snap=snap, settings=conf, now=now)
        if fail:
            raise RuntimeError("the request failed after ingest")
        return ack

    ack = run_in_transaction(factory, work)
    assert notices.wait_idle(30)
    return ack


def notice_rows(factory) -> list[tuple[str, str | None, str]]:
    with factory() as s:
        return [(n.channel, n.recipient, n.status) for n in s.scalars(select(Notice).order_by(Notice.id))]


def set_policy(factory, policy: str) -> None:
    def work(s: Session) -> None:
        s.scalar(select(Host).where(Host.name == "node-01")).policy = policy

    run_in_transaction(factory, work)


# ----------------------------------------------------------------------------------------


def test_foreign_finding_notifies_web_offender_holder_and_webhook(factory, lab, conf, mailbox, hook) -> None:
    box, _ = mailbox
    ack = post(factory, conf, 1, [finding()])
    assert ack.accepted
    assert sorted(notice_rows(factory)) == sorted([
        ("web", "alice", "sent"), ("email", "alice@lab.example", "sent"), ("email", "bob@lab.example", "sent"),
        ("webhook", "hooks.slack.example", "sent")])
    [to_alice] = box.to("alice@lab.example")
    assert to_alice["Subject"] == "[gpuroster] foreign on node-01: GPU 0 NVIDIA A40"
    assert to_alice["From"] == "gpuroster@lab.example"
    assert "Your process 5101 (python train.py) of alice" in to_alice.get_payload()
    [to_bob] = box.to("bob@lab.example")
    assert "occupied by alice's process 5101" in to_bob.get_payload()
    assert "http://testserver/findings" in to_bob.get_payload()
    [body] = hook.bodies
    assert list(body) == ["text"]  # what Slack and Mattermost incoming webhooks accept
    # names and the command line are code spans (shown literally, see app.sanitize.chat_text)
    assert "`node-01`" in body["text"] and "`alice`'s process 5101 `python train.py`" in body["text"]
    assert "reserved by `bob`" in body["text"]
    with factory() as s:  # the webhook URL's secret path is never stored
        assert all("secret" not in (n.recipient or "") + (n.detail or "") for n in s.scalars(select(Notice)))


def test_rate_limited_per_finding_by_host_interval(factory, lab, conf, mailbox, hook) -> None:
    box, _ = mailbox
    post(factory, conf, 1, [finding()])
    post(factory, conf, 2, [finding()], now=T0 + timedelta(seconds=899))
    assert len(box.messages) == 2 and len(hook.bodies) == 1
    post(factory, conf, 3, [finding()], now=T0 + timedelta(seconds=900))
    assert len(box.messages) == 4 and len(hook.bodies) == 2
    assert [c for c, _, _ in notice_rows(factory)].count("web") == 2


def test_unreserved_notifies_only_the_offender_and_idle_the_holder(factory, lab, conf, mailbox, hook) -> None:
    box, _ = mailbox
    post(factory, conf, 1, [finding(kind="unreserved", holder=None),
                            finding(kind="idle", user="bob", holder="bob", pid=None)])
    assert sorted(r for rcpts, _ in box.messages for r in rcpts) == ["alice@lab.example", "bob@lab.example"]
    assert any("reservation" in b["text"] and "idle" in b["text"] for b in hook.bodies)


def test_observe_policy_and_ended_findings_send_nothing(factory, lab, conf, mailbox, hook) -> None:
    set_policy(factory, "observe")
    post(factory, conf, 1, [finding()])
    set_policy(factory, "notify")
    post(factory, conf, 2, [finding(pid=6000, state="resolved")])
    assert notice_rows(factory) == [] and mailbox[0].messages == [] and hook.bodies == []


def test_user_without_email_gets_a_skipped_row(factory, lab, conf, mailbox, hook) -> None:
    post(factory, conf, 1, [finding(user="carol", holder="nobody-known")])
    rows = notice_rows(factory)
    assert ("email", "carol", "skipped") in rows and ("email", "nobody-known", "skipped") in rows
    assert mailbox[0].messages == []


def test_smtp_down_and_webhook_errors_never_fail_ingest(factory, lab, conf, monkeypatch) -> None:
    down = conf.model_copy(update={"smtp_port": free_port()})  # nothing listens there
    monkeypatch.setattr(notices, "WEBHOOK_TRANSPORT", httpx.MockTransport(Hook(status=500)))
    assert post(factory, down, 1, [finding()]).accepted
    with factory() as s:
        by = {(n.channel, n.recipient): n for n in s.scalars(select(Notice))}
    assert by[("email", "alice@lab.example")].status == "failed"
    assert "unreachable" in by[("email", "alice@lab.example")].detail
    assert (by[("webhook", "hooks.slack.example")].status, by[("webhook", "hooks.slack.example")].detail) == (
        "failed", "webhook answered HTTP 500: invalid_token")
    monkeypatch.setattr(notices, "WEBHOOK_TRANSPORT", httpx.MockTransport(Hook(fail=True)))
    assert post(factory, down, 2, [finding(pid=6001)]).accepted
    with factory() as s:
        n = s.scalars(select(Notice).where(Notice.channel == "webhook").order_by(Notice.id.desc())).first()
    assert n.status == "failed" and n.detail.startswith("webhook unreachable: ConnectError")


def test_nothing_is_sent_when_the_ingest_transaction_rolls_back(factory, lab, conf, mailbox, hook) -> None:
    with pytest.raises(RuntimeError):
        post(factory, conf, 1, [finding()], fail=True)
    assert notice_rows(factory) == [] and mailbox[0].messages == [] and hook.bodies == []
    post(factory, conf, 1, [finding()])  # the agent retries the same seq: now it goes out
    assert len(mailbox[0].messages) == 2


def test_replayed_capture_hosts_get_web_notices_only(factory, lab, conf, mailbox, hook) -> None:
    post(factory, conf, 1, [finding()], source="replay")
    assert notice_rows(factory) == [("web", "alice", "sent")]


def test_orphaned_pending_notice_is_swept_by_the_next_delivery(factory, lab, conf, mailbox, hook) -> None:
    post(factory, conf, 1, [finding()])
    with transaction(factory, write=True) as s:
        fid = s.scalar(select(Notice.finding_id))
        s.add(Notice(finding_id=fid, channel="email", recipient="alice@lab.example", status="pending", detail="offender",
                     sent_at=datetime.now(UTC) - timedelta(minutes=5)))  # its process died before sending
    before = len(mailbox[0].messages)
    sent = notices.deliver(factory.kw["bind"], conf, ids=[])
    assert [(i.channel, i.status) for i in sent] == [("email", "sent")]
    assert len(mailbox[0].messages) == before + 1
    assert "pending" not in [st for _, _, st in notice_rows(factory)]


def test_each_pending_notice_is_sent_once_by_concurrent_workers(factory, lab, conf, mailbox, hook) -> None:
    ids: list[int] = []

    def queue(s: Session) -> None:
        from app.models import Finding

        h = host_service.get_host(s, "node-01")
        f = Finding(host_id=h.id, key="k", kind="unreserved", state="open", unix_user="alice", pid=1,
                    first_seen_at=T0, last_seen_at=T0)
        s.add(f)
        s.flush()
        rows = [Notice(finding_id=f.id, channel="email", recipient="alice@lab.example", status="pending",
                       detail="offender", sent_at=T0) for _ in range(6)]
        s.add_all(rows)
        s.flush()
        ids.extend(n.id for n in rows)

    run_in_transaction(factory, queue)
    results: list = []
    workers = [threading.Thread(target=lambda: results.append(notices.deliver(factory.kw["bind"], conf, ids=list(ids))))
               for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert sorted(i.id for r in results for i in r) == sorted(ids)
    assert len(mailbox[0].messages) == 6


def test_agent_post_over_http_sends_after_the_request_committed(factory, lab, conf, mailbox, hook) -> None:
    """The whole path: POST /api/v1/agent/snapshots with a finding; the request's own session
    commits, then the notices go out; the agent's answer is not held up by the sending."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    token = run_in_transaction(factory, lambda s: host_service.create_host(s, name="node-09")[1])
    body = Snapshot(host="node-09", seq=1, collected_at=datetime.now(UTC),
                    devices=[DeviceReport(uuid="GPU-dddd0000-0000-0000-0000-000000000000", index=0)],
                    findings=[finding().model_copy(update={"device_uuid": "GPU-dddd0000-0000-0000-0000-000000000000",
                                                           "first_seen": datetime.now(UTC), "last_seen": datetime.now(UTC)})])
    with TestClient(create_app(conf)) as c:
        r = c.post("/api/v1/agent/snapshots", content=body.model_dump_json(),
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert notices.wait_idle(30)
    assert sorted(r for rcpts, _ in mailbox[0].messages for r in rcpts) == ["alice@lab.example", "bob@lab.example"]
    assert len(hook.bodies) == 1
