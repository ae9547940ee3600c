"""The one place that learns when devices a reservation held become free again.

Cancel, release, deny, the expiry of an unapproved pending, a maintenance override and a
series' cancel call
:func:`on_slot_freed` inside their transaction, after the reservation's new state is
flushed; whoever serves standing requests (a waitlist) registers a listener with
:func:`subscribe`. Listeners run in the caller's transaction, so what they book commits or
rolls back with the change that freed the slot.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from app.models import Reservation

Listener = Callable[[Session, Reservation], None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Call ``listener(session, reservation)`` whenever a reservation frees its devices
    (idempotent: a listener registered twice runs once)."""
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    """Stop calling ``listener`` (no error if it was not registered)."""
    if listener in _listeners:
        _listeners.remove(listener)


def on_slot_freed(session: Session, reservation: Reservation) -> None:
    """Tell every listener that ``reservation`` (cancelled, released, denied, expired or cut
    by a maintenance) no longer holds some of its devices or time. Exceptions propagate:
    the freeing change and what listeners do are one transaction."""
    session.flush()
    for listener in list(_listeners):
        listener(session, reservation)


__all__ = ["on_slot_freed", "subscribe", "unsubscribe"]
