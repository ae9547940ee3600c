"""The features added beside the languages speak Chinese too: the Now page draws a device
once per language (a Chinese and an English reader in turn each get their own), the Book
page's "wait for it" offer, and the notices about a quota boost, a quarantine and a check-in
reach a member who chose Chinese in Chinese; the CLI's waitlist line follows the locale.
Both databases."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from app.i18n import use_locale
from app.models import AuditLog
from tests.conftest import gpu, snapshot_body
from tests.web.test_now import HX, _device_block

ZH = {"Accept-Language": "zh-CN,zh;q=0.9"}


def _api(b, method, path, **kw):
    return b.client.request(method, "/api/v1" + path, headers={"X-CSRF-Token": b.csrf}, **kw)


def _told(session_factory, username: str) -> list[dict]:
    with session_factory() as s:
        return [a.detail for a in s.scalars(select(AuditLog).where(AuditLog.action == "notice.reservation",
                                                                   AuditLog.target == f"user:{username}")
                                            .order_by(AuditLog.id))]


def _quarantine(client, weblab, index: int) -> None:
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    devices[index]["health_checks"] = [{"kind": "xid", "state": "bad", "value": 79}]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text


def test_now_draws_each_device_per_language(client, weblab):
    _quarantine(client, weblab, 2)
    uuid = weblab.devices[2]
    for _ in range(2):  # each reader gets their own language, also from the reused drawing
        zh = _device_block(weblab.alice.get("/", headers={**HX, **ZH}).text, uuid)
        assert "已隔离" in zh and "XID 79 错误" in zh and "不可预约" in zh and ">quarantined<" not in zh
        en = _device_block(weblab.bob.get("/", headers=HX).text, uuid)
        assert "XID 79 error" in en and "not bookable" in en and "已隔离" not in en


def test_the_wait_offer_in_chinese(weblab):
    body = {"host": "node-01", "devices": [0], "start": "now", "duration": "PT3H"}
    assert _api(weblab.bob, "POST", "/reservations", json=body).status_code == 201
    key = re.search(r'name="idempotency_key" value="([^"]+)"', weblab.alice.get("/book").text).group(1)
    r = weblab.alice.client.post("/book", headers=ZH, data={
        "mode": "devices", "host": "node-01", "devices": [weblab.devices[0]], "when": "now", "length": "2",
        "idempotency_key": key, "csrf_token": weblab.alice.csrf})
    assert r.status_code == 409, r.text
    assert "要排队等待吗？" in r.text and "node-01 上的 1 个设备，2 小时" in r.text and "Wait for it" not in r.text


def test_boost_and_quarantine_notices_in_the_members_language(client, weblab, session_factory):
    assert weblab.alice.post("/profile/language", {"language": "zh_CN"}).status_code == 303
    assert weblab.admin.post("/profile/language", {"language": "zh_CN"}).status_code == 303
    assert _api(weblab.admin, "POST", "/rules", json={"scope": "default", "max_devices": 1}).status_code == 201
    end = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    r = _api(weblab.alice, "POST", "/boosts", json={"limit": "max_devices", "value": 3, "end": end, "reason": "sweep"})
    assert r.status_code == 201, r.text
    assert _api(weblab.admin, "POST", f"/boosts/{r.json()['id']}/deny", json={"reason": "not now"}).status_code == 200
    told = _told(session_factory, "alice")[-1]
    assert told["subject"] == f"[gpuroster] 配额提升 {r.json()['id']} 被拒绝"
    assert "max_devices 提到 3 个设备" in told["text"] and told["text"].endswith("被 boss 拒绝：not now")
    assert _api(weblab.bob, "POST", "/reservations",
                json={"host": "node-01", "devices": [1], "start": "now", "duration": "PT2H"}).status_code == 201
    _quarantine(client, weblab, 1)
    admin = _told(session_factory, "boss")[-1]
    assert admin["subject"] == f"[gpuroster] {weblab.devices[1]} 已被隔离" and "XID 79 错误" in admin["text"]
    bob = _told(session_factory, "bob")[-1]  # bob chose no language: English
    assert bob["subject"].endswith("quarantined") and "XID 79 error" in bob["text"]


def test_the_cli_waitlist_line_follows_the_locale():
    from app.client.waitlist import entry_line
    from zoneinfo import ZoneInfo

    e = {"id": 7, "count": 2, "duration_seconds": 14400, "host": "node-01", "state": "waiting", "position": 2,
         "window_start": "2026-12-01T10:00:00+00:00", "window_end": "2026-12-03T10:00:00+00:00", "book": True,
         "reservation_id": None, "last_refusal": None}
    tz = ZoneInfo("UTC")
    assert entry_line(e, tz).startswith("#7 waiting (#2 in line): 2 GPU(s) for 4h on node-01 within ")
    with use_locale("zh_CN"):
        line = entry_line(e, tz)
    assert line.startswith("#7 等待中（排第 2 位）：2 个 GPU，4h，在 node-01 上，时间范围 ") and line.endswith("，预约")
