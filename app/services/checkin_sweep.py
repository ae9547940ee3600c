"""The periodic check-in and idle sweep: warn no-shows, then release them; ask idle holders
"still using it?", then apply the silence policy. Run by the service's lifespan
(:func:`app.api.checkin.install_sweep`) with the time passed in, so tests drive it over
simulated time.

For each active booking, with its holder's settings (:func:`app.services.checkin.rules_for`):

* **no-show**: not checked in ``checkin_minutes`` after its start (bookings shorter than
  ``checkin_min_booking_minutes`` exempt): the holder is warned with "keep it" / "release
  now" links and a ``no_show`` finding opens; still not checked in nor kept
  ``checkin_grace_minutes`` after the warning: released (``auto_release = 'no_show'``);
* **idle**: checked in, and a device it holds showed compute utilization under
  ``idle_below_percent`` with memory held in every minute of the last
  ``idle_after_minutes`` (per-minute rollups, which exist only for minutes the agent
  reported healthy data): the holder is asked, an ``idle_holder`` finding opens; no answer
  ``idle_grace_minutes`` later: ``idle_silence`` decides: ``nothing``, ``release`` (all) or
  ``release_idle_devices`` (only the idle ones; all of them when every device is idle).

Nothing is warned, asked or released on untrusted evidence (:func:`app.services.checkin.trusted`).
Every release takes the row lock through :func:`app.services.lifecycle.begin` and frees the
slot through :func:`app.services.slot_freed.on_slot_freed` (waitlist, placement).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError
from app.i18n import N_, gettext, use_locale
from app.models import DeviceTelemetry, Reservation, UsageRollup
from app.models.states import FindingKind, FindingState
from app.services import answer_links, checkin, holder_notices, lifecycle
from app.services.conflicts import loaded_options
from app.services.reservations import apply_end, load_locked
from app.services.slot_freed import on_slot_freed
from app.timeutil import fmt_local
from app.services.audit import record_audit

log = logging.getLogger(__name__)
# Share of the idle window's minutes that must have healthy rollups: a host that was not
# reporting does not make its devices look idle.
IDLE_COVERAGE = 0.8


@dataclass
class SweepResult:
    """Reservation ids per step taken in one sweep."""

    warned: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    idle_released: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # id -> why the evidence was not trusted


def _links(settings: Settings, r: Reservation) -> str:
    keep = answer_links.link(settings, reservation_id=r.id, answer="keep", expires=r.end_at)
    release = answer_links.link(settings, reservation_id=r.id, answer="release", expires=r.end_at)
    return gettext("\nKeep it: %(keep)s\nRelease now: %(release)s\nOr: gpuroster keep %(id)s / gpuroster release %(id)s",
                   keep=keep, release=release, id=r.id)


def idle_devices(session: Session, r: Reservation, rules: checkin.CheckinRules, now: datetime) -> list[int]:
    """Ids of the devices ``r`` still holds that were idle (utilization under the threshold,
    memory held) in every reported minute of the last ``idle_after_minutes``, with enough
    minutes reported (:data:`IDLE_COVERAGE`); none before the window fits in the reservation."""
    window = timedelta(minutes=rules.idle_after_minutes)
    start = now - window
    if start < r.start_at or rules.idle_below_percent is None:
        return []
    held = [i.device_id for i in r.items if i.end_at > now]
    threshold = float(rules.idle_below_percent)
    u = UsageRollup
    idle_minute = case((
        (u.utilization_samples > 0) & (u.utilization_sum < threshold * u.utilization_samples)
        & (u.memory_samples > 0) & (u.memory_used_sum_mib > 0), 1), else_=0)
    rows = session.execute(
        select(u.device_id, func.count(), func.sum(idle_minute))
        .where(u.device_id.in_(held), u.minute >= start, u.minute <= now).group_by(u.device_id)
    ).all()
    needed = max(1, int(rules.idle_after_minutes * IDLE_COVERAGE))
    return sorted(dev for dev, n, idle in rows if n >= needed and int(idle or 0) == n)


def _release(session: Session, r: Reservation, *, reason: str, why: str, now: datetime, settings: Settings,
             kind: FindingKind) -> bool:
    """Release ``r`` now under its row lock as the system (``auto_release = reason``); False
    when it is no longer active (its holder or an admin got there first)."""
    try:
        r, _p, after = lifecycle.begin(session, reservation_id=r.id, action=lifecycle.Action.RELEASE, now=now,
                                       tz=settings.tz, load=load_locked)
    except AppError:
        return False
    r.auto_release = reason
    apply_end(session, r, after, now=now, actor="system", detail={"reason": why})
    checkin.close(session, r, kind, FindingState.TERMINATED, now=now, message=f"released: {why}")
    with use_locale(r.user.language):  # the holder reads it in the language they chose
        subject = gettext("[gpuroster] reservation %(id)s released", id=r.id)
        text = gettext("Your reservation %(id)s on %(host)s was released at %(at)s: %(why)s.", id=r.id, host=r.host.name,
                       at=fmt_local(now, settings.tz), why=gettext(why))
    holder_notices.tell(session, kind="no_shows", user=r.user, reservation_id=r.id, subject=subject,
                        text=text, settings=settings, actor="system")
    return True


def _release_devices(session: Session, r: Reservation, device_ids: list[int], *, now: datetime,
                     settings: Settings) -> bool:
    """Free only ``device_ids`` of ``r`` now (their rows end now; the rest keep their end)."""
    try:
        r, _p, _after = lifecycle.begin(session, reservation_id=r.id, action=lifecycle.Action.RELEASE_DEVICES, now=now,
                                        tz=settings.tz, load=load_locked)
    except AppError:
        return False
    uuids = []
    for i in r.items:
        if i.device_id in device_ids:
            i.end_at = max(now, i.start_at + timedelta(microseconds=1))
            uuids.append(i.device.uuid)
    r.auto_release = "idle_devices"
    r.idle_asked_at = None  # the rest may be asked about again
    r.sequence += 1
    r.updated_at = now
    record_audit(session, actor="system", action="reservation.release_devices", target=f"reservation:{r.id}",
                 detail={"devices": sorted(uuids), "reason": "idle, no answer"})
    checkin.close(session, r, FindingKind.IDLE_HOLDER, FindingState.TERMINATED, now=now,
                  message=f"idle devices released: {', '.join(sorted(uuids))}")
    with use_locale(r.user.language):
        subject = gettext("[gpuroster] reservation %(id)s: idle GPUs released", id=r.id)
        text = gettext("No answer about idle GPUs: %(devices)s of reservation %(id)s on %(host)s were released at %(at)s; "
                       "the others stay yours.", devices=", ".join(sorted(uuids)), id=r.id, host=r.host.name,
                       at=fmt_local(now, settings.tz))
    holder_notices.tell(session, kind="no_shows", user=r.user, reservation_id=r.id, subject=subject, text=text,
                        settings=settings, actor="system")
    on_slot_freed(session, r)
    return True


def _fresh(session: Session, r: Reservation) -> Reservation:
    """``r`` reloaded under its row lock: of two service processes sweeping at once, the
    second sees what the first stored (and warns or asks nobody twice)."""
    lifecycle.lock_rows(session, [r.id])
    return load_locked(session, r.id)


def _no_show(session: Session, r: Reservation, rules: checkin.CheckinRules, *, now: datetime, settings: Settings,
             out: SweepResult) -> None:
    if r.checked_in_at is not None:
        if r.checkin_warned_at is not None:
            checkin.close(session, r, FindingKind.NO_SHOW, FindingState.RESOLVED, now=now, message="checked in")
        return
    if r.checkin_kept_at is not None or not rules.needs_checkin(r):
        return
    due = r.start_at + timedelta(minutes=rules.checkin_minutes or 0)
    if now < due:
        return
    if r.checkin_warned_at is None:
        r = _fresh(session, r)
        if r.checkin_warned_at is not None or r.checked_in_at is not None or r.checkin_kept_at is not None:
            return
        r.checkin_warned_at = now
        grace = timedelta(minutes=rules.checkin_grace_minutes)
        with use_locale(r.user.language):
            subject = gettext("[gpuroster] reservation %(id)s: no check-in yet, keep it?", id=r.id)
            text = gettext("Reservation %(id)s on %(host)s started at %(start)s and none of your processes has run on "
                           "its GPUs yet. No check-in yet: keep it? Without an answer or a job it is released at %(end)s.",
                           id=r.id, host=r.host.name, start=fmt_local(r.start_at, settings.tz),
                           end=fmt_local(now + grace, settings.tz)) + _links(settings, r)
        checkin.record(session, r, FindingKind.NO_SHOW, FindingState.NOTIFIED, now=now,
                       message=f"no check-in {rules.checkin_minutes} min after the start; holder warned")
        holder_notices.tell(session, kind="no_shows", user=r.user, reservation_id=r.id,
                            subject=subject, text=text,
                            settings=settings, actor="system")
        out.warned.append(r.id)
    elif now >= r.checkin_warned_at + timedelta(minutes=rules.checkin_grace_minutes):
        if _release(session, r, reason="no_show", why=N_("no check-in and no answer (no-show)"), now=now,
                    settings=settings, kind=FindingKind.NO_SHOW):
            out.released.append(r.id)


def _idle(session: Session, r: Reservation, rules: checkin.CheckinRules, *, now: datetime, settings: Settings,
          out: SweepResult) -> None:
    if r.checked_in_at is None or r.idle_kept_at is not None or rules.idle_below_percent is None:
        return
    idle = idle_devices(session, r, rules, now)
    if not idle:
        if r.idle_asked_at is not None:
            r.idle_asked_at = None
            checkin.close(session, r, FindingKind.IDLE_HOLDER, FindingState.RESOLVED, now=now, message="in use again")
        return
    names = ", ".join(sorted(i.device.uuid for i in r.items if i.device_id in idle))
    if r.idle_asked_at is None:
        r = _fresh(session, r)
        if r.idle_asked_at is not None or r.idle_kept_at is not None or r.status != "confirmed":
            return
        r.idle_asked_at = now
        grace = timedelta(minutes=rules.idle_grace_minutes)
        with use_locale(r.user.language):
            at = fmt_local(now + grace, settings.tz)
            policy = {"nothing": gettext("Nothing happens if you do not answer."),
                      "release": gettext("Without an answer it is released at %(at)s.", at=at),
                      "release_idle_devices": gettext("Without an answer the idle GPUs are released at %(at)s.", at=at),
                      }[rules.idle_silence]
            subject = gettext("[gpuroster] reservation %(id)s: still using it?", id=r.id)
            text = gettext("Reservation %(id)s on %(host)s: %(devices)s hold memory but computed under %(pct)s%% for "
                           "%(minutes)s min. Still using it? %(policy)s", id=r.id, host=r.host.name, devices=names,
                           pct=rules.idle_below_percent, minutes=rules.idle_after_minutes, policy=policy) + _links(settings, r)
        checkin.record(session, r, FindingKind.IDLE_HOLDER, FindingState.NOTIFIED, now=now,
                       message=f"idle: {names}; holder asked")
        holder_notices.tell(session, kind="no_shows", user=r.user, reservation_id=r.id,
                            subject=subject, text=text, settings=settings,
                            actor="system")
        out.asked.append(r.id)
        return
    if now < r.idle_asked_at + timedelta(minutes=rules.idle_grace_minutes) or rules.idle_silence == "nothing":
        return
    held = [i.device_id for i in r.items if i.end_at > now]
    if rules.idle_silence == "release_idle_devices" and len(idle) < len(held):
        if _release_devices(session, r, idle, now=now, settings=settings):
            out.idle_released.append(r.id)
    elif _release(session, r, reason="idle", why=N_("idle and no answer to \"still using it?\""), now=now,
                  settings=settings, kind=FindingKind.IDLE_HOLDER):
        out.idle_released.append(r.id)


def sweep(session: Session, *, now: datetime, settings: Settings) -> SweepResult:
    """One pass over the active bookings at ``now`` (UTC); see the module docstring. Never
    commits; the caller's transaction holds every change."""
    out = SweepResult()
    live = list(session.scalars(
        select(Reservation).where(Reservation.status == "confirmed", Reservation.kind == "booking",
                                  Reservation.start_at <= now, Reservation.end_at > now)
        .options(*loaded_options()).order_by(Reservation.id)))
    if not live:
        return out
    dev_ids = {i.device_id for r in live for i in r.items}
    telemetry = {t.device_id: t for t in session.scalars(select(DeviceTelemetry).where(DeviceTelemetry.device_id.in_(dev_ids)))}
    rules: dict[int, checkin.CheckinRules] = {}
    for r in live:
        if r.user_id not in rules:
            rules[r.user_id] = checkin.rules_for(session, r.user)
        rr = rules[r.user_id]
        if rr.checkin_minutes is None and rr.idle_below_percent is None:
            continue
        why = checkin.trusted(r.host, [telemetry.get(i.device_id) for i in r.items if i.end_at > now], now)
        if why is not None:
            out.skipped[r.id] = why
            continue
        _no_show(session, r, rr, now=now, settings=settings, out=out)
        if lifecycle.phase(r, now) == lifecycle.Phase.ACTIVE and r.status == "confirmed":
            _idle(session, r, rr, now=now, settings=settings, out=out)
    session.flush()
    if out.skipped:
        log.info("check-in sweep left %d reservation(s) alone on untrusted evidence: %s", len(out.skipped), out.skipped)
    return out


__all__ = ["IDLE_COVERAGE", "SweepResult", "idle_devices", "sweep"]
