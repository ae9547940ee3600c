"""``GET /api/v1/devices`` of a large lab from documents reused between snapshots.

Even from plain rows the whole list of 1,000 hosts x 8 GPUs cost about half a second a
request, nearly all of it reading and serialising what had not changed since the host's last
snapshot. A :class:`DeviceListCache` keeps, per host, the JSON of its devices in two layers:

- the base (:func:`app.services.device_list.read_base`: columns, telemetry, processes and
  their owners, findings), under the host's snapshot version, the lab-wide key of the Now
  page (:func:`app.services.now_state.lab_key`: devices retired, opened or moved, users'
  Unix uids), the locale (owner labels are words) and the devices' live findings as read
  on the request (an admin resolving one changes no snapshot);
- the finished documents, under that base, the host's status now, and each device's holder,
  next reservation and quarantine as read on the request (:mod:`app.services.lab_holds`,
  :func:`app.services.device_list.open_quarantines`).

Every request reads those keys from the database (a few cheap statements whose cost does
not grow with history), so a booking, a cancel, a new snapshot, a retired or moved device
shows on the next request, and two processes on one database answer the same. A whole
answer that did not change keeps its body and its compressed body (per page).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime

from pydantic_core import to_json
from sqlalchemy.orm import Session

from app.i18n import current_locale
from app.middleware.compression import MINIMUM_SIZE, gzip_body
from app.services.device_list import (
    DeviceBase,
    HostRow,
    host_status,
    host_version,
    live_findings,
    live_part,
    open_quarantines,
    read_base,
    read_hosts,
)
from app.services.lab_holds import HoldsCache
from app.services.now_state import lab_key
from app.services.quarantined import quarantine_of

PAGES_KEPT = 16  # (page, encoding) bodies of the current answer: a client pages through a few


class _Base:
    """A host's devices between snapshots, with each one's JSON up to ``processes`` (the
    closing brace left off: the live part follows)."""

    __slots__ = ("devices", "heads", "version")

    def __init__(self, version: tuple, devices: list[DeviceBase]) -> None:
        self.version = version
        self.devices = devices
        self.heads = [to_json(d.doc)[:-1] for d in devices]


class DeviceListView:
    """One answer: the devices' JSON documents in list order. ``token`` names the whole
    answer while nothing in it changes (``None`` for a list of one host: not kept)."""

    __slots__ = ("docs", "token")

    def __init__(self, docs: list[bytes], token: int | None) -> None:
        self.docs = docs
        self.token = token


class DeviceListCache:
    """Per process, per application (see the module docstring). Bounded by the number of
    hosts; thread-safe (two requests building the same host at once both build it)."""

    def __init__(self, holds: HoldsCache | None = None) -> None:
        self.holds = holds or HoldsCache()
        self._lock = threading.Lock()
        self._lab: tuple | None = None
        self._base: dict[int, _Base] = {}
        self._live: dict[int, tuple[tuple, list[bytes]]] = {}
        self._whole: tuple[tuple, DeviceListView] | None = None
        self._pages: OrderedDict[tuple, list] = OrderedDict()  # key -> [body, gzip body or None]
        self._tokens = 0
        self.base_misses = 0  # hosts whose base was read again
        self.live_misses = 0  # hosts whose documents were finished again

    def view(self, session: Session, *, now: datetime, host: str | None = None) -> DeviceListView:
        """The non-retired devices (all, or of ``host``) as :func:`app.services.device_list.device_list`
        orders and shapes them, at ``now`` (UTC), each document as JSON bytes."""
        hosts = read_hosts(session, host=host)
        devices_key = lab_key(session)
        lab = (devices_key, current_locale())
        findings = live_findings(session)
        quarantines = open_quarantines(session)
        holds = self.holds.read(session, now=now, lab=devices_key)
        with self._lock:
            if lab != self._lab:
                self._lab, self._base, self._live, self._whole = lab, {}, {}, None
                self._pages.clear()
            base = {h.id: self._base.get(h.id) for h in hosts}
        stale = [h for h in hosts if not _fresh(base[h.id], h, findings)]
        if stale:
            self.base_misses += len(stale)
            read = read_base(session, stale)
            fresh = {h.id: _Base(host_version(h), read.get(h.id, [])) for h in stale}
            base.update(fresh)
            with self._lock:
                if lab == self._lab:
                    self._base.update(fresh)
        parts = []
        for h in hosts:
            b = base[h.id]
            assert b is not None
            parts.append(self._finished(h, b, now, holds, quarantines))
        if host:
            return DeviceListView([doc for p in parts for doc in p], None)
        with self._lock:  # forget deleted hosts
            listed = {h.id for h in hosts}
            for gone in [hid for hid in self._base if hid not in listed]:
                self._base.pop(gone, None)
                self._live.pop(gone, None)
        key = tuple(parts)  # compared by identity first: unchanged hosts are the very same lists
        with self._lock:
            whole = self._whole
            if whole is not None and whole[0] == key:
                return whole[1]
            self._tokens += 1
            out = DeviceListView([doc for p in parts for doc in p], self._tokens)
            self._whole = (key, out)
            return out

    def _finished(self, h: HostRow, b: _Base, now: datetime, holds, quarantines: dict) -> list[bytes]:  # noqa: ANN001
        state = host_status(h, now)
        live = [(holds.current.get(d.id), holds.upcoming.get(d.id), quarantine_of(quarantines, d)) for d in b.devices]
        key = (b, state, live)
        with self._lock:
            got = self._live.get(h.id)
        if got is not None and got[0][0] is b and got[0][1:] == key[1:]:
            return got[1]
        self.live_misses += 1
        docs = [head + b"," + to_json(live_part(d, state=state, holder=cur, upcoming=nxt, quarantine=q))[1:]
                for d, head, (cur, nxt, q) in zip(b.devices, b.heads, live, strict=True)]
        with self._lock:
            self._live[h.id] = (key, docs)
        return docs

    def page(self, view: DeviceListView, *, offset: int, limit: int, gzip: bool) -> tuple[bytes, bool]:
        """The JSON array of ``view``'s documents ``[offset, offset + limit)``, and whether it
        is gzip-compressed (:func:`app.middleware.compression.gzip_body`): when ``gzip`` and
        the array is as long as the middleware compresses. Kept while ``view`` is the
        current answer."""
        key = (view.token, offset, limit)
        with self._lock:
            got = self._pages.get(key) if view.token is not None else None
        if got is None:
            raw = b"[" + b",".join(view.docs[offset : offset + limit]) + b"]"
            got = [raw, None]
        raw, packed = got
        if gzip and len(raw) >= MINIMUM_SIZE and packed is None:
            packed = got[1] = gzip_body(raw)
        if view.token is not None:
            with self._lock:
                if self._whole is not None and self._whole[1] is view:
                    if self._pages and next(iter(self._pages))[0] != view.token:
                        self._pages.clear()  # pages of an older answer
                    self._pages[key] = got
                    while len(self._pages) > PAGES_KEPT:
                        self._pages.popitem(last=False)
        return (packed, True) if gzip and packed is not None else (raw, False)


def _fresh(b: _Base | None, h: HostRow, findings: dict) -> bool:
    """Whether ``b`` still is host ``h``'s base: same snapshot, same live findings."""
    return b is not None and b.version == host_version(h) and all(
        d.findings == findings.get(d.id, ()) for d in b.devices)


__all__ = ["DeviceListCache", "DeviceListView"]
