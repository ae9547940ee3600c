"""Debounce and lifecycle of findings: the agent's finding tracker.

The pure function (:func:`agent.policy.judge`) says what is wrong *at one instant*. The
tracker turns that stream of judgements into findings:

* a judgement is first *pending*; it becomes a finding (state ``open``) only once it has been
  judged continuously for the host's grace period (``policy.grace_seconds``; ``idle`` needs
  ``policy.idle_minutes``). A pending judgement missing from one poll starts over.
* one finding per key ``uuid:pid:identity:kind`` (:attr:`Judgement.key`), with
  ``first_seen`` (first judged, not confirmed) and ``last_seen``; its state moves
  ``open -> notified -> terminated | resolved`` and never back; it is never duplicated per
  poll.
* a finding that is no longer judged is ``resolved``, except when its device could not be
  observed this poll (see :meth:`FindingTracker.observe`) or when the agent has signalled its
  process and the process still lives (then the enforcer decides: ``terminated`` on death).
* ``terminated``/``resolved`` findings are reported once more (so the service learns they
  ended) and then forgotten.

State is kept in one JSON file written atomically (temporary file in the same directory,
``fsync``, ``os.replace``), so findings, their first-seen times and notice rate limits
survive agent restarts. A corrupt state file is moved aside (``*.corrupt``) with a warning
and the tracker starts empty; it never stops the agent.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from agent.policy import Judgement, as_utc
from agent.schema import ActionReport, FindingReport, NoticeReport
from agent.state import atomic_write

log = logging.getLogger(__name__)

TrackedState = Literal["pending", "open", "notified", "terminated", "resolved"]
FINAL_STATES = frozenset({"terminated", "resolved"})
STATE_VERSION = 1


@dataclass
class TrackedFinding:
    """What the agent remembers about one finding (or a pending judgement).

    Times are aware UTC datetimes. ``notices``/``actions`` are the reports not yet handed to
    the service (an outbox, emptied by :meth:`FindingTracker.reports`).
    """

    key: str
    kind: str
    device_uuid: str
    first_seen: datetime
    last_seen: datetime
    state: TrackedState = "pending"
    pid: int | None = None
    create_time: float | None = None
    unix_user: str | None = None
    uid: int | None = None
    command: str | None = None
    name: str | None = None
    container_id: str | None = None
    identity: str | None = None
    container_name: str | None = None
    container_image: str | None = None
    reservation_id: int | None = None
    holder: str | None = None
    reservation_end: datetime | None = None
    reason: str | None = None
    message: str | None = None
    confirmed_at: datetime | None = None
    first_notice_at: datetime | None = None
    warned_at: datetime | None = None
    last_notice_at: datetime | None = None
    sigterm_at: datetime | None = None
    sigkill_at: datetime | None = None
    signal_mode: Literal["real", "dry_run"] | None = None
    kill_settled: bool = False
    ended_at: datetime | None = None
    notices: list[NoticeReport] = field(default_factory=list)
    actions: list[ActionReport] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        """True once past the grace period (anything but ``pending``)."""
        return self.state != "pending"

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def signalled(self) -> bool:
        """True when the agent has really signalled this process (not in dry-run)."""
        return self.signal_mode == "real" and self.sigterm_at is not None

    def update_from(self, j: Judgement, now: datetime) -> None:
        """Refresh what may change between polls for the same key (holder, command)."""
        self.last_seen = now
        self.reason = j.reason
        self.holder = j.holder
        self.reservation_id = j.reservation_id
        self.reservation_end = j.reservation_end
        self.command = j.command or self.command
        self.name = j.name or self.name
        self.uid = j.uid if j.uid is not None else self.uid
        self.container_id = j.container_id or self.container_id
        self.container_name = j.container_name or self.container_name
        self.container_image = j.container_image or self.container_image

    def to_report(self) -> FindingReport:
        """The wire form; ``pending`` is never reported (raises ``ValueError`` if asked)."""
        if self.state == "pending":
            raise ValueError(f"finding {self.key} is still pending")
        return FindingReport(
            key=self.key,
            kind=self.kind,  # type: ignore[arg-type]
            device_uuid=self.device_uuid,
            pid=self.pid,
            create_time=self.create_time,
            identity=self.identity,
            unix_user=self.unix_user,
            uid=self.uid,
            command=self.command[:4096] if self.command else None,
            container_id=self.container_id,
            container_name=self.container_name,
            container_image=self.container_image,
            reservation_id=self.reservation_id,
            holder=self.holder,
            first_seen=self.first_seen,
            last_seen=self.last_seen,
            state=self.state,  # type: ignore[arg-type]
            message=self.message[:2048] if self.message else None,
            notices=list(self.notices),
            actions=list(self.actions),
        )


_DATETIME_FIELDS = {
    "first_seen", "last_seen", "reservation_end", "confirmed_at", "first_notice_at",
    "last_notice_at", "warned_at", "sigterm_at", "sigkill_at", "ended_at",
}


def _encode(f: TrackedFinding) -> dict[str, Any]:
    d = asdict(f)
    for k in _DATETIME_FIELDS:
        if d[k] is not None:
            d[k] = d[k].isoformat()
    d["notices"] = [n.model_dump(mode="json") for n in f.notices]
    d["actions"] = [a.model_dump(mode="json") for a in f.actions]
    return d


def _decode(d: dict[str, Any]) -> TrackedFinding:
    known = {f.name for f in fields(TrackedFinding)}
    kw = {k: v for k, v in d.items() if k in known}
    for k in _DATETIME_FIELDS:
        if kw.get(k) is not None:
            kw[k] = as_utc(datetime.fromisoformat(kw[k]))
    kw["notices"] = [NoticeReport.model_validate(n) for n in kw.get("notices", [])]
    kw["actions"] = [ActionReport.model_validate(a) for a in kw.get("actions", [])]
    return TrackedFinding(**kw)


class FindingTracker:
    """Findings of one host, keyed by :attr:`Judgement.key`, persisted in ``path``.

    ``path`` is a JSON file (its directory is created). Not thread-safe: one enforcer owns it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.findings: dict[str, TrackedFinding] = {}
        self._last_written: str | None = None
        self.load()

    # persistence -------------------------------------------------------------------------
    def load(self) -> None:
        """Read the state file if there is one; a corrupt one is moved aside, not fatal."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot read finding state %s: %s; starting empty", self.path, e)
            return
        try:
            data = json.loads(raw)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unknown state version {data.get('version')!r}")
            items = [_decode(d) for d in data["findings"]]
        except Exception as e:  # noqa: BLE001 - any corruption: keep the agent running
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.warning("finding state %s is unreadable (%s); moved to %s, starting empty", self.path, e, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return
        self.findings = {f.key: f for f in items}
        self._last_written = raw

    def save(self) -> None:
        """Write the state atomically; skips the write when nothing changed.

        Raises ``OSError`` when the directory cannot be written (the enforcer logs it).
        """
        text = json.dumps(
            {"version": STATE_VERSION, "findings": [_encode(f) for f in self.findings.values()]},
            sort_keys=True,
        )
        if text == self._last_written:
            return
        atomic_write(self.path, text.encode("utf-8"))
        self._last_written = text

    # lifecycle ---------------------------------------------------------------------------
    def observe(
        self,
        judgements: list[Judgement],
        *,
        now: datetime,
        grace: timedelta,
        idle_after: timedelta,
        unobserved_devices: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        """Fold one poll's judgements into the findings.

        ``grace`` (process findings) and ``idle_after`` (``idle``) are how long a judgement must
        hold before it is a finding. ``unobserved_devices``: UUIDs whose processes could not be
        listed this poll (device lost, listing failed); findings there are kept as they are,
        neither refreshed nor resolved.
        """
        now = as_utc(now)
        seen: set[str] = set()
        for j in judgements:
            seen.add(j.key)
            f = self.findings.get(j.key)
            if f is not None and f.final:
                continue  # ended earlier in this poll; reported once before a new one may start
            if f is None:
                f = TrackedFinding(
                    key=j.key,
                    kind=j.kind,
                    device_uuid=j.device_uuid,
                    first_seen=now,
                    last_seen=now,
                    pid=j.pid,
                    create_time=j.create_time,
                    unix_user=j.unix_user,
                    uid=j.uid,
                    command=j.command,
                    name=j.name,
                    container_id=j.container_id,
                    identity=j.identity,
                    container_name=j.container_name,
                    container_image=j.container_image,
                    reservation_id=j.reservation_id,
                    holder=j.holder,
                    reservation_end=j.reservation_end,
                    reason=j.reason,
                )
                self.findings[j.key] = f
            else:
                f.update_from(j, now)
            wait = idle_after if f.kind == "idle" else grace
            if f.state == "pending" and now - f.first_seen >= wait:
                f.state = "open"
                f.confirmed_at = now
        for key, f in list(self.findings.items()):
            if key in seen or f.final:
                continue
            if f.device_uuid in unobserved_devices:
                continue
            if f.state == "pending":
                del self.findings[key]
            elif f.signalled and not f.kill_settled:
                continue  # the enforcer follows a signalled process until it is gone
            else:
                self.end(key, "resolved", now)

    def end(self, key: str, state: Literal["terminated", "resolved"], now: datetime) -> None:
        """Move a finding to a final state (reported once more, then forgotten)."""
        f = self.findings[key]
        if f.state == "pending":
            del self.findings[key]
            return
        f.state = state
        f.ended_at = as_utc(now)

    def active(self) -> list[TrackedFinding]:
        """Confirmed findings that are not final, oldest first."""
        return sorted(
            (f for f in self.findings.values() if f.confirmed and not f.final),
            key=lambda f: (f.first_seen, f.key),
        )

    def reports(self, *, drain: bool = True) -> list[FindingReport]:
        """Every confirmed finding as a :class:`FindingReport` with its new notices/actions.

        With ``drain`` the outboxes are emptied and final findings forgotten, so a resolved or
        terminated finding is reported exactly once after it ended.
        """
        out: list[FindingReport] = []
        for key, f in sorted(self.findings.items(), key=lambda kv: (kv[1].first_seen, kv[0])):
            if not f.confirmed:
                continue
            out.append(f.to_report())
            if drain:
                f.notices.clear()
                f.actions.clear()
                if f.final:
                    del self.findings[key]
        return out


__all__ = ["FINAL_STATES", "FindingTracker", "TrackedFinding"]
