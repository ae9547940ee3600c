"""Chinese and English pages: every page rendered in ``zh_CN`` has no English left in it, the
catalog translates every message the code and templates use, and the language follows the
stored preference, else ``Accept-Language``, else English; on both databases.

"No English left" is checked two ways on each page: no visible text (or title, label,
placeholder, confirmation) contains an English word once the lab's own data (names, hosts,
commands, models) and technical names (GPU, UUID, CUDA, …) are taken out; and no English
message id of the catalog appears as a whole text node.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest

from sqlalchemy import update

from app import i18n
from app.services.limits import LIMIT_FIELDS
from app.db import run_in_transaction
from app.models import Reservation
from tests.conftest import gpu, snapshot_body

ZH = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}

# Names that stay as they are in Chinese text: products, protocols, units, technical ids.
TECHNICAL = {
    "gpuroster", "GPU", "GPUs", "UUID", "UUIDs", "PID", "pid", "CUDA", "CUDA_VISIBLE_DEVICES", "NVIDIA", "NVML", "MIG",
    "API", "URL", "curl", "Authorization", "Bearer", "LDAP", "OIDC", "SSO", "JSON", "UTC", "MiB", "GiB", "TiB", "W",
    "uid", "htmx", "apprise", "mmost", "dingtalk", "wecombot", "feishu", "mailto", "Slack", "Mattermost", "iCalendar",
    "SHA", "English", "ID", "ISO", "XID", "ECC", "Unix", "N", "SIGTERM", "SIGKILL", "Webhook", "Europe", "Berlin", "h", "s", "d", "m", "nvidia", "smi", "CSV",
}

# The fixture lab's data: user, host, device, process and container names.
DATA = {
    "ablation", "sweep", "max_devices", "boss", "alice", "bob", "mallory", "eve", "node", "lab", "example", "python", "train", "py", "epochs", "sim",
    "NVIDIA", "laptop", "test", "fine", "tune", "llama", "Xorg", "gnome", "shell", "vision",
}

# Limit names are the API's field names (the Usage page lists them as they are, like CUDA_VISIBLE_DEVICES).
TECHNICAL |= set(LIMIT_FIELDS)

ATTRS = ("title", "aria-label", "placeholder", "data-confirm", "alt")


class _Text(HTMLParser):
    """Visible text nodes and the human-read attributes of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "code", "pre"):
            self._skip += 1
        for name, value in attrs:
            if name in ATTRS and value:
                self.chunks.append(value)
            if tag == "input" and name == "value" and dict(attrs).get("type") in ("submit", "button") and value:
                self.chunks.append(value)

    def handle_endtag(self, tag):
        if tag in ("script", "style", "code", "pre") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip and data.strip():
            self.chunks.append(data.strip())


def visible_text(html: str) -> list[str]:
    parser = _Text()
    parser.feed(html)
    return parser.chunks


def english_words(html: str) -> list[str]:
    """Text chunks of ``html`` that still hold an English word after data and technical names."""
    left = []
    for chunk in visible_text(html):
        # e-mail addresses, UUIDs, URLs, paths and anything with a digit in it (A100, 80GB) are data
        words = re.findall(r"[A-Za-z][A-Za-z_]*", re.sub(r"[\w.+-]+@[\w.-]+|\S+://\S*|/\S*|[\w-]*\d[\w-]*", " ", chunk))
        if any(w not in TECHNICAL and w not in DATA for w in words):
            left.append(chunk)
    return left


def english_message_ids() -> set[str]:
    """The catalog's English source texts that read as prose (two words or more)."""
    catalog = i18n.translations("zh_CN")
    return {m for m, text in catalog._catalog.items()  # a name that stays the same in Chinese ("Unix uid") is no English
            if isinstance(m, str) and " " in m and "%" not in m and re.search("[a-z]{3}", m) and text != m}


