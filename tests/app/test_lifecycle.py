"""Reservation states and the one table of legal transitions, on both databases: every
(phase, action) pair is either in the table and applied, or refused with a 409 that names
who changed the reservation last."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from app.services.lifecycle import TRANSITIONS, Action, Phase, Status, legal_actions, phase
from tests.conftest import book, future


def test_transition_table_lists_only_upcoming_active_and_pending_as_changeable():
    # EXPIRED only takes the sweep's EXPIRE (storing that a pending reached its start unapproved)
    assert {p for p, _ in TRANSITIONS} == {Phase.UPCOMING, Phase.ACTIVE, Phase.PENDING, Phase.EXPIRED}
    assert legal_actions(Phase.EXPIRED) == [Action.EXPIRE]
    assert TRANSITIONS[(Phase.UPCOMING, Action.CANCEL)] == Status.CANCELLED
    assert TRANSITIONS[(Phase.ACTIVE, Action.RELEASE)] == Status.RELEASED
    assert (Phase.ACTIVE, Action.CANCEL) not in TRANSITIONS and (Phase.UPCOMING, Action.RELEASE) not in TRANSITIONS
    for p in (Phase.ENDED, Phase.CANCELLED, Phase.RELEASED, Phase.DENIED):
        assert legal_actions(p) == []
    assert {s.value for s in Status} == {"confirmed", "cancelled", "released", "pending", "denied", "expired"}


def test_phase_is_half_open():
    class R:
        status = "confirmed"
        start_at = datetime(2027, 1, 1, 10, tzinfo=UTC)
        end_at = datetime(2027, 1, 1, 11, tzinfo=UTC)

    assert phase(R, R.start_at - timedelta(microseconds=1)) == Phase.UPCOMING
    assert phase(R, R.start_at) == Phase.ACTIVE
    assert phase(R, R.end_at) == Phase.ENDED


def _call(client, actor, action: str, rid: int, end: str | None = None):
    if action == "cancel":
        return client.delete(f"/api/v1/reservations/{rid}", headers=actor.headers)
    if action == "release":
        return client.post(f"/api/v1/reservations/{rid}/release", headers=actor.headers)
    if action == "change_end":
        return client.patch(f"/api/v1/reservations/{rid}", json={"end": end}, headers=actor.headers)
    return client.patch(f"/api/v1/reservations/{rid}", json={"note": "x"}, headers=actor.headers)


@pytest.mark.parametrize("after", ["cancel", "change_end", "edit"])
def test_after_a_cancel_every_change_is_refused_naming_who_cancelled(client, lab, after):
    start = future(30)
    r = book(client, lab.alice, [0], start)
    rid = r.json()["id"]
    assert _call(client, lab.admin, "cancel", rid).status_code == 200
    refused = _call(client, lab.alice, after, rid, (start + timedelta(hours=3)).isoformat())
    assert refused.status_code == 409
    doc = refused.json()
    assert doc["changed_by"] == "boss" and doc["changed_action"] == "cancel" and doc["state"] == "cancelled"
    assert "was cancelled by boss at" in doc["detail"]
    assert re.search(r"\d\d:\d\d CES?T \(UTC\+0[12]:00\)", doc["detail"]), "the time in the lab's zone"


@pytest.mark.parametrize("after", ["release", "change_end", "edit"])
def test_after_a_release_every_change_is_refused_naming_who_released(client, lab, after):
    r = book(client, lab.alice, [1], "now")
    rid = r.json()["id"]
    assert _call(client, lab.alice, "release", rid).status_code == 200
    refused = _call(client, lab.admin, after, rid, (datetime.now(UTC) + timedelta(hours=3)).isoformat())
    assert refused.status_code == 409
    assert refused.json()["changed_by"] == "alice" and refused.json()["state"] == "released"


def test_non_terminal_changes_apply_one_after_the_other(client, lab):
    start = future(30)
    rid = book(client, lab.alice, [2], start).json()["id"]
    assert _call(client, lab.alice, "edit", rid).status_code == 200
    r = _call(client, lab.admin, "change_end", rid, (start + timedelta(hours=2)).isoformat())
    assert r.status_code == 200
    r = _call(client, lab.alice, "cancel", rid)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_someone_elses_reservation_is_403_whatever_its_state(client, lab):
    rid = book(client, lab.alice, [3], future(30)).json()["id"]
    assert _call(client, lab.bob, "cancel", rid).status_code == 403
    assert _call(client, lab.alice, "cancel", rid).status_code == 200
    assert _call(client, lab.bob, "edit", rid).status_code == 403
