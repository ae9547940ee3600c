"""The write of a new reservation (:func:`app.services.booking_write.add_reservation`) and of
an audit entry (:func:`app.services.audit.record_audit`), below the API, on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import inspect, select

from app.errors import ReservationConflict
from app.models import AuditLog, Device, Host, Reservation, ReservationDevice, ReservationShare, User
from app.services.audit import record_audit
from app.services.booking_write import add_reservation
from app.services.conflicts import find_conflicts
from app.services.shares import resolve_shares
from tests.conftest import book, future


def _lab_rows(s):
    host = s.scalar(select(Host).where(Host.name == "node-01"))
    devices = list(s.scalars(select(Device).where(Device.host_id == host.id).order_by(Device.index)))
    alice = s.scalar(select(User).where(User.username == "alice"))
    return host, devices, alice


def test_the_written_reservation_is_the_rows_as_read_back(session_factory, lab):
    """What the callers get carries every column as written (defaults included), its devices
    in id order with their rows' interval, its shares; and the rows are what a fresh read
    of the reservation finds."""
    start, end = future(2), future(3)
    with session_factory() as s:
        host, devices, alice = _lab_rows(s)
        r = add_reservation(s, user=alice, host=host, devices=[devices[2], devices[0]], start=start, end=end,
                            values={"status": "confirmed", "note": "train", "created_by_id": alice.id,
                                    "created_at": start - timedelta(hours=1), "updated_at": start - timedelta(hours=1)},
                            shares=resolve_shares(s, ["bob"]))
        assert inspect(r).transient and r not in s  # the answer's source, never tracked
        s.commit()
    assert r.id is not None and r.kind == "booking" and r.sequence == 0 and r.status == "confirmed"
    assert r.user.username == "alice" and r.host.name == "node-01" and r.note == "train"
    assert [i.device.index for i in r.items] == [0, 2]
    assert all((i.start_at, i.end_at, i.active, i.reservation_id) == (start, end, True, r.id) for i in r.items)
    assert [s_.user.username for s_ in r.shares] == ["bob"] and r.shares[0].reservation_id == r.id

    with session_factory() as s:
        back = s.get(Reservation, r.id)
        assert (back.user_id, back.host_id, back.start_at, back.end_at, back.kind, back.note) == (
            r.user_id, r.host_id, start, end, "booking", "train")
        rows = s.execute(select(ReservationDevice.device_id, ReservationDevice.physical_id, ReservationDevice.slice_kind,
                                ReservationDevice.active).where(ReservationDevice.reservation_id == r.id)
                         .order_by(ReservationDevice.device_id)).all()
        assert rows == [(i.device.id, i.device.id, 0, True) for i in r.items]
        shares = s.execute(select(ReservationShare.user_id, ReservationShare.group_id)
                           .where(ReservationShare.reservation_id == r.id)).all()
        assert shares == [(r.shares[0].user.id, None)]
        assert [c.id for c in find_conflicts(s, devices=[devices[0]], start=start, end=end)] == [r.id]


def test_a_savepoint_rolled_back_after_a_write_leaves_nothing_behind(session_factory, lab):
    """The waitlist tries slot after slot in one transaction: a slot's booking undone by its
    savepoint leaves no row, no audit entry and no object in the session, and the next one
    is written and committed whatever id the database gives it."""
    start, end = future(2), future(3)
    with session_factory() as s:
        host, devices, alice = _lab_rows(s)
        values = {"status": "confirmed", "created_by_id": alice.id}
        sp = s.begin_nested()
        gone = add_reservation(s, user=alice, host=host, devices=[devices[0]], start=start, end=end, values=values)
        record_audit(s, actor="user:alice", action="reservation.create", target=f"reservation:{gone.id}")
        sp.rollback()
        assert s.scalar(select(Reservation.id).where(Reservation.id == gone.id)) is None
        assert s.scalar(select(AuditLog.id).where(AuditLog.target == f"reservation:{gone.id}")) is None
        kept = add_reservation(s, user=alice, host=host, devices=[devices[0]], start=start, end=end, values=values)
        record_audit(s, actor="user:alice", action="reservation.create", target=f"reservation:{kept.id}",
                     detail={"user": "alice"})
        s.commit()
    with session_factory() as s:
        assert s.get(Reservation, kept.id).user_id == alice.id
        entry = s.scalar(select(AuditLog).where(AuditLog.target == f"reservation:{kept.id}"))
        assert (entry.actor, entry.action, entry.detail) == ("user:alice", "reservation.create", {"user": "alice"})
        assert entry.at is not None


def test_the_database_guard_refuses_an_overlap_written_past_the_check(session_factory, lab):
    """A writer that skipped the conflict check (or raced past it) meets the database's
    guard: PostgreSQL's exclusion constraint becomes the 409 naming the holder. SQLite's
    guard is the write lock taken before the check, so there the check is the guard."""
    start, end = future(2), future(3)
    with session_factory() as s:
        if s.get_bind().dialect.name == "sqlite":
            pytest.skip("SQLite serialises writers before the check: no overlap reaches the write")
        host, devices, alice = _lab_rows(s)
        first = add_reservation(s, user=alice, host=host, devices=[devices[1]], start=start, end=end,
                                values={"status": "confirmed"})
        with pytest.raises(ReservationConflict) as e:
            add_reservation(s, user=alice, host=host, devices=[devices[1]], start=start + timedelta(minutes=30),
                            end=end, values={"status": "confirmed"})
        assert [c["id"] for c in e.value.extra["conflicts"]] == [first.id]
        s.commit()  # the savepoint took the refused rows with it; the first stays
    with session_factory() as s:
        assert s.scalar(select(Reservation.id).where(Reservation.host_id == host.id)) == first.id


def test_the_api_answer_and_the_audit_entry_of_a_booking(client, session_factory, lab):
    """The 201 is built from the written rows; the audit entry names the reservation."""
    r = book(client, lab.alice, [lab.devices[3], lab.devices[1]], future(2), share_with=["bob"])
    assert r.status_code == 201, r.text
    body = r.json()
    assert [d["index"] for d in body["devices"]] == [1, 3] and body["shared_with"] == ["bob"]
    assert body["cuda_visible_devices"] == f"{lab.devices[1]},{lab.devices[3]}" and body["kind"] == "booking"
    got = client.get(f"/api/v1/reservations/{body['id']}", headers=lab.alice.headers).json()
    assert got == body
    with session_factory() as s:
        entry = s.scalar(select(AuditLog).where(AuditLog.target == f"reservation:{body['id']}"))
        assert (entry.actor, entry.action, entry.detail) == ("user:alice", "reservation.create", {"user": "alice"})


def test_an_audit_entry_without_detail_stores_sql_null(session_factory, lab):
    """No detail is SQL NULL (as the column was left unset before), not the JSON text null."""
    with session_factory() as s:
        record_audit(s, actor="system", action="bench.none", target="x:1")
        record_audit(s, actor="system", action="bench.some", target="x:2", detail={"k": [1, 2]})
        s.commit()
    with session_factory() as s:
        nulls = dict(s.execute(select(AuditLog.action, AuditLog.detail.is_(None))
                               .where(AuditLog.action.in_(["bench.none", "bench.some"]))).all())
        assert nulls == {"bench.none": True, "bench.some": False}
        assert s.scalar(select(AuditLog.detail).where(AuditLog.action == "bench.some")) == {"k": [1, 2]}
