"""Browser (headless Chromium, both databases, phone width after the first page): the Book
page's conflict offers "Wait for it"; the entry shows under "My waitlist" with its place
in line, and is booked by itself when the holder cancels."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.web.test_browser import PHONE, UUIDS, _local_input, _sign_in, chromium, live, page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_wait_for_a_taken_slot_then_booked_after_a_cancel(page, live):  # noqa: F811
    start = (datetime.now(UTC) + timedelta(days=4)).replace(minute=0, second=0, microsecond=0)
    bob = {"Authorization": f"Bearer {live.tokens['bob']}"}
    held = httpx.post(live.url + "/api/v1/reservations", headers=bob,
                      json={"host": "node-01", "devices": [0, 1, 2, 3], "start": start.isoformat(), "duration": "PT2H"})
    assert held.status_code == 201, held.text

    _sign_in(page, live, "alice", "/book")
    page.select_option("#host", "node-01")
    page.check(f'input[name="devices"][value="{UUIDS[0]}"]')
    page.check('input[name="when"][value="at"]')
    page.fill("#start", _local_input(start))
    page.fill("#length", "2")
    page.wait_for_selector("#check >> text=Not free.")
    page.get_by_role("button", name="Book", exact=True).click()
    offer = page.locator("#wait-offer")
    offer.wait_for()
    assert "1 device(s) of node-01 for 2 h" in offer.inner_text()
    page.set_viewport_size(PHONE)  # the offer fits a phone too
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"] and offer.is_visible()
    page.fill("#wait-within", "2")  # only the freed stretch itself will do
    offer.get_by_role("button", name="Wait for it").click()
    page.wait_for_url(re.compile(r".*/me/reservations\?done=waiting#waitlist$"))
    section = page.locator("#waitlist")
    assert "#1 in line" in section.inner_text() and "book for me" in section.inner_text()

    assert httpx.delete(f"{live.url}/api/v1/reservations/{held.json()['id']}", headers=bob).status_code == 200
    page.reload()
    booked = section.get_by_role("link", name=re.compile(r"reservation #\d+"))
    booked.wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    booked.click()
    page.wait_for_url(re.compile(r".*/me/reservations/\d+$"))
    assert f"export CUDA_VISIBLE_DEVICES={UUIDS[0]}" in page.inner_text("#exports")
