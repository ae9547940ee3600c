"""The check-in questions on the pages: Now and My reservations show "no check-in yet —
keep it?" and "still using it?" with Keep it / Release now forms (CSRF, no inline code) to
the holder only; the signed answer link works without a session, shows a button before it
changes anything, and refuses a forged token (both databases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from app.db import run_in_transaction
from app.models import Reservation
from app.services import answer_links


def _book(who, devices, hours=3):
    body = {"host": "node-01", "devices": devices, "start": "now", "duration": f"PT{hours}H"}
    r = who.client.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": who.csrf})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _set(session_factory, rid, **values):
    run_in_transaction(session_factory, lambda s: s.execute(update(Reservation).where(Reservation.id == rid).values(**values)))


def _question_block(html: str, rid: int) -> str:
    return html.split(f'id="q{rid}"', 1)[1].split("</div>\n</div>", 1)[0]


def test_no_show_warning_on_now_and_mine_with_keep(weblab, session_factory):
    rid = _book(weblab.alice, [0])
    _set(session_factory, rid, checkin_warned_at=datetime.now(UTC))
    for url in ("/", "/me/reservations"):
        page = weblab.alice.get(url).text
        assert "No check-in yet — keep it?" in page, url
        block = _question_block(page, rid)
        assert f'action="/me/reservations/{rid}/keep"' in block and f'action="/me/reservations/{rid}/end"' in block
        assert 'name="csrf_token"' in block and "<script" not in block and "style=" not in block
    assert "No check-in yet" not in weblab.bob.get("/").text
    assert weblab.bob.post(f"/me/reservations/{rid}/keep").status_code == 403
    kept = weblab.alice.post(f"/me/reservations/{rid}/keep")
    assert kept.status_code == 303 and kept.headers["location"] == "/me/reservations?done=kept"
    assert "No check-in yet" not in weblab.alice.get("/").text
    with session_factory() as s:
        assert s.get(Reservation, rid).checkin_kept_at is not None
    # nothing left to answer: refused, said on the page
    again = weblab.alice.post(f"/me/reservations/{rid}/keep")
    assert again.status_code == 409 and "nothing to answer" in again.text


def test_still_using_it_release_now_counts_as_consent(weblab, session_factory):
    rid = _book(weblab.alice, [1])
    now = datetime.now(UTC)
    _set(session_factory, rid, checked_in_at=now - timedelta(minutes=50), idle_asked_at=now)
    page = weblab.alice.get("/").text
    assert "Still using it?" in page and f'id="q{rid}"' in page
    assert weblab.alice.post(f"/me/reservations/{rid}/end").status_code == 303
    with session_factory() as s:
        r = s.get(Reservation, rid)
        assert (r.status, r.auto_release) == ("released", "idle_consent")
    report = weblab.alice.get("/reports/usage").text  # this month's report counts it
    assert 'data-k="consent_releases">1<' in report and 'data-k="no_shows">0<' in report
    assert "released after “still using it?”" in report


def test_signed_answer_link_needs_no_session_and_a_post(weblab, session_factory, client, settings):
    rid = _book(weblab.alice, [2])
    _set(session_factory, rid, checkin_warned_at=datetime.now(UTC))
    with session_factory() as s:
        end = s.get(Reservation, rid).end_at
    keep = answer_links.token(settings, reservation_id=rid, answer="keep", expires=end)
    client.cookies.clear()
    shown = client.get(f"/answer/{keep}")
    assert shown.status_code == 200 and "Keep it" in shown.text and f"#{rid}" in shown.text
    with session_factory() as s:
        assert s.get(Reservation, rid).checkin_kept_at is None  # opening the link changes nothing
    done = client.post(f"/answer/{keep}")
    assert done.status_code == 200 and "Kept" in done.text
    with session_factory() as s:
        assert s.get(Reservation, rid).checkin_kept_at is not None
    forged = keep[:-2] + ("AA" if not keep.endswith("AA") else "BB")
    bad = client.post(f"/answer/{forged}")
    assert bad.status_code == 422 and "not an answer link" in bad.text
    other = answer_links.token(settings, reservation_id=rid, answer="release", expires=end)
    assert client.post(f"/answer/{other.replace(f'{rid}.release', f'{rid}.keep')}").status_code == 422
    released = client.post(f"/answer/{other}")
    assert released.status_code == 200 and "Released" in released.text
    with session_factory() as s:
        assert s.get(Reservation, rid).status == "released"