@pytest.fixture
def busy_lab(weblab, client, session_factory):
    """The web lab with something on every page: reservations (active, upcoming, past, pending
    approval), an open and a closed finding, API tokens, a quarantined device, a check-in
    question, a waitlist entry and a pending quota boost."""
    now = datetime.now(UTC)
    t0 = now - timedelta(minutes=10)
    uuid0, uuid1 = weblab.devices[0], weblab.devices[1]
    findings = [
        {"key": f"{uuid0}:4711:1.0:unreserved", "kind": "unreserved", "device_uuid": uuid0, "pid": 4711, "create_time": 1.0,
         "unix_user": "mallory", "uid": 1500, "command": "python train.py --epochs 90", "container_id": "c0ffee1234567890abcd",
         "first_seen": t0.isoformat(), "last_seen": now.isoformat(), "state": "notified",
         "notices": [{"channel": "terminal", "recipient": "mallory", "at": now.isoformat(), "delivered": 2}]},
        {"key": f"{uuid1}:5000:2.0:overrun", "kind": "overrun", "device_uuid": uuid1, "pid": 5000, "create_time": 2.0,
         "unix_user": "eve", "uid": 1501, "command": "./sim", "first_seen": t0.isoformat(),
         "last_seen": (now - timedelta(minutes=1)).isoformat(), "state": "terminated",
         "actions": [{"action": "sigterm", "pid": 5000, "create_time": 2.0, "at": now.isoformat(), "reason": "grace over"}]},
    ]
    procs = [{"pid": 4711, "device_uuid": uuid0, "unix_user": "mallory", "name": "python", "used_memory_mib": 2048,
              "command": "python train.py --epochs 90"}]
    body = snapshot_body("node-01", 2, [gpu(u, i) for i, u in enumerate(weblab.devices)], processes=procs, findings=findings)
    r = client.post("/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text
    start = (now + timedelta(hours=3)).replace(second=0, microsecond=0)
    booked = []
    for who, dev, begin, hours in ((weblab.alice, 2, now, 2), (weblab.alice, 3, start, 1.5), (weblab.bob, 2, start + timedelta(hours=3), 1)):
        r = _api(who, "POST", "/reservations", json={"host": "node-01", "devices": [weblab.devices[dev]], "start": begin.isoformat(),
                                                    "duration": f"PT{int(hours * 60)}M", "note": "fine-tune llama"})
        assert r.status_code == 201, r.text
        booked.append(r.json()["id"])
    # GPU 1 is quarantined until an admin clears it (after the bookings: it refuses new ones)
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    devices[1]["health_checks"] = [{"kind": "retired_pages_pending", "state": "bad"}]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 3, devices, processes=procs, findings=findings),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text
    # the active reservation asks "no check-in yet — keep it?"
    run_in_transaction(session_factory, lambda s: s.execute(
        update(Reservation).where(Reservation.id == booked[0]).values(checkin_warned_at=now)))
    # every bookable device at once is taken now: a waitlist entry waits for them
    key = re.search(r'name="idempotency_key" value="([^"]+)"', weblab.alice.get("/book").text).group(1)
    r = weblab.alice.post("/me/waitlist", {"count": "3", "host": "node-01", "when": "now", "length": "1",
                                           "within": "3", "book": "0", "idempotency_key": key})
    assert r.status_code == 303 and r.headers["location"] == "/me/reservations?done=waiting#waitlist", r.text
    assert _api(weblab.admin, "POST", "/rules", json={"scope": "default", "approval_above_devices": 1,
                                                      "max_devices": 8}).status_code == 201
    key = re.search(r'name="idempotency_key" value="([^"]+)"', weblab.alice.get("/reports/usage").text).group(1)
    r = weblab.alice.post("/boosts", {"limit": "max_devices", "value": "10", "reason": "ablation sweep", "idempotency_key": key,
                                      "end": (now + timedelta(days=3)).date().isoformat()})
    assert r.status_code == 303, r.text
    r = _api(weblab.alice, "POST", "/reservations", json={"host": "node-01", "devices": [0, 3],
                                                          "start": (now + timedelta(days=2)).isoformat(), "duration": "PT2H"})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    assert weblab.alice.post("/profile/tokens", {"name": "laptop"}).status_code == 201
    assert weblab.admin.post("/admin/groups", {"name": "vision", "members": "alice, bob"}).status_code == 303
    return weblab


