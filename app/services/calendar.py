"""ICS calendar feeds of reservations, per user and per host (RFC 5545, ``icalendar``).

Every reservation (a series occurrence too) is one ``VEVENT``:

* ``UID`` ``reservation-<id>@<server>`` is stable for the reservation's life;
* ``DTSTART``/``DTEND`` are UTC instants (``…Z``), the real end (a release moves it);
* ``DTSTAMP`` and ``LAST-MODIFIED`` are the last change in UTC, ``SEQUENCE`` is the
  reservation's ``sequence`` (bumped on every change, so clients replace their copy);
* a cancelled reservation or occurrence stays in the feed with ``STATUS:CANCELLED``;
* lines end in CRLF and are folded at 75 octets (the library does both).

Feed URLs carry a secret token instead of a login, because calendar clients cannot send
headers. Like API tokens, only its SHA-256 is stored (``User.feed_token_hash`` /
``Host.feed_token_hash``), so a URL is shown once, when it is made; rotating makes a new
one and revokes the old.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from icalendar import Calendar, Event
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import NotFound
from app.models import GroupMember, Host, Reservation, ReservationShare, User, utcnow
from app.security import token_hash
from app.services import reservations as reservation_service
from app.services.audit import record_audit

PAST = timedelta(days=90)
AHEAD = timedelta(days=400)
PRODID = "-//gpuroster//reservations//EN"


def _uid_domain(settings: Settings) -> str:
    return urlsplit(settings.base_url).hostname or "gpuroster"


def event_uid(r: Reservation, settings: Settings) -> str:
    """The stable UID of a reservation's event."""
    return f"reservation-{r.id}@{_uid_domain(settings)}"


def _event(r: Reservation, settings: Settings, *, viewer: User | None) -> Event:
    devices = reservation_service.devices_sorted(r)
    models = sorted({d.name for d in devices if d.name})
    ev = Event()
    ev.add("uid", event_uid(r, settings))
    ev.add("dtstamp", r.updated_at.astimezone(UTC))
    ev.add("last-modified", r.updated_at.astimezone(UTC))
    ev.add("created", r.created_at.astimezone(UTC))
    ev.add("dtstart", r.start_at.astimezone(UTC))
    ev.add("dtend", r.end_at.astimezone(UTC))
    ev.add("sequence", r.sequence)
    ev.add("status", "CANCELLED" if r.status == "cancelled" else "CONFIRMED")
    ev.add("transp", "OPAQUE")
    whose = "" if viewer is not None and viewer.id == r.user_id else f" ({r.user.username})"
    what = f"{len(devices)}× {models[0]}" if len(models) == 1 else f"{len(devices)} GPU(s)"
    ev.add("summary", f"GPU {r.host.name}: {what}{whose}" + (f" – {r.note}" if r.note else ""))
    ev.add("location", r.host.name)
    lines = [
        f"Reservation #{r.id} of {r.user.username} on {r.host.name}",
        "Devices: " + ", ".join(f"{d.index if d.index is not None else '-'}: {d.uuid}" for d in devices),
        f"CUDA_VISIBLE_DEVICES={reservation_service.cuda_visible_devices(r)}",
    ]
    if r.status == "released":
        lines.append("Released early; the end is the release time.")
    shared = reservation_service.share_names(r)
    if shared:
        lines.append("Shared with: " + ", ".join(shared))
    if r.note:
        lines.append(f"Note: {r.note}")
    ev.add("description", "\n".join(lines))
    if r.series_id is not None:
        ev.add("related-to", f"series-{r.series_id}@{_uid_domain(settings)}")
    return ev


def build_calendar(
    reservations: Sequence[Reservation], *, name: str, settings: Settings, viewer: User | None = None
) -> bytes:
    """The ICS document (bytes, CRLF, folded) for ``reservations``."""
    cal = Calendar()
    cal.add("prodid", PRODID)
    cal.add("version", "2.0")
    cal.add("calscale", "GREGORIAN")
    cal.add("x-wr-calname", name)
    cal.add("x-published-ttl", "PT15M")
    for r in sorted(reservations, key=lambda r: (r.start_at, r.id)):
        cal.add_component(_event(r, settings, viewer=viewer))
    return cal.to_ical()


def _window(q, now: datetime):
    return q.where(Reservation.end_at > now - PAST, Reservation.start_at < now + AHEAD)


def user_feed(session: Session, *, token: str, settings: Settings, now: datetime | None = None) -> bytes:
    """The feed of the user owning ``token``: their reservations and those shared with them
    (directly or through a group), ended up to 90 days ago or starting within 400 days.

    Raises NotFound (404) for an unknown token or a deactivated user.
    """
    now = now or utcnow()
    user = session.scalar(select(User).where(User.feed_token_hash == token_hash(token))) if token else None
    if user is None or not user.active:
        raise NotFound("no calendar feed at this address", field="token")
    groups = select(GroupMember.group_id).where(GroupMember.user_id == user.id)
    shared = select(ReservationShare.reservation_id).where(
        or_(ReservationShare.user_id == user.id, ReservationShare.group_id.in_(groups))
    )
    q = _window(select(Reservation).where(or_(Reservation.user_id == user.id, Reservation.id.in_(shared))), now)
    rows = list(session.scalars(q.options(*reservation_service.loaded_options())))
    return build_calendar(rows, name=f"GPU reservations of {user.username}", settings=settings, viewer=user)


def host_feed(session: Session, *, token: str, settings: Settings, now: datetime | None = None) -> bytes:
    """The feed of every reservation on the host owning ``token``; raises NotFound."""
    now = now or utcnow()
    host = session.scalar(select(Host).where(Host.feed_token_hash == token_hash(token))) if token else None
    if host is None:
        raise NotFound("no calendar feed at this address", field="token")
    q = _window(select(Reservation).where(Reservation.host_id == host.id), now)
    rows = list(session.scalars(q.options(*reservation_service.loaded_options())))
    return build_calendar(rows, name=f"GPU reservations on {host.name}", settings=settings)


def feed_url(settings: Settings, kind: str, token: str) -> str:
    """The public URL of a feed (``kind`` is ``users`` or ``hosts``)."""
    return f"{settings.base_url.rstrip('/')}/api/v1/feeds/{kind}/{token}.ics"


def user_feed_token(session: Session, *, user: User, rotate: bool = False) -> str | None:
    """A new feed token for ``user`` when they have none or ``rotate`` (the old URL stops
    working), returned in plain text once; ``None`` when one exists and is kept."""
    if user.feed_token_hash and not rotate:
        return None
    plain = secrets.token_urlsafe(24)
    user.feed_token_hash = token_hash(plain)
    record_audit(session, actor=f"user:{user.username}", action="feed.rotate", target=f"user:{user.username}")
    session.flush()
    return plain


def host_feed_token(session: Session, *, host: Host, actor: User, rotate: bool = False) -> str | None:
    """A new feed token for ``host`` when it has none or ``rotate``; ``None`` when kept."""
    if host.feed_token_hash and not rotate:
        return None
    plain = secrets.token_urlsafe(24)
    host.feed_token_hash = token_hash(plain)
    record_audit(session, actor=f"user:{actor.username}", action="feed.rotate", target=f"host:{host.name}")
    session.flush()
    return plain
