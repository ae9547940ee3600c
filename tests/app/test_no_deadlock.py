"""Concurrent writers of overlapping reservations on PostgreSQL: every one ends in a booking
or a 409 naming the winner, never a deadlock.

Two transactions inserting overlapping rows into an exclusion constraint at the same moment
each see the other's uncommitted row and wait for each other, so PostgreSQL aborts one with
40P01 (which the API would answer 503). Writers serialise per physical GPU to rule that out.
The writers meet at a barrier after the conflict pre-check, so their inserts really are
simultaneous.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from app.errors import ReservationConflict
from app.schemas.reservation import ReservationCreate
from tests.conftest import future

pytestmark = pytest.mark.commits  # simultaneous writers, each on its own connection

WRITERS = 8
ROUNDS = 6


def test_simultaneous_overlapping_inserts_end_in_one_booking_and_409s(db_url, settings, lab, session_factory, monkeypatch):
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers with BEGIN IMMEDIATE: no concurrent inserts to race")
    from app.models import User
    from app.services import conflicts
    from app.services import reservations as reservation_service
    from sqlalchemy import select

    real_guarded = conflicts.write_guarded
    barrier = threading.Barrier(WRITERS, timeout=30)

    def guarded_after_barrier(*a, **kw):
        barrier.wait()  # everyone has passed the pre-check and is about to insert
        return real_guarded(*a, **kw)

    monkeypatch.setattr(reservation_service, "write_guarded", guarded_after_barrier)

    for round_ in range(ROUNDS):
        start = future(48 + round_ * 3)
        # two devices in opposite orders, and one alone: overlapping rows on shared GPUs
        wanted = [[lab.devices[0], lab.devices[1]], [lab.devices[1], lab.devices[0]], [lab.devices[1]]]
        outcomes: list[str] = []
        lock = threading.Lock()

        def write(i: int) -> None:
            with session_factory() as s:
                try:
                    with s.begin():
                        actor = s.scalar(select(User).where(User.username == ("alice" if i % 2 else "bob")))
                        data = ReservationCreate(host="node-01", devices=wanted[i % 3], start=start.isoformat(),
                                                 end=(start + timedelta(hours=1)).isoformat())
                        reservation_service.create_reservation(s, actor=actor, data=data, settings=settings)
                    result = "booked"
                except ReservationConflict as e:
                    result = "409" if e.extra.get("conflicts") else f"409 without names: {e.detail}"
                except Exception as e:  # noqa: BLE001 - the test reports whatever else happened
                    result = f"{type(e).__name__}: {str(e)[:200]}"
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(set(outcomes)) == ["409", "booked"], (round_, outcomes)
        assert outcomes.count("booked") == 1, (round_, outcomes)
