"""The booking form in the lab's zone: a start on the autumn DST night asks which of the two
instants is meant, and books the chosen one."""

from __future__ import annotations

from datetime import UTC, datetime

from app.models import Reservation
from tests.web.conftest import count


def _form(weblab, **extra) -> dict:
    return {"mode": "devices", "host": "node-01", "devices": [weblab.devices[0]], "when": "at",
            "start": "2027-10-31T02:30", "length": "1", "note": "", **extra}


def test_repeated_start_time_offers_both_instants_then_books_the_chosen_one(weblab, session_factory):
    r = weblab.alice.post("/book", _form(weblab))
    assert r.status_code == 422
    assert "occurs twice" in r.text and 'id="fold-choice"' in r.text
    assert "2027-10-31 02:30 CEST (UTC+02:00)" in r.text and "2027-10-31 02:30 CET (UTC+01:00)" in r.text
    assert count(session_factory, Reservation) == 0
    r = weblab.alice.post("/book", _form(weblab, fold="1"))
    assert r.status_code == 303, r.text
    with session_factory() as s:
        assert s.query(Reservation).one().start_at == datetime(2027, 10, 31, 1, 30, tzinfo=UTC)


def test_spring_gap_start_is_refused_on_the_form(weblab, session_factory):
    r = weblab.alice.post("/book", _form(weblab, start="2027-03-28T02:30"))
    assert r.status_code == 422 and "does not exist" in r.text and 'id="fold-choice"' not in r.text
