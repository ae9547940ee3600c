"""The usage report as CSV, safe to open in a spreadsheet: one row per reservation (the
default), per user (with a total row for the scope), or per host."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import UTC
from typing import Literal

from app.sanitize import csv_cell
from app.schemas.report import UsageReport

COLUMNS = ("reservation", "user", "host", "devices", "start_utc", "end_utc", "status", "reserved_gpu_hours",
           "used_gpu_hours", "idle_gpu_hours", "unmonitored_gpu_hours", "used_fraction", "quarantined_gpu_hours",
           "checked_in_utc", "checked_in_idle_gpu_hours", "auto_release")
FIGURES = ("reservations", "reserved_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "unmonitored_gpu_hours",
           "used_fraction", "no_shows", "consent_releases", "checked_in_idle_gpu_hours", "quarantined_gpu_hours")
USER_COLUMNS = ("row", "user", *FIGURES)
HOST_COLUMNS = ("host", *FIGURES, "quarantined_device_hours", "quarantines")
By = Literal["reservation", "user", "host"]


def _write(header: tuple[str, ...], rows: Iterable[tuple]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(header)
    for row in rows:
        w.writerow(["" if v is None else csv_cell(v) for v in row])
    return out.getvalue()


def usage_csv(report: UsageReport, by: By = "reservation") -> str:
    """``report`` as CSV text with a header row.

    ``by="reservation"``: ``COLUMNS``, times in UTC (ISO 8601); ``"user"``: ``USER_COLUMNS``,
    one ``member`` row per user and a ``total`` row named after the user or group of the
    scope; ``"host"``: ``HOST_COLUMNS``. GPU-hours are numbers, ``used_fraction`` is empty when
    nothing was monitored. Every text cell goes through :func:`app.sanitize.csv_cell`, so a
    user or host name starting with ``=`` stays text."""
    if by == "user":
        members = [("member", u.user, *(getattr(u, f) for f in FIGURES)) for u in report.users]
        total = ("total", report.name, *(getattr(report.totals, f) for f in FIGURES))
        return _write(USER_COLUMNS, [*members, total])
    if by == "host":
        return _write(HOST_COLUMNS, [(h.host, *(getattr(h, f) for f in HOST_COLUMNS[1:])) for h in report.hosts])
    return _write(COLUMNS, [
        (r.id, r.user, r.host, " ".join(r.devices), r.start.astimezone(UTC).isoformat(),
         r.end.astimezone(UTC).isoformat(), r.status, r.reserved_gpu_hours, r.used_gpu_hours, r.idle_gpu_hours,
         r.unmonitored_gpu_hours, r.used_fraction, r.quarantined_gpu_hours,
         r.checked_in_at.astimezone(UTC).isoformat() if r.checked_in_at else "", r.checked_in_idle_gpu_hours,
         r.auto_release or "")
        for r in report.reservations
    ])
