"""Durable agent state under ``state_dir``: the snapshot spool, the seq counter, the ack cache.

Every file is written atomically (temporary file, ``fsync``, ``rename``, ``fsync`` of the
directory), so a crash or SIGKILL leaves either the old or the new file, never a torn one.

* ``spool/<seq>.json``: one snapshot per file, replayed in seq order once the service
  answers again. Bounded by total size (default 1 GiB) and age (default 48 h): at 5 s and a
  generous 20 KiB per snapshot, 24 h is 17,280 files, about 340 MiB.
* ``seq``: the next seq is reserved in blocks of :data:`SEQ_BLOCK`, so the counter is
  written once per block and stays monotonic across restarts and power loss (a restart
  skips the unused rest of the block; the service only needs seqs to be unique and rising).
* ``ack.json``: the last :class:`~agent.schema.SnapshotAck`, so enforcement keeps its
  reservation table across restarts and outages.
* ``dead-letter.jsonl``: snapshots the service refused for good (a 4xx other than 404, 408
  and 429), one JSON line each with the status and the service's reason, so the spool
  moves on and an admin can see what was refused; rotated to ``.1`` beyond 16 MiB.

Seqs only rise within one agent instance: a lost state directory starts them at 0 again,
which the service tells apart by the instance id sent with each snapshot.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from agent.schema import SnapshotAck
from agent.telemetry import log

SEQ_BLOCK = 1000
_SPOOL_NAME = re.compile(r"^(\d{12})\.json$")


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class SeqCounter:
    """Monotonic snapshot numbers that survive restarts (see module doc)."""

    def __init__(self, path: Path, block: int = SEQ_BLOCK) -> None:
        self.path = path
        self.block = block
        try:
            self._next = int(path.read_text().strip())
        except FileNotFoundError:
            self._next = 0
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"cannot read the seq counter {path}: {exc}; remove it only if the spool is empty") from exc
        self._reserved = self._next
        self._reserve()

    def _reserve(self) -> None:
        self._reserved = self._next + self.block
        atomic_write(self.path, f"{self._reserved}\n".encode())

    def next(self) -> int:
        """The next seq (reserving a new block on disk when the current one is used up)."""
        if self._next >= self._reserved:
            self._reserve()
        seq = self._next
        self._next += 1
        return seq


class Spool:
    """A directory of one-JSON-per-seq snapshot files, oldest first.

    :param max_bytes: total size bound; the oldest files are dropped (logged) beyond it.
    :param max_age_s: age bound in seconds (file modification time).
    """

    def __init__(self, directory: Path, *, max_bytes: int = 1 << 30, max_age_s: float = 48 * 3600,
                 wall: Callable[[], float] = time.time) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._wall = wall
        self.dir.mkdir(parents=True, exist_ok=True)
        for stray in self.dir.glob(".*.tmp"):  # left by a crash between write and rename
            stray.unlink(missing_ok=True)
        self._sizes: dict[int, int] = {}
        for entry in self.dir.iterdir():
            m = _SPOOL_NAME.match(entry.name)
            if m:
                self._sizes[int(m.group(1))] = entry.stat().st_size
        self._order = sorted(self._sizes)
        self._bytes = sum(self._sizes.values())
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._order)

    @property
    def total_bytes(self) -> int:
        """Bytes held in the spool."""
        return self._bytes

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}.json"

    def put(self, seq: int, body: bytes) -> None:
        """Spool one serialized snapshot durably, then enforce the bounds."""
        atomic_write(self._path(seq), body)
        if seq not in self._sizes:
            self._order.append(seq)
            if len(self._order) > 1 and self._order[-2] > seq:
                self._order.sort()
        self._bytes += len(body) - self._sizes.get(seq, 0)
        self._sizes[seq] = len(body)
        self._enforce_bounds()

    def _enforce_bounds(self) -> None:
        dropped = 0
        cutoff = self._wall() - self.max_age_s
        while self._order:
            oldest = self._order[0]
            too_big = self._bytes > self.max_bytes
            if not too_big:
                try:
                    too_old = self._path(oldest).stat().st_mtime < cutoff
                except FileNotFoundError:
                    too_old = True
                if not too_old:
                    break
            self.remove(oldest)
            dropped += 1
        if dropped:
            self.dropped += dropped
            log.error("spool bound reached (%d bytes max, %.0f h max): dropped the %d oldest snapshot(s)",
                      self.max_bytes, self.max_age_s / 3600, dropped)

    def oldest(self) -> tuple[int, bytes] | None:
        """The oldest spooled snapshot as (seq, body), or ``None`` when empty.

        A file that cannot be read back (disk error) is dropped with a log, never retried forever.
        """
        while self._order:
            seq = self._order[0]
            try:
                return seq, self._path(seq).read_bytes()
            except OSError as exc:
                log.error("spooled snapshot %d unreadable (%s): dropped", seq, exc)
                self.remove(seq)
        return None

    def remove(self, seq: int) -> None:
        """Forget a snapshot (after the service acknowledged it, or when it cannot be sent)."""
        self._path(seq).unlink(missing_ok=True)
        if seq in self._sizes:
            self._bytes -= self._sizes.pop(seq)
            self._order.remove(seq)


class AckCache:
    """The last :class:`SnapshotAck`, in memory and in ``ack.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ack: SnapshotAck | None = None
        self._saved_key: str | None = None
        try:
            self.ack = SnapshotAck.model_validate_json(path.read_bytes())
            self._saved_key = self._key(self.ack)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable ack cache %s: %s", path, exc)

    @staticmethod
    def _key(ack: SnapshotAck) -> str:
        return ack.model_dump_json(include={"policy", "reservations", "open_devices", "unix_uids", "booking_url"})

    def update(self, ack: SnapshotAck) -> None:
        """Keep ``ack``; rewrite the file only when the table or policy changed."""
        self.ack = ack
        key = self._key(ack)
        if key != self._saved_key:
            try:
                atomic_write(self.path, ack.model_dump_json().encode())
                self._saved_key = key
            except OSError as exc:
                log.error("cannot save the reservation table to %s: %s", self.path, exc)


class DeadLetters:
    """Snapshots the service refused for good, appended to a JSON-lines file.

    :param max_bytes: beyond this size the file is renamed to ``<name>.1`` (replacing an
        older one) and a new one is started, so refusals never fill the disk.
    """

    def __init__(self, path: Path, *, max_bytes: int = 16 << 20) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.count = 0

    def put(self, seq: int, status: int | None, reason: str | None, body: bytes, *, at: datetime) -> str:
        """Record one refused snapshot; returns where it went (for the log line)."""
        try:
            snapshot: object = json.loads(body)
        except ValueError:
            snapshot = body.decode("utf-8", errors="replace")
        line = json.dumps({"at": at.isoformat(), "seq": seq, "status": status, "reason": (reason or "")[:2000],
                           "snapshot": snapshot}, separators=(",", ":")) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            log.error("cannot write the dead-letter file %s: %s", self.path, exc)
            return f"dropped (dead-letter file unwritable: {exc})"
        self.count += 1
        return f"moved to {self.path}"
