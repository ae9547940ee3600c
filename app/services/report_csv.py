"""The usage report as CSV (one row per reservation), safe to open in a spreadsheet."""

from __future__ import annotations

import csv
import io
from datetime import UTC

from app.sanitize import csv_cell
from app.schemas.report import UsageReport

COLUMNS = ("reservation", "user", "host", "devices", "start_utc", "end_utc", "status", "reserved_gpu_hours",
           "used_gpu_hours", "idle_gpu_hours", "unmonitored_gpu_hours", "used_fraction", "checked_in_utc",
           "checked_in_idle_gpu_hours", "auto_release")


def usage_csv(report: UsageReport) -> str:
    """``report.reservations`` as CSV text with a header row (``COLUMNS``); times in UTC
    (ISO 8601), GPU-hours as numbers. Every text cell goes through
    :func:`app.sanitize.csv_cell`, so a user or host name starting with ``=`` stays text."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(COLUMNS)
    for r in report.reservations:
        row = (r.id, r.user, r.host, " ".join(r.devices), r.start.astimezone(UTC).isoformat(),
               r.end.astimezone(UTC).isoformat(), r.status, r.reserved_gpu_hours, r.used_gpu_hours, r.idle_gpu_hours,
               r.unmonitored_gpu_hours, r.used_fraction,
               r.checked_in_at.astimezone(UTC).isoformat() if r.checked_in_at else "", r.checked_in_idle_gpu_hours,
               r.auto_release or "")
        w.writerow([csv_cell(v) for v in row])
    return out.getvalue()
