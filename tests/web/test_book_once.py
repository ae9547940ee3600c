"""The booking form carries a fresh idempotency key per render: a double click books once."""

from __future__ import annotations

import re

from app.models import Reservation
from tests.web.conftest import count

KEY_RE = re.compile(r'name="idempotency_key" value="([^"]+)"')


def _form(weblab, key: str, device: int = 0) -> dict:
    return {"mode": "devices", "host": "node-01", "devices": [weblab.devices[device]], "when": "now", "start": "",
            "length": "2", "note": "", "idempotency_key": key}


def test_each_render_of_the_book_page_has_its_own_key(weblab):
    keys = {KEY_RE.search(weblab.alice.get("/book").text).group(1) for _ in range(3)}
    assert len(keys) == 3


def test_double_submit_of_one_render_books_once(weblab, session_factory):
    key = KEY_RE.search(weblab.alice.get("/book").text).group(1)
    first = weblab.alice.post("/book", _form(weblab, key))
    second = weblab.alice.post("/book", _form(weblab, key))
    assert first.status_code == second.status_code == 303
    assert second.headers["location"] == first.headers["location"]
    assert count(session_factory, Reservation) == 1
    # the same key with another form is refused, and books nothing
    r = weblab.alice.post("/book", _form(weblab, key, device=1))
    assert r.status_code == 422 and "Idempotency-Key" in r.text
    assert count(session_factory, Reservation) == 1
    # a new render books again
    key2 = KEY_RE.search(weblab.alice.get("/book").text).group(1)
    assert weblab.alice.post("/book", _form(weblab, key2, device=1)).status_code == 303
    assert count(session_factory, Reservation) == 2
