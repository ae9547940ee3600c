"""Notices about one's own bookings, boosts and waitlist entries reach the user's own chat
URLs (apprise), with user text escaped for the sink, and honour the user's choice of notice
kinds: a kind turned off is recorded but neither e-mailed nor sent. Both databases."""

from __future__ import annotations

import time

from sqlalchemy import select

from app.models import AuditLog
from tests.app.test_channels import EVIL, receiver  # noqa: F401
from tests.conftest import future


def _wait_for(receiver, prefix: str, n: int, timeout: float = 10.0) -> list[dict]:  # noqa: F811
    deadline = time.monotonic() + timeout
    while len(receiver.at(prefix)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return receiver.at(prefix)


def _ask_boost(client, lab, value: int) -> int:
    r = client.post("/api/v1/boosts", json={"limit": "max_gpu_hours_month", "value": value, "reason": "deadline",
                                           "end": future(24 * 3).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _notices(session_factory, username: str) -> list[dict]:
    with session_factory() as s:
        return [a.detail for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def test_own_chat_gets_the_decision_escaped_and_a_kind_turned_off_gets_nothing(client, lab, session_factory,
                                                                                  receiver):  # noqa: F811
    assert client.post("/api/v1/rules", json={"scope": "default", "max_gpu_hours_month": 100},
                       headers=lab.admin.headers).status_code == 201
    r = client.post("/api/v1/notify-targets", json={"url": "feishu://alicetoken0123456789", "label": "alice feishu"},
                    headers=lab.alice.headers)
    assert r.status_code == 201, r.text

    first = _ask_boost(client, lab, 200)
    r = client.post(f"/api/v1/boosts/{first}/deny", json={"reason": EVIL}, headers=lab.admin.headers)
    assert r.status_code == 200, r.text
    posts = _wait_for(receiver, "/feishu", 1)
    assert len(posts) == 1
    text = posts[0]["content"]["text"]
    assert f"quota boost {first}" in text and "denied" in text
    assert "<" not in text and "\uff1c!channel\uff1e" in text  # the reason, escaped for Feishu
    assert _notices(session_factory, "alice")[-1]["chats"] == 1

    assert client.put("/api/v1/me/notice-preferences", json={"approvals": False},
                      headers=lab.alice.headers).status_code == 200
    second = _ask_boost(client, lab, 300)
    assert client.post(f"/api/v1/boosts/{second}/approve", json={}, headers=lab.admin.headers).status_code == 200
    last = _notices(session_factory, "alice")[-1]
    assert (last["boost"], last["email"], last["chats"], last["kind"]) == (second, "not wanted", 0, "approvals")
    time.sleep(0.5)
    assert len(receiver.at("/feishu")) == 1  # nothing more was sent


