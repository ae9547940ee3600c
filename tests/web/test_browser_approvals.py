"""Browser (headless Chromium against ``gpuroster serve``, SQLite and PostgreSQL): a member
books above the approval threshold on the Book page and sees the request pending; an admin
approves it on the Approvals page; the member sees it confirmed on My reservations, at phone
width too. Screenshots go to ``test-artifacts/screenshots/<database>/approval-*.png``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.web.test_browser import (  # noqa: F401
    DESKTOP, PHONE, SCREENSHOTS, UUIDS, _local_input, _sign_in, chromium, live,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_request_pending_then_approved_on_the_approvals_page_then_confirmed(chromium, live):  # noqa: F811
    out = SCREENSHOTS / live.db
    out.mkdir(parents=True, exist_ok=True)
    boss = {"Authorization": f"Bearer {live.tokens['boss']}"}
    r = httpx.post(live.url + "/api/v1/rules", headers=boss, json={"scope": "default", "approval_above_devices": 1})
    assert r.status_code == 201, r.text
    # three days ahead, GPUs 2 and 3 of node-01 are free in the seeded lab
    start = (datetime.now(UTC) + timedelta(days=3)).replace(minute=0, second=0, microsecond=0)

    member = chromium.new_context(viewport=DESKTOP)
    admin = chromium.new_context(viewport=DESKTOP)
    try:
        alice = member.new_page()
        alice.set_default_timeout(15_000)
        _sign_in(alice, live, "alice", "/book")
        alice.select_option("#host", "node-01")
        for uuid in UUIDS[2:]:
            alice.check(f'input[name="devices"][value="{uuid}"]')
        alice.check('input[name="when"][value="at"]')
        alice.fill("#start", _local_input(start))
        alice.fill("#length", "2")
        alice.fill("#note", "needs a yes")
        alice.wait_for_selector("#check >> text=Free.")
        alice.get_by_role("button", name="Book", exact=True).click()
        alice.wait_for_url(re.compile(r".*/me/reservations/\d+\?booked=1$"))
        rid = int(re.search(r"/me/reservations/(\d+)", alice.url).group(1))
        assert alice.locator("h1 .badge").inner_text() == "pending"
        alice.goto(live.url + "/me/reservations")
        item = alice.locator(f"#r{rid}")
        assert item.locator(".badge").inner_text() == "pending"
        assert item.get_by_text("Awaiting approval").is_visible()
        assert item.get_by_role("button", name="Withdraw request").is_visible()
        alice.screenshot(path=str(out / "approval-mine-pending-desktop.png"), full_page=True)
        api = httpx.get(f"{live.url}/api/v1/reservations/{rid}", headers={"Authorization": f"Bearer {live.tokens['alice']}"})
        assert api.json()["status"] == "pending"

        boss_page = admin.new_page()
        boss_page.set_default_timeout(15_000)
        _sign_in(boss_page, live, "boss", "/approvals")
        request = boss_page.locator(f"#approvals #r{rid}")
        assert "alice on node-01" in request.inner_text() and "GPU 2, 3" in request.inner_text()
        assert "needs a yes" in request.inner_text()
        boss_page.screenshot(path=str(out / "approval-approvals-desktop.png"), full_page=True)
        request.get_by_label("Reason (told to alice)").fill("go ahead")
        request.get_by_role("button", name="Approve").click()
        boss_page.wait_for_url(live.url + "/approvals?done=approve")
        assert boss_page.locator(f"#approvals #r{rid}").count() == 0

        alice.set_viewport_size(PHONE)
        alice.reload()
        item = alice.locator(f"#r{rid}")
        assert item.locator(".badge").inner_text() == "upcoming" and item.is_visible()
        assert item.get_by_text("Awaiting approval").count() == 0
        assert item.get_by_role("button", name="Cancel").is_visible()
        assert f"CUDA_VISIBLE_DEVICES={UUIDS[2]},{UUIDS[3]}" in item.inner_text()
        assert alice.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        alice.screenshot(path=str(out / "approval-mine-confirmed-phone.png"), full_page=True)
        api = httpx.get(f"{live.url}/api/v1/reservations/{rid}", headers={"Authorization": f"Bearer {live.tokens['alice']}"})
        assert api.json()["status"] == "confirmed"
    finally:
        member.close()
        admin.close()
