"""Reservations, their devices, shares and recurring series.

No double booking is enforced by the database. On PostgreSQL two exclusion constraints on
``reservation_devices`` (created by the migration, extension ``btree_gist``):

* ``ex_reservation_devices_device``: same ``device_id`` and overlapping
  ``tstzrange(start_at, end_at, '[)')`` among active rows;
* ``ex_reservation_devices_mig``: same ``physical_id`` (the whole GPU), different
  ``slice_kind`` (0 whole GPU, 1 MIG instance) and overlapping ranges, so a whole-GPU
  reservation and any MIG-slice reservation of that GPU exclude each other.

On SQLite the same predicate is checked after ``BEGIN IMMEDIATE`` (see ``app.db``).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Index, Integer, SmallInteger, String, literal_column
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow
from app.models.host import Device, Host
from app.models.user import Group, User

class ReservationStatus(StrEnum):
    """What ``reservations.status`` stores (the check constraint lists the same values).
    The phase people see adds time (upcoming / active / ended); the legal transitions are
    in :mod:`app.services.lifecycle`."""

    CONFIRMED = "confirmed"
    CANCELLED = "cancelled"
    RELEASED = "released"
    PENDING = "pending"  # awaiting approval: holds its devices tentatively (items active)
    DENIED = "denied"  # a pending refused by an approver: devices freed
    EXPIRED = "expired"  # a pending that reached its start unapproved: devices freed


STATUSES = tuple(s.value for s in ReservationStatus)
# Statuses whose reservation never held (or no longer holds) its devices: not counted anywhere.
NOT_HELD = ("cancelled", "denied", "expired")
KINDS = ("booking", "maintenance")
# ``reservations.auto_release``: a no-show released by the sweep; after "still using it?": the
# sweep released all (``idle``) or only the idle devices (``idle_devices``), or the holder
# released it themselves (``idle_consent``).
AUTO_RELEASES = ("no_show", "idle", "idle_devices", "idle_consent")


class ReservationSeries(Base):
    """A recurring reservation rule, expanded in the lab time zone (RFC 5545 semantics)."""

    __tablename__ = "reservation_series"
    __table_args__ = (CheckConstraint("freq IN ('daily', 'weekly', 'monthly')", name="freq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    freq: Mapped[str] = mapped_column(String(16))
    interval: Mapped[int] = mapped_column(Integer, default=1)
    weekdays: Mapped[list[str] | None] = mapped_column()
    local_start: Mapped[str] = mapped_column(String(8), comment="HH:MM wall time in tz")
    duration_seconds: Mapped[int] = mapped_column(Integer)
    tz: Mapped[str] = mapped_column(String(64))
    start_date: Mapped[str] = mapped_column(String(10), comment="YYYY-MM-DD in tz")
    until_date: Mapped[str | None] = mapped_column(String(10), comment="inclusive, in tz")
    count: Mapped[int | None] = mapped_column(Integer)
    device_uuids: Mapped[list[str]] = mapped_column()
    note: Mapped[str | None] = mapped_column(String(1024))
    cancelled_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Reservation(Base):
    """A user's exclusive claim on devices of one host for the half-open ``[start_at, end_at)``.

    Rows are never deleted: cancelling sets ``status='cancelled'``; releasing early sets
    ``status='released'`` and moves ``end_at`` to the release instant.
    """

    __tablename__ = "reservations"
    __table_args__ = (
        CheckConstraint("end_at > start_at", name="interval"),
        CheckConstraint("status IN ('confirmed', 'cancelled', 'released', 'pending', 'denied', 'expired')",
                        name="status"),
        CheckConstraint("kind IN ('booking', 'maintenance')", name="kind"),
        CheckConstraint("auto_release IN ('no_show', 'idle', 'idle_devices', 'idle_consent')", name="auto_release"),
        Index("ix_reservations_host_id_end_at", "host_id", "end_at"),
        Index("ix_reservations_user_id_end_at", "user_id", "end_at"),  # quota counting
        # holders of every device: only reservations that end after the instant, whatever the history
        Index("ix_reservations_end_at", "end_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="RESTRICT"))
    start_at: Mapped[datetime]
    end_at: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16), default="confirmed")
    kind: Mapped[str] = mapped_column(String(16), default="booking", server_default="booking",
                                      comment="maintenance: an admin's hold of hosts/devices (may be open-ended)")
    note: Mapped[str | None] = mapped_column(String(1024))
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    override_reason: Mapped[str | None] = mapped_column(String(1024))
    series_id: Mapped[int | None] = mapped_column(ForeignKey("reservation_series.id", ondelete="SET NULL"), index=True)
    recurrence_start: Mapped[datetime | None] = mapped_column(comment="series: the occurrence's original start")
    sequence: Mapped[int] = mapped_column(Integer, default=0, comment="bumped on every change (ICS SEQUENCE)")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    cancelled_at: Mapped[datetime | None]
    # check-in by evidence and idle holders (app.services.checkin): all UTC instants
    checked_in_at: Mapped[datetime | None] = mapped_column(comment="first holder process seen on its devices")
    checkin_warned_at: Mapped[datetime | None] = mapped_column(comment="holder told: no check-in yet")
    checkin_kept_at: Mapped[datetime | None] = mapped_column(comment="holder answered keep to the no-show warning")
    idle_asked_at: Mapped[datetime | None] = mapped_column(comment="holder asked: still using it?")
    idle_kept_at: Mapped[datetime | None] = mapped_column(comment="holder answered keep to the idle question")
    auto_release: Mapped[str | None] = mapped_column(String(16), comment="why it was released: see AUTO_RELEASES")

    user: Mapped[User] = relationship(foreign_keys=[user_id], lazy="raise")
    host: Mapped[Host] = relationship(lazy="raise")
    items: Mapped[list["ReservationDevice"]] = relationship(
        back_populates="reservation", lazy="raise", cascade="all, delete-orphan"
    )
    shares: Mapped[list["ReservationShare"]] = relationship(lazy="raise", cascade="all, delete-orphan")


# Pending reservations (awaiting approval) are few among all ever made, yet the approval queue
# and the periodic expiry read them by start: a partial index holds just them. The predicate is
# inline SQL, not a bound parameter, so that PostgreSQL matches the index's predicate in generic
# plans as well; queries of pending reservations filter with this same expression.
PENDING = Reservation.status == literal_column("'pending'")
Index("ix_reservations_pending_start_at", Reservation.start_at, postgresql_where=PENDING, sqlite_where=PENDING)


class ReservationDevice(Base):
    """One reserved device of a reservation; carries the interval for the exclusion constraint.

    ``physical_id`` is the whole GPU's device id (the parent for a MIG instance);
    ``slice_kind`` is 0 for a whole GPU, 1 for a MIG instance; ``active`` is false once the
    reservation is cancelled.
    """

    __tablename__ = "reservation_devices"
    __table_args__ = (
        Index("ix_reservation_devices_device_id_end_at", "device_id", "end_at"),
        Index("ix_reservation_devices_physical_id_end_at", "physical_id", "end_at"),
        # the lab-wide read of what has not ended (app.services.lab_holds)
        Index("ix_reservation_devices_end_at", "end_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    reservation_id: Mapped[int] = mapped_column(ForeignKey("reservations.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="RESTRICT"))
    physical_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="RESTRICT"))
    slice_kind: Mapped[int] = mapped_column(SmallInteger, default=0)
    start_at: Mapped[datetime]
    end_at: Mapped[datetime]
    active: Mapped[bool] = mapped_column(Boolean, default=True)

    reservation: Mapped[Reservation] = relationship(back_populates="items", lazy="raise")
    device: Mapped[Device] = relationship(foreign_keys=[device_id], lazy="raise")


class ReservationShare(Base):
    """Shares a reservation with a user or a group: their processes count as covered."""

    __tablename__ = "reservation_shares"
    __table_args__ = (CheckConstraint("(user_id IS NULL) <> (group_id IS NULL)", name="one_target"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    reservation_id: Mapped[int] = mapped_column(ForeignKey("reservations.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))

    user: Mapped[User | None] = relationship(lazy="raise")
    group: Mapped[Group | None] = relationship(lazy="raise")


__all__ = ["AUTO_RELEASES", "KINDS", "NOT_HELD", "PENDING", "ReservationStatus", "Reservation", "ReservationDevice", "ReservationShare", "ReservationSeries", "STATUSES"]
