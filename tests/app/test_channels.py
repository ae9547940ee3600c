"""Notices through apprise: local HTTP receivers for Slack(-compatible), DingTalk, WeCom and
Feishu payloads, e-mail to the local SMTP server; targets of the deployment, groups and users,
each user's choice of kinds, user text escaped per sink. Both databases."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from apprise.plugins.dingtalk import NotifyDingTalk
from apprise.plugins.feishu import NotifyFeishu
from apprise.plugins.slack import NotifySlack
from apprise.plugins.wecombot import NotifyWeComBot
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import run_in_transaction
from app.models import Notice, User
from app.services import channels
from app.services import groups as group_service
from tests.app.test_notices import factory, finding, lab, mailbox, notice_rows, post  # noqa: F401

EVIL = "<!channel> <http://x|click> @channel *bold*"


class Receiver:
    """A local HTTP server that records JSON posts by path and answers like the chat services."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server hook name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.posts.append((self.path, json.loads(body)))
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if self.path.startswith("/slack"):
                    self.wfile.write(b"ok")
                else:  # DingTalk, WeCom, Feishu and Mattermost all accept this shape of success
                    self.wfile.write(b'{"errcode": 0, "errmsg": "ok", "code": 0, "StatusCode": 0}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, prefix: str) -> list[dict]:
        return [body for path, body in self.posts if path.startswith(prefix)]


@pytest.fixture
def receiver(monkeypatch):
    """The receiver, with apprise's fixed cloud endpoints pointed at it (the payloads are apprise's own)."""
    r = Receiver()
    monkeypatch.setattr(NotifySlack, "webhook_url", r.base + "/slack")
    monkeypatch.setattr(NotifyDingTalk, "notify_url", r.base + "/dingtalk?access_token={token}")
    monkeypatch.setattr(NotifyWeComBot, "notify_url", r.base + "/wecom?key={key}")
    monkeypatch.setattr(NotifyFeishu, "notify_url", r.base + "/feishu/{token}/")
    yield r
    r.server.shutdown()


@pytest.fixture
def chat_conf(settings, receiver):
    port = receiver.server.server_port
    return settings.model_copy(update={"notify_urls": [f"mmost://127.0.0.1:{port}/deploymenttokenabcdef"]})


def add_targets(factory, receiver, *, alice_wants_findings: bool = True) -> None:  # noqa: F811
    def work(s: Session) -> None:
        alice = s.scalar(select(User).where(User.username == "alice"))
        bob = s.scalar(select(User).where(User.username == "bob"))
        admin = User(username="root", unix_name="root-x", role="admin")
        g = group_service.create_group(s, name="vision", description=None, members=["alice"], actor=alice)
        channels.add_target(s, actor=admin, url="slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7", label="lab slack")
        channels.add_target(s, actor=admin, url="dingtalk://grouptoken0123456789", group_id=g.id)
        channels.add_target(s, actor=alice, url="wecombot://alicekey0123", user=alice)
        channels.add_target(s, actor=bob, url="feishu://bobtoken0123456789", user=bob)
        channels.set_preferences(s, user=alice, choices={"findings": alice_wants_findings})

    run_in_transaction(factory, work)


def test_each_sink_gets_its_payload_with_user_text_escaped(factory, lab, chat_conf, receiver):  # noqa: F811
    add_targets(factory, receiver)
    report = finding().model_copy(update={"command": EVIL, "message": f"Your process 5101 ({EVIL}) runs on GPU 0"})
    post(factory, chat_conf, 1, [report])
    [slack] = receiver.at("/slack")
    text = slack["attachments"][0]["text"] if "attachments" in slack else slack["text"]
    assert "&lt;!channel&gt; &lt;http://x|click&gt;" in text and "<!channel>" not in text
    [mm] = receiver.at("/hooks/deploymenttokenabcdef")  # Mattermost: Slack-compatible {"text": ...}
    assert "&lt;!channel&gt;" in mm["text"] and "<!channel>" not in mm["text"] and "@channel" not in mm["text"]
    [ding] = receiver.at("/dingtalk")
    assert ding["msgtype"] == "text" and ding["at"]["isAtAll"] is False and "node-01" in ding["text"]["content"]
    [wecom] = receiver.at("/wecom")
    assert wecom["msgtype"] == "text" and "alice's process 5101" in wecom["text"]["content"]
    [feishu] = receiver.at("/feishu")
    assert feishu["msg_type"] == "text" and "<" not in feishu["content"]["text"]
    assert "\uff1c!channel\uff1e" in feishu["content"]["text"]
    rows = [r for r in notice_rows(factory) if r[0] == "webhook"]
    assert len(rows) == 5 and all(status == "sent" for _, _, status in rows)
    with factory() as s:  # tokens never stored in the notice rows
        assert all("Tok" not in (n.recipient or "") and "token0123" not in (n.recipient or "") + (n.detail or "")
                   for n in s.scalars(select(Notice)))


def test_user_who_turned_findings_off_hears_nothing_on_own_url_but_group_does(factory, lab, chat_conf, receiver):  # noqa: F811
    add_targets(factory, receiver, alice_wants_findings=False)
    post(factory, chat_conf, 1, [finding(kind="unreserved", holder=None)])
    assert receiver.at("/wecom") == []  # alice's own URL
    assert len(receiver.at("/dingtalk")) == 1  # her group's
    assert receiver.at("/feishu") == []  # bob is not concerned by an unreserved finding


def test_failed_chat_delivery_is_recorded_and_never_fails_ingest(factory, lab, chat_conf, receiver):  # noqa: F811
    receiver.status = 500
    ack = post(factory, chat_conf, 1, [finding()])
    assert ack.accepted
    with factory() as s:
        [row] = [n for n in s.scalars(select(Notice)) if n.channel == "webhook"]
    assert row.status == "failed" and "127.0.0.1" in row.detail


def test_email_through_apprise_reaches_the_local_smtp_server(factory, lab, settings, mailbox):  # noqa: F811
    box, port = mailbox
    url = f"mailto://127.0.0.1:{port}?to=lab-gpus@lab.example&from=gpuroster@lab.example&secure=no&user=&pass="
    conf = settings.model_copy(update={"notify_urls": [url]})
    post(factory, conf, 1, [finding()])
    assert [r for rcpts, _ in box.messages for r in rcpts] == ["lab-gpus@lab.example"]
    [msg] = box.to("lab-gpus@lab.example")
    assert "node-01" in msg["Subject"]


@pytest.mark.parametrize("url,expected", [
    ("mmost://h/t", "&lt;!channel&gt; &lt;http://x\\|click&gt; @\u200bchannel \\*bold\\*"),
    ("feishu://t", "\uff1c!channel\uff1e \uff1chttp://x|click\uff1e @channel *bold*"),
    ("discord://a/b", "<\u200b!channel> <http://x|click> @\u200bchannel *bold*"),
])
def test_one_sanitiser_per_sink(url, expected):
    assert channels.sanitize(url, EVIL) == expected


def test_notify_targets_api(client, make_user):
    admin, alice = make_user("admin", admin=True), make_user("alice")
    r = client.post("/api/v1/notify-targets", json={"url": "nonsense://x"}, headers=alice.headers)
    assert r.status_code == 422 and r.json()["field"] == "url"
    r = client.post("/api/v1/notify-targets", json={"url": "dingtalk://secrettoken0123"}, headers=alice.headers)
    assert r.status_code == 201 and r.json()["owner"] == "user:alice" and "secret" not in r.json()["url"]
    assert client.post("/api/v1/notify-targets", json={"url": "dingtalk://abcdef0123", "deployment": True},
                       headers=alice.headers).status_code == 403
    r = client.post("/api/v1/notify-targets", json={"url": "wecombot://abcdef0123", "deployment": True},
                    headers=admin.headers)
    assert r.status_code == 201 and r.json()["owner"] == "deployment"
    assert [t["owner"] for t in client.get("/api/v1/notify-targets", headers=alice.headers).json()] == ["user:alice"]
    assert client.delete(f"/api/v1/notify-targets/{r.json()['id']}", headers=alice.headers).status_code == 404
    assert client.delete(f"/api/v1/notify-targets/{r.json()['id']}", headers=admin.headers).status_code == 204
    prefs = client.put("/api/v1/me/notice-preferences", json={"waitlist": False}, headers=alice.headers)
    assert prefs.status_code == 200 and prefs.json() == {
        "findings": True, "approvals": True, "waitlist": False, "no_shows": True, "quarantine": True}
    assert client.put("/api/v1/me/notice-preferences", json={"spam": True}, headers=alice.headers).status_code == 422
    assert client.get("/api/v1/me/notice-preferences", headers=alice.headers).json()["waitlist"] is False


def test_every_url_in_docs_notices_is_accepted_by_apprise():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "notices.md").read_text()
    urls = re.findall(r"`((?:slack|mmosts?|workflows|matrixs|tgram|dingtalk|wecombot|feishu|lark|mailtos)://[^`\s]+)`", doc)
    urls += re.findall(r'"((?:mmost|dingtalk|wecombot|tgram)://[^"]+)"', doc)
    urls = [u for u in urls if "…" not in u]  # prose that elides a token, not an example
    assert len(urls) >= 12
    for url in urls:
        assert channels.validate_url(url) == url