def _api(browser, method: str, path: str, **kw):
    """The JSON API with the browser's session (as the pages' htmx calls do)."""
    return browser.client.request(method, "/api/v1" + path, headers={"X-CSRF-Token": browser.csrf}, **kw)


PAGES = ["/", "/?all=1", "/me/reservations?done=waiting", "/reports/usage?done=boost", "/admin?done=quarantine-cleared", "/timeline", "/timeline?view=week", "/book", "/me/reservations", "/me/reservations/{first}",
         "/findings", "/reports/usage", "/reports/usage?user=alice", "/approvals", "/admin", "/profile",
         "/profile?done=revoked", "/me/reservations?done=cancelled"]


def test_every_page_in_chinese_has_no_english_left(busy_lab):
    # One seeded lab for all pages (seeding costs more than rendering them all); each page's
    # leftovers are collected under its URL, so a failure names every page at once.
    left: dict[str, object] = {}
    first = _api(busy_lab.alice, "GET", "/reservations?limit=1").json()["items"][0]["id"]  # ids are the database's
    for url in (page.format(first=first) for page in PAGES):
        browser = busy_lab.admin if url.startswith(("/admin", "/approvals")) else busy_lab.alice
        r = browser.get(url, headers=ZH)
        if r.status_code != 200:
            left[url] = f"HTTP {r.status_code}: {r.text[:300]}"
            continue
        if '<html lang="zh-CN">' not in r.text or r.headers.get("content-language") != "zh-CN":
            left[url] = ("language", r.headers.get("content-language"))
            continue
        chunks = set(visible_text(r.text))
        words, ids = english_words(r.text), sorted(m for m in english_message_ids() if m in chunks)
        if words or ids:
            left[url] = {"english words": words, "English messages": ids}
    assert left == {}


def test_the_sign_in_page_in_chinese_has_no_english_left(client):
    r = client.get("/login", headers=ZH)
    assert r.status_code == 200
    assert english_words(r.text) == [] and "登录" in r.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.commits  # apps of its own, one per zone
def test_the_footer_names_the_lab_zone_and_in_utc_says_no_more(settings):
    from fastapi.testclient import TestClient

    from app.main import create_app

    for zone, en, zh in (("Europe/Berlin", "Times in Europe/Berlin (hover for UTC).", "时间为 Europe/Berlin 时区（悬停可查看 UTC）。"),
                         ("UTC", "Times in UTC.", "时间为 UTC。")):
        with TestClient(create_app(settings.model_copy(update={"timezone": zone}))) as c:
            assert en in c.get("/login").text
            assert zh in c.get("/login", headers=ZH).text


def test_the_checks_catch_english(busy_lab):
    english = busy_lab.alice.get("/me/reservations").text
    assert "My reservations" in english_words(english)
    assert english_message_ids() & set(visible_text(english))


def test_english_without_a_preference_or_header(weblab):
    r = weblab.alice.get("/me/reservations")
    assert '<html lang="en">' in r.text and "<h1>My reservations</h1>" in r.text
    assert r.headers["content-language"] == "en" and "Accept-Language" in r.headers["vary"]


