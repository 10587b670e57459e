"""The write-ahead spool: nothing is acknowledged before it is here, durable.

Group commits are appended to segment files (``spool-<first seq>.wal``) on one
I/O thread and fsync'ed per the policy before :meth:`Spool.append` returns;
only then does the agent send PUBACKs / HTTP 204s. The writer takes records
in order (:meth:`Spool.peek`), stores them, and :meth:`Spool.release`\\ s them;
fully drained segments are deleted and a checkpoint file remembers the last
drained sequence number. After a crash :meth:`Spool.open` replays everything
after the checkpoint (storage writes are idempotent, so a replayed record that
was in fact stored is harmless). Every record's CRC is checked at replay and
when read back: a damaged record costs only itself (replay resynchronises on
the next intact record), its bytes are set aside in ``damaged/``, counted and
logged with segment, offset and size; a record seen twice is replayed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.collect_agent import spool_format as fmt
from services.collect_agent.tasks import cancel
from services.common.errors import KelvinError
from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata

log = logging.getLogger(__name__)

WANTED = "want"
"""A file its owner creates in a spool directory another process holds: give it back."""


def is_wanted(directory: Path) -> bool:
    """Its owner waits for this spool directory (a fresh :data:`WANTED` file)."""
    try:
        return time.time() - (directory / WANTED).stat().st_mtime < 2.0
    except OSError:
        return False


Item = Batch | SensorMetadata | JobRecord
FsyncPolicy = Literal["commit", "interval", "off"]
_Found = tuple[int, int, int, int]
"""A record found at replay: seq, body offset, body length, readings."""


class SpoolError(KelvinError):
    """The spool cannot persist (disk full, I/O error): nothing may be acknowledged."""


@dataclass(frozen=True, slots=True)
class DamageReport:
    """Bytes of a segment that were no intact record: skipped, counted and kept aside."""

    segment: str
    offset: int
    size: int
    incomplete: bool
    """A record cut short at the end of a segment (an interrupted write, never acknowledged)."""
    records: int
    readings: int
    kept: Path
    """Where the bytes were set aside (``<spool>/damaged/<segment>@<offset>``)."""


@dataclass(slots=True)
class Entry:
    """One spooled record: where it lives on disk and, while memory allows, its content."""

    seq: int
    segment: Path
    offset: int
    length: int
    readings: int
    item: Item | None
    damaged: bool = False
    """Failed its read-back check and was set aside (:meth:`Spool.set_aside`)."""


class Spool:
    """Segment files + an in-memory index of records not yet drained to storage."""

    def __init__(
        self,
        directory: Path,
        fsync: FsyncPolicy = "commit",
        fsync_interval_ms: int = 1000,
        segment_bytes: int = 64 << 20,
        max_bytes: int = 1 << 30,
        memory_bytes: int = 256 << 20,
        lock_wait_s: float = 0.0,
    ) -> None:
        """``lock_wait_s``: how long :meth:`open` waits for a directory another agent holds
        (one draining it as an orphan hands it back when it sees :data:`WANTED`)."""
        self.dir = Path(directory)
        self.lock_wait_s = lock_wait_s
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_ms / 1000
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.memory_bytes = memory_bytes
        self._io = ThreadPoolExecutor(1, thread_name_prefix="spool-io")
        self._entries: deque[Entry] = deque()
        self._segments: dict[Path, int] = {}  # path -> last seq in it
        self._sizes: dict[Path, int] = {}  # only the I/O thread touches these two
        self._disk_bytes = 0
        self._active: Path | None = None
        self._fd: int | None = None
        self._next_seq = 1
        self._drained = 0
        self._mem = 0
        self._readings = 0
        self._available = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._dirty = False
        self._fsync_task: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self.on_released: list[Callable[[], None]] = []
        """Called after a release freed its records and deleted drained segments."""
        self.on_damage: Callable[[DamageReport], None] | None = None
        """Told of every damaged span (at replay, and records that fail read-back);
        called on the spool's I/O thread."""
        self.damage: deque[DamageReport] = deque(maxlen=100)
        """The latest damaged spans (for stats)."""
        self.duplicate_records = 0
        self.fsync_errors = 0
        self.replayed_records = 0
        self.replayed_readings = 0

    # ------------------------------------------------------------------ state
    @property
    def disk_bytes(self) -> int:
        return self._disk_bytes

    @property
    def over_quota(self) -> bool:
        return self.disk_bytes >= self.max_bytes

    @property
    def pending_records(self) -> int:
        return len(self._entries)

    @property
    def pending_readings(self) -> int:
        return self._readings

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Create the directory and replay what a previous run left undrained."""
        await asyncio.get_running_loop().run_in_executor(self._io, self._replay)
        if self._entries:
            self._available.set()
            self._empty.clear()
        if self.fsync == "interval":
            self._fsync_task = asyncio.create_task(self._fsync_loop(), name="spool-fsync")

    async def close(self) -> None:
        await cancel(self._fsync_task)
        self._fsync_task = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io, self._close_files)
        self._io.shutdown(wait=True)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="spool-io")

    def _close_files(self) -> None:
        self._close_active()
        self._active = None
        self._cleanup()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock(self) -> None:
        """One agent per spool directory: two would interleave and delete each other's files."""
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        deadline = time.monotonic() + self.lock_wait_s
        wanted = self.dir / WANTED
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                        raise SpoolError(
                            f"spool {self.dir} is in use by another collect agent (pid "
                            f"{holder}); give each agent its own spool_dir"
                        ) from None
                    # Asks a claimer to hand it back; kept fresh while we wait, so that
                    # one left by a waiter that died is soon ignored (is_wanted).
                    wanted.write_text(str(os.getpid()))
                    time.sleep(0.05)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                if self.lock_wait_s:
                    wanted.unlink()
            raise
        with contextlib.suppress(FileNotFoundError):
            wanted.unlink()
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _replay(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        ckpt = self.dir / "drained"
        with contextlib.suppress(OSError, ValueError):
            self._drained = int(ckpt.read_text().strip() or 0)
        for stale in self.dir.glob("spool-*.wal.tmp"):  # a rewrite a crash interrupted
            stale.unlink()
        last = self._drained
        seen: set[tuple[int, int]] = set()
        found: list[Entry] = []
        for path in sorted(self.dir.glob("spool-*.wal")):
            with contextlib.suppress(ValueError):
                # A new segment must never reopen an old one's name (O_APPEND onto it).
                last = max(last, int(path.name[6:-4]))
            data = path.read_bytes()
            records, damage = fmt.scan(data)
            kept: list[_Found] = []
            for seq, at, length in records:
                last = max(last, seq)
                key = (seq, fmt.header_crc(data, at))
                if key in seen:  # the same record twice (bytes duplicated on disk)
                    self.duplicate_records += 1
                    continue
                seen.add(key)
                if seq > self._drained:
                    n = fmt.readings_count(memoryview(data)[at : at + length])
                    kept.append((seq, at, length, n))
            if damage:
                self._set_aside_spans(path, data, damage)
                if kept:
                    kept = self._rewrite(path, data, kept)
            if not kept:
                path.unlink()
                continue
            found += [Entry(seq, path, at, length, n, None) for seq, at, length, n in kept]
            self._segments[path] = max(k[0] for k in kept)
            self._sizes[path] = path.stat().st_size
            self._disk_bytes += self._sizes[path]
        found.sort(key=lambda e: e.seq)  # duplicated bytes can put a record out of place
        self._entries.extend(found)
        self._readings = sum(e.readings for e in found)
        self.replayed_records = len(found)
        self.replayed_readings = self._readings
        self._next_seq = last + 1
        if self.replayed_records:
            log.warning(
                "spool %s: replaying %d records (%d readings) a previous run did not drain",
                self.dir,
                self.replayed_records,
                self.replayed_readings,
            )

    def _rewrite(self, path: Path, data: bytes, kept: list[_Found]) -> list[_Found]:
        """Replace a damaged segment by its intact records alone (their offsets change).

        Written aside and renamed over the old file, so a crash leaves one or the other;
        a later replay then finds nothing to skip again.
        """
        tmp = path.with_name(path.name + ".tmp")
        out: list[_Found] = []
        parts: list[bytes] = []
        pos = 0
        for seq, at, length, n in kept:
            parts.append(data[at - fmt.HEADER.size : at + length])
            out.append((seq, pos + fmt.HEADER.size, length, n))
            pos += fmt.HEADER.size + length
        with open(tmp, "wb") as f:
            f.write(b"".join(parts))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._sync_dir()
        return out

    def _set_aside_spans(self, path: Path, data: bytes, damage: list[fmt.Damage]) -> None:
        for d in damage:
            self._report(path, d.offset, data[d.offset : d.offset + d.size], d)

    def _report(self, segment: Path, offset: int, raw: bytes, d: fmt.Damage) -> None:
        """Keep damaged bytes for inspection, count them, log where they were."""
        aside = self.dir / "damaged"
        aside.mkdir(exist_ok=True)
        kept = aside / f"{segment.name}@{offset}"
        kept.write_bytes(raw)
        report = DamageReport(
            segment.name, offset, d.size, d.incomplete, d.records, d.readings, kept
        )
        self.damage.append(report)
        if d.incomplete:
            log.warning(
                "spool %s: %d bytes at offset %d of %s are a record cut short (a write a "
                "crash or a failed write interrupted, never acknowledged); kept in %s",
                self.dir,
                d.size,
                offset,
                segment.name,
                kept,
            )
        else:
            log.error(
                "spool %s: %d damaged bytes at offset %d of %s skipped (%d records, %d "
                "readings as far as their headers are readable); replay goes on after "
                "them; kept in %s",
                self.dir,
                d.size,
                offset,
                segment.name,
                d.records,
                d.readings,
                kept,
            )
        if self.on_damage is not None:
            self.on_damage(report)

    def _sync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # ------------------------------------------------------------------ appending
    async def append(self, items: Sequence[tuple[Item, bytes]]) -> None:
        """Persist encoded items (per the fsync policy) and queue them for the writer.

        Raises SpoolError when the disk refuses; then nothing may be acknowledged.
        """
        if not items:
            return
        first = self._next_seq
        self._next_seq += len(items)
        frames = [fmt.frame(first + i, body) for i, (_, body) in enumerate(items)]
        loop = asyncio.get_running_loop()
        try:
            path, offset = await loop.run_in_executor(
                self._io, self._write, frames, first + len(items) - 1
            )
        except OSError as exc:
            raise SpoolError(f"spool {self.dir}: cannot write: {exc.strerror or exc}") from exc
        pos = offset
        for i, (item, body) in enumerate(items):
            n = len(item) if isinstance(item, Batch) else 0
            keep = self._mem + len(body) <= self.memory_bytes
            at = pos + fmt.HEADER.size
            self._entries.append(Entry(first + i, path, at, len(body), n, item if keep else None))
            if keep:
                self._mem += len(body)
            self._readings += n
            pos = at + len(body)
        self._available.set()
        self._empty.clear()

    def _write(self, frames: list[bytes], last_seq: int) -> tuple[Path, int]:
        if self._fd is None or self._sizes.get(self._active, 0) >= self.segment_bytes:  # type: ignore[arg-type]
            self._rotate()
        assert self._fd is not None and self._active is not None
        data = b"".join(frames)
        offset = self._sizes[self._active]
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            self._cut_back(offset)
            raise
        self._sizes[self._active] = offset + len(data)
        self._disk_bytes += len(data)
        # Recorded here, on the I/O thread, so that a cleanup queued behind this
        # write can never delete the segment it just extended.
        self._segments[self._active] = last_seq
        if self.fsync == "commit":
            try:
                os.fdatasync(self._fd)
            except OSError:
                self._abandon(offset)
                raise
        else:
            self._dirty = True
        return self._active, offset

    def _abandon(self, cut_at: int | None) -> None:
        """After a failed fsync, write no more to the active segment: the next write
        starts a new one.

        Linux may drop the pages a failed fsync could not write and clear the error,
        so a later fsync of the same file could succeed without them. The group whose
        fsync failed is not acknowledged; its bytes are cut off (``cut_at``) if the
        file allows it, or else found at replay as records nobody acknowledged (storage
        writes are idempotent, so replaying them is harmless).
        """
        fd, self._fd = self._fd, None
        if fd is None or self._active is None:
            return
        self.fsync_errors += 1
        if cut_at is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, cut_at)
                self._disk_bytes -= self._sizes[self._active] - cut_at
                self._sizes[self._active] = cut_at
        with contextlib.suppress(OSError):
            os.close(fd)
        log.error(
            "spool %s: fsync of %s failed; writing no more to it, the next commit starts "
            "a new segment",
            self.dir,
            self._active.name,
        )

    def _cut_back(self, offset: int) -> None:
        """Remove what a failed write left after ``offset`` (disk full mid-group).

        Left in place, those bytes would shift every later record away from the
        offset the index gives it (replay would skip them as damage and resync).
        """
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, offset)
        except OSError:
            # Cannot cut: continue in a new segment; replay sets this one's tail aside.
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _close_active(self) -> None:
        """Sync (per the policy) and close the active segment's descriptor."""
        if self._fd is None:
            return
        # Forgotten before anything can fail: a closed descriptor kept here would be
        # synced and closed again later, by then perhaps another file's number.
        fd, self._fd = self._fd, None
        try:
            if self.fsync != "off":
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def _rotate(self) -> None:
        self._close_active()
        path = self.dir / f"spool-{self._next_seq:020d}.wal"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._active = path
        self._sizes[path] = os.fstat(self._fd).st_size
        self._disk_bytes += self._sizes[path]
        if self.fsync == "commit":
            self._sync_dir()  # the new file's directory entry must be durable too

    async def _fsync_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.fsync_interval_s)
            if self._dirty:
                self._dirty = False
                await loop.run_in_executor(self._io, self._sync_active)

    def _sync_active(self) -> None:
        if self._fd is not None:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                # Acknowledged (fsync: interval) and perhaps not on disk: say so, and
                # write on in a new segment rather than trust this file's next fsync.
                log.error("spool %s: interval fsync failed: %s", self.dir, exc)
                self._abandon(None)

    # ------------------------------------------------------------------ draining
    async def wait(self) -> None:
        """Until at least one record waits for the writer."""
        while not self._entries:
            self._available.clear()
            await self._available.wait()

    async def wait_empty(self) -> None:
        """Until the writer has stored everything spooled so far."""
        await self._empty.wait()

    def peek(self, max_readings: int) -> list[Entry]:
        """The oldest records, up to ``max_readings`` readings (at least one record)."""
        out: list[Entry] = []
        total = 0
        for e in self._entries:
            if out and total + e.readings > max_readings:
                break
            out.append(e)
            total += e.readings
        return out

    async def load(self, entry: Entry) -> Item:
        """The record's content, read back from disk if it was not kept in memory."""
        if entry.item is not None:
            return entry.item
        return fmt.decode(await self.read_body(entry))

    async def read_body(self, entry: Entry) -> bytes:
        """The record's encoded body as it is on disk, its CRC checked
        (:class:`~.spool_format.CorruptRecord` if it fails)."""
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self._io, self._pread, entry)
        return fmt.check(raw, entry.seq)

    async def set_aside(self, entry: Entry) -> None:
        """A record that fails its read-back check: keep its bytes aside, count it."""
        if entry.damaged:
            return
        entry.damaged = True
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self._io, self._pread, entry)
        damage = fmt.Damage(entry.offset - fmt.HEADER.size, len(raw), False, 1, entry.readings)
        await loop.run_in_executor(
            self._io, self._report, entry.segment, damage.offset, raw, damage
        )

    @staticmethod
    def _pread(entry: Entry) -> bytes:
        """The whole record (header and body) as it is on disk."""
        with open(entry.segment, "rb") as f:
            f.seek(entry.offset - fmt.HEADER.size)
            return f.read(fmt.HEADER.size + entry.length)

    async def release(self, count: int) -> None:
        """The writer stored the first ``count`` records: forget them, delete drained files."""
        for _ in range(count):
            e = self._entries.popleft()
            self._readings -= e.readings
            if e.item is not None:
                self._mem -= e.length
            self._drained = e.seq
        await asyncio.get_running_loop().run_in_executor(self._io, self._cleanup)
        # Only now, and listeners first: whoever waits for "empty" must find the drained
        # segments gone (disk_bytes, over_quota) and back-pressure already re-evaluated.
        for cb in self.on_released:
            cb()
        if not self._entries:
            self._empty.set()

    def _cleanup(self) -> None:
        drained = self._drained
        for path, last in list(self._segments.items()):
            if last > drained:
                continue
            if path == self._active and self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._active = None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._segments.pop(path, None)
            self._disk_bytes -= self._sizes.pop(path, 0)
        tmp = self.dir / "drained.tmp"
        with contextlib.suppress(OSError):
            tmp.write_text(str(drained))
            os.replace(tmp, self.dir / "drained")
