"""Browser tests: real headless Chromium against ``gpuroster serve`` on loopback, once on
SQLite and once on a fresh PostgreSQL database.

Sign in, book two devices through the form, see the booking on Now and on the timeline,
get a named conflict for the same slot, cancel, sign out; a page without a session
redirects to sign-in; a form post without the CSRF token is refused. Screenshots of every
page at desktop (1280x900) and phone (390x844) width go to
``test-artifacts/screenshots/<database>/``.

Needs the Debian ``chromium`` package and Playwright for Python (never ``playwright
install``); without them these tests skip with a loud reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from tests.conftest import IN_CI, PG_SERVER, REPO, _create_pg_database, _drop_pg_database, require_pg
from testkit.live import Seeder, gpuroster_env, live_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
CAPTURE = REPO / "agent" / "captures" / "pai__nvidia_smi_out_of_order.xml"
LAB_TZ = "Europe/Berlin"
PASSWORD = "correct horse battery"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
UUIDS = [f"GPU-{i}{i}{i}{i}c0de-8a1e-4b2c-9d3f-00000000000{i}" for i in range(4)]


def _require_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        missing.append(f"Playwright for Python is not installed ({e})")
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    if missing:
        msg = "; ".join(missing)
        if IN_CI:
            pytest.fail("browser tests cannot run under CI: " + msg)
        pytest.skip("SKIPPING BROWSER TESTS: " + msg)


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module (the system's, never a downloaded one)."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Live:
    db: str
    url: str
    tokens: dict[str, str]
    reservation_id: int


def _seed(url: str, env: dict[str, str]) -> tuple[dict[str, str], int]:
    """Users, two hosts (one replayed from a capture, with a finding), a few reservations."""
    with Seeder(env["GPUROSTER_DATABASE_URL"]) as seed:
        tokens = {name: seed.user(name, admin=admin, email=f"{name}@lab.example", password=PASSWORD)
                  for name, admin in (("boss", True), ("alice", False), ("bob", False))}
        node, replay = seed.host("node-01"), seed.host("k80-replay")
    now = datetime.now(UTC)
    devices = [
        {"uuid": u, "index": i, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920,
         "pci_bus_id": f"00000000:{0x17 + i:02X}:00.0", "memory_used_mib": [512, 40960, 0, 79000][i],
         "utilization_gpu": [0, 87, 0, 99][i], "temperature_c": [31, 64, 30, 71][i], "power_draw_w": [61, 290, 58, 355][i],
         "power_limit_w": 400}
        for i, u in enumerate(UUIDS)
    ]
    processes = [
        {"device_uuid": UUIDS[1], "pid": 31337, "unix_user": "bob", "uid": 1002, "name": "python", "command": "python train.py",
         "used_memory_mib": 40448, "container_id": "4f9c2b1a7d3e5f60718293a4b5c6d7e8"},
        {"device_uuid": UUIDS[3], "pid": 4242, "unix_user": "mallory", "uid": 1666, "name": "miner", "used_memory_mib": 78848},
    ]
    findings = [{"key": f"{UUIDS[3]}:4242:1.0:unreserved", "kind": "unreserved", "device_uuid": UUIDS[3], "pid": 4242,
                 "unix_user": "mallory", "uid": 1666, "command": "./miner --pool x", "first_seen": (now - timedelta(minutes=8)).isoformat(),
                 "last_seen": now.isoformat(), "state": "notified",
                 "notices": [{"channel": "terminal", "recipient": "mallory", "at": now.isoformat(), "delivered": 1}]}]
    body = {"host": "node-01", "seq": 1, "collected_at": now.isoformat(), "devices": devices, "processes": processes,
            "findings": findings, "driver_version": "550.54.15", "cuda_version": "12.4", "interval_seconds": 600}
    r = httpx.post(url + "/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {node}"})
    assert r.status_code == 200, r.text

    from agent.collect import SnapshotBuilder
    from agent.replay import ReplaySource

    snap = SnapshotBuilder(ReplaySource([CAPTURE]), host="k80-replay", interval=600).build(seq=1, now=now)
    snap.devices[-1].health, snap.devices[-1].error = "lost", "GPU is lost"
    r = httpx.post(url + "/api/v1/agent/snapshots", json=json.loads(snap.model_dump_json()),
                   headers={"Authorization": f"Bearer {replay}"})
    assert r.status_code == 200, r.text

    def book(who: str, devices: list, start: str, duration: str, note: str, host: str = "node-01") -> int:
        r = httpx.post(url + "/api/v1/reservations", json={"host": host, "devices": devices, "start": start, "duration": duration,
                                                          "note": note}, headers={"Authorization": f"Bearer {tokens[who]}"})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    book("bob", [1], "now", "PT3H", "resnet sweep")
    book("bob", [2], (now + timedelta(hours=6)).isoformat(), "PT4H", "eval")
    book("boss", [0], (now + timedelta(days=2)).isoformat(), "PT8H", "maintenance")
    rid = book("boss", [1], (now + timedelta(hours=4)).isoformat(), "PT2H", "profiling", host="node-01")
    book("alice", [0], "now", "PT1H", "", host="k80-replay")
    return tokens, rid


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(request, tmp_path_factory):
    """A seeded ``gpuroster serve`` on a free loopback port (SQLite file, or a new PostgreSQL database)."""
    _require_browser()
    data_dir = tmp_path_factory.mktemp(f"live-{request.param}")
    pg_name = None
    if request.param == "sqlite":
        url = f"sqlite:///{data_dir / 'gpuroster.db'}"
    else:
        require_pg()
        pg_name = _create_pg_database()
        url = f"{PG_SERVER}/{pg_name}"
    env = gpuroster_env(url, data_dir, GPUROSTER_TIMEZONE=LAB_TZ, GPUROSTER_BASE_URL="http://127.0.0.1")
    try:
        with live_server(env, log=data_dir / "serve.log") as base:
            tokens, rid = _seed(base, env)
            yield Live(request.param, base, tokens, rid)
    finally:
        if pg_name:
            _drop_pg_database(pg_name)


@pytest.fixture
def page(chromium, live):
    context = chromium.new_context(viewport=DESKTOP)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


def _sign_in(page, live: Live, username: str, then: str = "/") -> None:
    page.goto(live.url + then)
    assert "/login?next=" in page.url
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(live.url + then)


def _local_input(dt: datetime) -> str:
    return dt.astimezone(ZoneInfo(LAB_TZ)).strftime("%Y-%m-%dT%H:%M")


def test_book_see_conflict_cancel_sign_out(page, live):
    _sign_in(page, live, "alice")
    assert page.get_by_role("heading", name="Now").is_visible()

    # book GPUs 2 and 3 of node-01, starting in 30 minutes, through the form
    start = (datetime.now(UTC) + timedelta(minutes=30)).replace(second=0, microsecond=0)
    page.get_by_role("link", name="Book", exact=True).click()
    page.select_option("#host", "node-01")
    for uuid in UUIDS[2:]:
        page.check(f'input[name="devices"][value="{uuid}"]')
    page.check('input[name="when"][value="at"]')
    page.fill("#start", _local_input(start))
    page.fill("#length", "1")
    page.fill("#note", "browser run")
    page.wait_for_selector("#check >> text=Free.")  # the htmx check, before submitting
    page.get_by_role("button", name="Book", exact=True).click()
    page.wait_for_url(re.compile(r".*/me/reservations/\d+\?booked=1$"))
    exports = page.inner_text("#exports")
    assert exports == f"export CUDA_VISIBLE_DEVICES={UUIDS[2]},{UUIDS[3]}\nexport CUDA_DEVICE_ORDER=PCI_BUS_ID"
    rid = int(re.search(r"/me/reservations/(\d+)", page.url).group(1))

    # Now: GPU 3 runs mallory's unreserved miner, and nothing is reserved on it until alice's booking
    page.goto(live.url + "/")
    row = page.locator("article.dev", has=page.locator(f'code:text-is("{UUIDS[3]}")'))
    assert "not reserved until" in row.inner_text() and "then alice" in row.inner_text()
    # ...and the hosts block refreshes itself through the htmx fragment
    with page.expect_response(lambda r: r.url == live.url + "/" and r.request.headers.get("hx-request") == "true",
                              timeout=12_000) as polled:
        pass
    assert polled.value.status == 200 and "HX-Request" in polled.value.headers["vary"]
    assert page.url == live.url + "/"

    # Timeline: a bar labelled with user and note on both devices
    page.goto(live.url + "/timeline" + ("?day=" + start.astimezone(ZoneInfo(LAB_TZ)).date().isoformat()))
    bars = page.locator("a.tl-bar", has_text="alice · browser run")
    assert bars.count() == 2

    # the same slot again: the conflict is named on the page
    page.goto(live.url + "/book")
    page.select_option("#host", "node-01")
    page.check(f'input[name="devices"][value="{UUIDS[3]}"]')
    page.check('input[name="when"][value="at"]')
    page.fill("#start", _local_input(start))
    page.fill("#length", "1")
    page.wait_for_selector("#check >> text=Not free.")
    assert f"#{rid} by alice on GPU 3," in page.inner_text("#check")  # of alice's GPU 2 and 3, the one in the way
    page.get_by_role("button", name="Book", exact=True).click()
    flash = page.locator("#flash .error")
    flash.wait_for()
    text = flash.inner_text()
    assert "Reservation conflict" in text and f"#{rid} by alice on GPU 3," in text
    assert start.astimezone(ZoneInfo(LAB_TZ)).strftime("%H:%M") in text

    # cancel it
    page.get_by_role("link", name="My reservations").click()
    item = page.locator(f"#r{rid}")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))  # "no": nothing happens
    item.get_by_role("button", name="Cancel").click()
    assert asked == [f"Cancel reservation #{rid}?"] and "cancelled" not in item.inner_text()
    page.once("dialog", lambda d: d.accept())
    item.get_by_role("button", name="Cancel").click()
    page.wait_for_url(live.url + "/me/reservations?done=cancelled")
    assert page.locator("#flash .notice").inner_text() == "Reservation cancelled."
    assert "cancelled" in page.locator(f"#r{rid}").inner_text()

    # sign out: pages need signing in again
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(live.url + "/login")
    page.goto(live.url + "/me/reservations")
    assert page.url == live.url + "/login?next=/me/reservations"


def test_page_without_session_redirects_to_sign_in(page, live):
    for path in ("/", "/timeline", "/admin"):
        page.goto(live.url + path)
        assert page.url == f"{live.url}/login?next={path}"
        assert page.get_by_role("heading", name="Sign in").is_visible()


def test_form_post_without_csrf_token_is_refused(page, live):
    _sign_in(page, live, "bob", then="/me/reservations")
    rid = int(page.locator("article.res").first.get_attribute("id")[1:])
    # a forged form post (what another site could make the browser send): the cookie alone is not enough
    status = page.evaluate(
        """async (rid) => (await fetch(`/me/reservations/${rid}/end`, {method: "POST",
             headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "", redirect: "manual"})).status""",
        rid,
    )
    assert status == 403
    resp = page.request.post(f"{live.url}/book", form={"mode": "devices", "host": "node-01", "devices": UUIDS[0],
                                                        "when": "now", "length": "1"})
    assert resp.status == 403 and "security token" in resp.text()
    r = httpx.get(f"{live.url}/api/v1/reservations/{rid}", headers={"Authorization": f"Bearer {live.tokens['bob']}"})
    assert r.json()["status"] == "confirmed"


PAGES = [
    ("now", "/"), ("timeline", "/timeline"), ("timeline-week", "/timeline?view=week"), ("book", "/book"),
    ("my-reservations", "/me/reservations"), ("reservation", None), ("findings", "/findings"), ("admin", "/admin"),
    ("profile", "/profile"), ("usage", "/reports/usage"),
]
API_DOCS = [("api-docs", "/docs", ".swagger-ui .info .title"), ("api-redoc", "/redoc", "redoc h1")]


def _at_each_width(chromium, timeout_ms: int):
    """``(label, viewport, page)`` at desktop, then at phone width, each page in a context of
    its own (closed after its turn), waiting at most ``timeout_ms`` for anything."""
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        context = chromium.new_context(viewport=viewport, device_scale_factor=1)
        try:
            pg = context.new_page()
            pg.set_default_timeout(timeout_ms)
            yield label, viewport, pg
        finally:
            context.close()


def test_screenshots_of_every_page_at_desktop_and_phone_width(chromium, live):
    out = SCREENSHOTS / live.db
    out.mkdir(parents=True, exist_ok=True)
    for label, viewport, pg in _at_each_width(chromium, 15_000):
        pg.goto(live.url + "/login")
        pg.screenshot(path=str(out / f"login-{label}.png"), full_page=True)
        _sign_in(pg, live, "boss")
        for name, path in PAGES:
            pg.goto(live.url + (path or f"/me/reservations/{live.reservation_id}"))
            assert pg.locator("main h1").first.is_visible(), name
            if name == "book":
                pg.select_option("#host", "node-01")
                pg.check(f'input[name="devices"][value="{UUIDS[1]}"]')
                pg.wait_for_selector("#check >> text=Not free.")
            target = out / f"{name}-{label}.png"
            pg.screenshot(path=str(target), full_page=True)
            assert target.stat().st_size > 10_000
            width = pg.evaluate("document.documentElement.scrollWidth")
            assert width <= viewport["width"], f"{name} scrolls sideways at {label} width ({width}px)"
            if name == "timeline":  # the "now" line is on screen, also where the grid scrolls sideways
                now = pg.locator(".tl-scroll .tl-now").first.bounding_box()
                assert now is not None and 0 < now["x"] < viewport["width"], f"'now' off-screen at {label} width: {now}"


@pytest.mark.parametrize("live", ["sqlite"], indirect=True)
def test_api_docs_render_from_the_vendored_assets_at_desktop_and_phone_width(chromium, live):
    """Swagger UI and ReDoc render offline (the run has no internet), from the vendored scripts.

    Once, on SQLite: these pages read only the OpenAPI document, which no database changes.
    Their scripts (1.7 MB of Swagger UI, 1.1 MB of ReDoc) parse and lay out the whole API on
    the page's main thread: 1-2 s on a quiet 2-core machine, more than 15 s with the rest of the
    suite beside it, hence the long wait, which only a page that never renders reaches.
    """
    out = SCREENSHOTS / live.db
    out.mkdir(parents=True, exist_ok=True)
    for label, _viewport, pg in _at_each_width(chromium, 90_000):
        for name, path, ready in API_DOCS:
            pg.goto(live.url + path)
            pg.wait_for_selector(ready)
            target = out / f"{name}-{label}.png"
            pg.screenshot(path=str(target), full_page=name == "api-docs")
            assert target.stat().st_size > 10_000, name


def test_every_page_runs_under_the_content_security_policy(chromium, live):
    """D11: no page (nor its htmx requests) triggers a CSP violation in the console, and the
    page cannot be framed."""
    context = chromium.new_context(viewport=DESKTOP)
    context.add_init_script("""window.__csp = [];
        document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));""")
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    console: list[str] = []
    pg.on("console", lambda m: console.append(m.text))
    pg.goto(live.url + "/login")
    _sign_in(pg, live, "boss")
    for name, path in PAGES + [("usage", "/reports/usage")]:
        pg.goto(live.url + (path or f"/me/reservations/{live.reservation_id}"))
        assert pg.locator("main h1").first.is_visible(), name
        if name == "book":  # htmx: the device list and the posted availability check
            pg.select_option("#host", "node-01")
            pg.check(f'input[name="devices"][value="{UUIDS[1]}"]')
            pg.wait_for_selector("#check >> text=Not free.")
        assert pg.evaluate("window.__csp") == [], (name, pg.evaluate("window.__csp"))
        assert "frame-ancestors 'none'" in pg.context.request.get(pg.url).headers["content-security-policy"]
    violations = [m for m in console if "Content Security Policy" in m or "Refused to" in m]
    assert violations == []
    # framed by another site: refused (the frame stays empty)
    pg.set_content(f'<iframe id="f" src="{live.url}/login"></iframe>')
    pg.wait_for_timeout(1000)
    frame = pg.frame_locator("#f")
    assert frame.locator("form[action='/login']").count() == 0
    context.close()