def test_the_stored_preference_beats_the_browser_and_can_be_cleared(weblab, session_factory):
    from app.models import User

    r = weblab.alice.post("/profile/language", {"language": "zh_CN"})
    assert r.status_code == 303 and r.headers["location"].startswith("/profile?done=language")
    page = weblab.alice.get("/me/reservations", headers={"Accept-Language": "en-US,en;q=0.9"}).text
    assert '<html lang="zh-CN">' in page and "<h1>我的预约</h1>" in page
    assert "语言已保存。" in weblab.alice.get("/profile?done=language").text
    assert weblab.bob.get("/me/reservations").text.count("<h1>My reservations</h1>") == 1  # only alice chose
    with session_factory() as s:
        assert s.query(User).filter_by(username="alice").one().language == "zh_CN"
    assert weblab.alice.post("/profile/language", {"language": ""}).status_code == 303
    assert "<h1>My reservations</h1>" in weblab.alice.get("/me/reservations").text
    assert "<h1>我的预约</h1>" in weblab.alice.get("/me/reservations", headers=ZH).text


def test_an_unoffered_language_is_refused_naming_the_field(weblab, session_factory):
    from app.models import User

    r = weblab.alice.post("/profile/language", {"language": "fr_FR"})
    assert r.status_code == 422
    assert 'id="language-choice" name="language" aria-invalid="true"' in r.text and "language: &#39;fr_FR&#39;" in r.text
    with session_factory() as s:
        assert s.query(User).filter_by(username="alice").one().language is None


def test_htmx_fragments_and_flash_notices_follow_the_language(busy_lab):
    r = busy_lab.alice.get("/", headers={**ZH, "HX-Request": "true"})
    assert "<html" not in r.text and "更新于" in r.text and english_words(r.text) == []
    assert "预约已取消。" in busy_lab.alice.get("/me/reservations?done=cancelled", headers=ZH).text


def test_the_api_reads_and_sets_the_language(client, make_user):
    erin = make_user("erin")
    assert client.get("/api/v1/me", headers=erin.headers).json()["language"] is None
    r = client.put("/api/v1/me/language", json={"language": "zh_CN"}, headers=erin.headers)
    assert r.status_code == 200 and r.json()["language"] == "zh_CN"
    bad = client.put("/api/v1/me/language", json={"language": "fr"}, headers=erin.headers)
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
    assert "language" in bad.json()["detail"]
    assert client.get("/api/v1/me", headers=erin.headers).json()["language"] == "zh_CN"
    assert client.put("/api/v1/me/language", json={"language": None}, headers=erin.headers).json()["language"] is None


def test_an_approval_decision_reaches_the_owner_in_their_language(weblab, session_factory):
    from app.models import AuditLog

    assert weblab.alice.post("/profile/language", {"language": "zh_CN"}).status_code == 303
    assert _api(weblab.admin, "POST", "/rules", json={"scope": "default", "approval_above_devices": 1}).status_code == 201
    r = _api(weblab.alice, "POST", "/reservations", json={"host": "node-01", "devices": [0, 1],
                                                          "start": (datetime.now(UTC) + timedelta(days=2)).isoformat(),
                                                          "duration": "PT2H"})
    rid = r.json()["id"]
    assert weblab.admin.post(f"/approvals/{rid}", {"decision": "deny", "reason": "maintenance week"}).status_code == 303
    with session_factory() as s:
        told = s.query(AuditLog).filter_by(action="notice.reservation").one().detail
    assert told["subject"] == f"[gpuroster] 预约 {rid} 被拒绝"
    assert told["text"].startswith(f"你在 node-01 上的预约 {rid}（") and told["text"].endswith("被 boss 拒绝：maintenance week")


def test_a_failed_sign_in_is_explained_in_chinese(weblab, client):
    from tests.web.conftest import csrf_of

    form = client.get("/login", headers=ZH).text
    r = client.post("/login", headers=ZH, data={"username": "alice", "password": "not it", "csrf_token": csrf_of(form),
                                                  "next": "/"}, follow_redirects=False)
    assert r.status_code == 401 and "<strong>登录失败:</strong> 用户名或密码错误" in r.text
