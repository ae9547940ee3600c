"""Browser test of the check-in questions and health quarantine on Now: real headless
Chromium against ``gpuroster serve`` (SQLite and PostgreSQL). Alice holds one booking warned
for no check-in and one asked "still using it?", and GPU 2 is quarantined after an XID 79;
Now shows all three at desktop and phone width (no sideways scrolling), "Keep it" answers
one. Screenshots go to ``test-artifacts/screenshots/<database>/checkin-*.png``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import create_engine, update

from app.models import Reservation
from tests.conftest import PG_SERVER, _create_pg_database, _drop_pg_database, require_pg
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS, DESKTOP, PASSWORD, PHONE, SCREENSHOTS, _require_browser
from testkit.live import Seeder, gpuroster_env, live_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]
UUIDS = [f"GPU-{i}{i}{i}{i}c0de-8a1e-4b2c-9d3f-00000000000{i}" for i in range(4)]


def _seed(url: str, env: dict[str, str], db_url: str) -> list[int]:
    with Seeder(env["GPUROSTER_DATABASE_URL"]) as seed:
        alice, node = seed.user("alice", password=PASSWORD), seed.host("node-01")
    devices = [{"uuid": u, "index": i, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920,
                "memory_used_mib": [0, 30000, 0, 0][i], "utilization_gpu": [0, 1, 0, 0][i],
                "health_checks": [{"kind": "xid", "state": "bad" if i == 2 else "ok", **({"value": 79} if i == 2 else {})}]}
               for i, u in enumerate(UUIDS)]
    procs = [{"device_uuid": UUIDS[1], "pid": 77, "unix_user": "alice", "name": "python", "used_memory_mib": 29800}]
    body = {"host": "node-01", "seq": 1, "collected_at": datetime.now(UTC).isoformat(), "devices": devices,
            "processes": procs, "interval_seconds": 600}
    assert httpx.post(url + "/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {node}"}).status_code == 200
    ids = []
    for dev in (0, 1):
        r = httpx.post(url + "/api/v1/reservations", json={"host": "node-01", "devices": [dev], "start": "now",
                                                          "duration": "PT3H"}, headers={"Authorization": f"Bearer {alice}"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    now = datetime.now(UTC)
    engine = create_engine(db_url)
    with engine.begin() as c:  # what the sweep stores after the check-in window and after an idle hour
        c.execute(update(Reservation).where(Reservation.id == ids[0]).values(checkin_warned_at=now))
        c.execute(update(Reservation).where(Reservation.id == ids[1]).values(
            checked_in_at=now - timedelta(hours=1), idle_asked_at=now))
    engine.dispose()
    return ids


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(request, tmp_path_factory):
    _require_browser()
    data_dir = tmp_path_factory.mktemp(f"checkin-{request.param}")
    pg_name = None
    if request.param == "sqlite":
        url = f"sqlite:///{data_dir / 'gpuroster.db'}"
    else:
        require_pg()
        pg_name = _create_pg_database()
        url = f"{PG_SERVER}/{pg_name}"
    env = gpuroster_env(url, data_dir, GPUROSTER_TIMEZONE="Europe/Berlin", GPUROSTER_BASE_URL="http://127.0.0.1")
    try:
        with live_server(env, log=data_dir / "serve.log") as base:
            from app.config import normalize_database_url

            yield request.param, base, _seed(base, env, normalize_database_url(url))
    finally:
        if pg_name:
            _drop_pg_database(pg_name)


def test_now_shows_the_questions_on_desktop_and_phone_and_keep_answers(live):
    from playwright.sync_api import sync_playwright

    db, base, (warned, asked) = live
    out = SCREENSHOTS / db
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=DESKTOP)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(base + "/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(base + "/")
        assert page.locator(f"#q{warned}").get_by_text("No check-in yet — keep it?").is_visible()
        assert page.locator(f"#q{asked}").get_by_text("Still using it?").is_visible()
        sick = page.get_by_text("Quarantined since")
        assert sick.count() == 1 and sick.is_visible() and "XID 79 error" in sick.inner_text()
        # its stripe is the alarm colour, not the green of the free GPU below it
        stripe = "e => getComputedStyle(e).borderLeftColor"
        sick_row = page.locator("article.dev[data-quarantined]")
        free_row = page.locator('article.dev[data-status="free"]:not([data-quarantined])')
        assert sick_row.count() == 1 and sick_row.get_by_text("quarantined", exact=True).is_visible()
        assert sick_row.evaluate(stripe) != free_row.first.evaluate(stripe)
        page.screenshot(path=str(out / "checkin-now-desktop.png"), full_page=True)
        page.set_viewport_size(PHONE)
        page.reload()
        for rid in (warned, asked):
            assert page.locator(f"#q{rid}").get_by_role("button", name="Keep it").is_visible()
            assert page.locator(f"#q{rid}").get_by_role("button", name="Release now").is_visible()
        assert page.get_by_text("Quarantined since").is_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        page.screenshot(path=str(out / "checkin-now-phone.png"), full_page=True)
        page.locator(f"#q{warned}").get_by_role("button", name="Keep it").click()
        page.wait_for_url(base + "/me/reservations?done=kept")
        assert page.get_by_text("Kept: it is left alone").is_visible()
        assert page.locator(f"#q{warned}").count() == 0 and page.locator(f"#q{asked}").is_visible()
        page.screenshot(path=str(out / "checkin-mine-phone.png"), full_page=True)
        context.close()
        browser.close()
