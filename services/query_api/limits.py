"""Bounds on what one query may cost: how many heavy queries run at once, and the memory one holds.

- :class:`HeavyQueryGate` (ASGI middleware) lets at most ``max_heavy_queries`` data
  queries (readings, Grafana and Prometheus queries) run at once; a request that finds
  no slot within ``heavy_query_wait_s`` is answered 503 with ``Retry-After`` (busy,
  counted). A second after the last heavy query ends, the freed memory is handed back
  to the OS (:func:`tune_malloc` has glibc keep it until then, so back-to-back answers
  reuse warm pages instead of faulting in fresh ones).
- Each heavy request gets an :class:`Account` of ``response_memory_bytes``; readings are
  charged as storage hands them over (:func:`read_within` reads a large range slice by
  slice), so a query too big for it stops early with a 400 ``over_budget`` instead of
  first filling memory. Together: heavy queries hold at most
  ``max_heavy_queries x response_memory_bytes``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import ctypes
import ctypes.util
import itertools
import json
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import numpy as np
from prometheus_client import Counter

from services.common.errors import KelvinError
from services.common.logs import RateLimitedLog
from services.common.readings import Series
from services.common.storage.base import StorageBackend
from services.common.tasks import wait_for

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)
_log = RateLimitedLog(log, 30.0)

BYTES_PER_READING = 32
"""What a reading held for an answer costs: its timestamp and value as read (16 bytes)
and the answer's own copy (16 bytes)."""

HEAVY_PATHS = (
    "/api/v1/readings",
    "/grafana/query",
    "/prometheus/api/v1/query",
    "/prometheus/api/v1/query_range",
    "/prometheus/api/v1/read",
)
"""Paths whose requests read readings (prefixes; `query` also covers `query_range`)."""

PROBE_SLICES = 8
"""A long range is read as its first eighth first; the rest at once only if it will fit."""
DENSEST_NS = 1_000_000
"""No sensor is assumed to read faster than once a millisecond: a range that would fit
the budget even then is read in one go (a dashboard's hours), longer ones are probed."""


class OverBudget(KelvinError, ValueError):
    """A query whose answer would hold more readings than one response may."""

    reason = "over_budget"


@dataclass
class Account:
    """The memory one request's answer holds, charged as readings are read."""

    limit_bytes: int
    used_bytes: int = 0
    spilled: Counter | None = None
    """Counts answers that spilled to a temporary file."""

    def fits(self, readings: int) -> bool:
        return self.used_bytes + readings * BYTES_PER_READING <= self.limit_bytes

    def charge(self, readings: int, what: str) -> None:
        self.used_bytes += readings * BYTES_PER_READING
        if self.used_bytes > self.limit_bytes:
            raise OverBudget(
                f"{what}: the answer would hold more than response_memory_bytes "
                f"({self.limit_bytes} bytes, about {self.limit_bytes // BYTES_PER_READING} "
                "readings); narrow the range, resample with interval, or ask for one "
                "plain sensor (streamed in slices)"
            )


_account: contextvars.ContextVar[Account | None] = contextvars.ContextVar(
    "kelvin_query_account", default=None
)


def charge(readings: int, what: str) -> None:
    """Charge the current request's account (no account: not a heavy request)."""
    account = _account.get()
    if account is not None:
        account.charge(readings, what)


async def read_within(storage: StorageBackend, sensor: str, start_ns: int, end_ns: int) -> Series:
    """``storage.read`` charged to the current request, stopping as soon as it is over.

    Outside a heavy request, or for a range that fits even at a reading per millisecond,
    this is one plain read. Otherwise the range's first eighth is read; if the whole
    range extrapolated from it fits, the rest is read at once, else slice by slice,
    each charged before the next is read.
    """
    account = _account.get()
    if account is None or account.fits((end_ns - start_ns) // DENSEST_NS + 1):
        series = await storage.read(sensor, start_ns, end_ns)
        charge(len(series), sensor)
        return series
    bounds = np.linspace(start_ns, end_ns, PROBE_SLICES + 1).astype(np.int64).tolist()
    bounds[0], bounds[-1] = start_ns, end_ns
    parts = [await storage.read(sensor, bounds[0], bounds[1])]
    account.charge(len(parts[0]), sensor)
    if account.fits(len(parts[0]) * (PROBE_SLICES - 1)):
        rest = await storage.read(sensor, bounds[1], end_ns)
        account.charge(len(rest), sensor)
        parts.append(rest)
    else:
        for lo, hi in itertools.pairwise(bounds[1:]):
            part = await storage.read(sensor, lo, hi)
            account.charge(len(part), sensor)
            parts.append(part)
    if len(parts) == 1 or all(len(p) == 0 for p in parts[1:]):
        return parts[0]
    return Series(
        sensor,
        np.concatenate([p.timestamps_ns for p in parts]),
        np.concatenate([p.values for p in parts]),
    )


STREAMED_BYTES_PER_READING = 80
"""A streamed slice's reading: 16 bytes as read, ~40 as JSON or ~57 as CSV text, slack."""
PROBE_FRACTION = 64
"""A long plain stream first reads this fraction of its range to learn its density."""


def _slice_points(account: Account, ahead: int) -> int:
    """Readings per streamed slice so that the slices in flight (``ahead`` being read,
    one encoded) take at most half the request's budget."""
    return max(1024, account.limit_bytes // 2 // (STREAMED_BYTES_PER_READING * (ahead + 1)))


MIN_SLICE_READINGS = 32_768
"""Fewer readings than this per streamed slice cost more in hand-offs (each slice is a
storage read and an encoding on worker threads) than overlapping them saves."""


def _long(range_ns: int, ahead: int) -> bool:
    """Whether a range could outgrow one slice's budget (at a reading per millisecond)."""
    account = _account.get()
    return account is not None and range_ns // DENSEST_NS >= _slice_points(account, ahead)


def probe_end(start_ns: int, end_ns: int, ahead: int) -> int | None:
    """Where a plain stream's density probe ends (its range's first 1/64, read first to
    learn how many slices the rest needs); None for a range read in one slice: one that
    holds fewer than MIN_SLICE_READINGS even at a reading per millisecond."""
    if not _long(end_ns - start_ns, ahead) and (end_ns - start_ns) // DENSEST_NS < (
        MIN_SLICE_READINGS
    ):
        return None
    return start_ns + (end_ns - start_ns) // PROBE_FRACTION


def stream_slices(probe_readings: int, probe_ns: int, rest_ns: int, count: int, ahead: int) -> int:
    """How many slices the rest of a plain stream is read in.

    A range that could outgrow the budget: at least ``count``, and as many as keep each
    slice within the budget at the probe's density. Any other: up to ``count``, but no
    more than have MIN_SLICE_READINGS each at that density (one for a few readings).
    """
    expected = probe_readings * rest_ns / probe_ns if probe_ns > 0 else 0.0
    account = _account.get()
    if account is not None and _long(rest_ns, ahead):
        return min(1 << 16, max(count, int(expected // _slice_points(account, ahead)) + 1))
    return max(1, min(count, int(expected // MIN_SLICE_READINGS)))


def snap(bounds: list[int], cuts: list[int]) -> list[int]:
    """Slice ``bounds`` (ascending; the first and last stay) each moved to the nearest of
    ``cuts`` (ascending) within a quarter of the narrower slice beside it, so a slice
    begins where a stored block does and no block is decoded by two slices; a bound
    with no cut that near stays. A slice grows by at most half: the slices in flight
    stay within the budget :func:`_slice_points` gave them half of."""
    if not cuts or len(bounds) < 3:
        return bounds
    out = [bounds[0]]
    for prev, b, nxt in zip(bounds, bounds[1:], bounds[2:], strict=False):
        reach = min(b - prev, nxt - b) // 4
        i = bisect.bisect_left(cuts, b)
        near = [c for c in cuts[max(0, i - 1) : i + 1] if abs(c - b) <= reach]
        c = min(near, key=lambda c: abs(c - b)) if near else b
        if c > out[-1]:
            out.append(c)
    if bounds[-1] > out[-1]:
        out.append(bounds[-1])
    return out


DEFAULT_HELD_BYTES = 64 << 20


class Held:
    """Encoded pieces an answer must keep until its end (a JSON answer's values come after
    all its timestamps): in memory up to a quarter of the request's budget, then in a
    temporary file, so a streamed answer of any length holds a bounded amount."""

    def __init__(self) -> None:
        self.account = _account.get()
        self.limit = self.account.limit_bytes // 4 if self.account else DEFAULT_HELD_BYTES
        self.pieces: list[bytes | memoryview] = []
        self.size = 0
        self.file: IO[bytes] | None = None

    async def add(self, piece: bytes | memoryview) -> None:
        if self.file is None and self.size + len(piece) <= self.limit:
            self.pieces.append(piece)
            self.size += len(piece)
            return
        loop = asyncio.get_running_loop()
        f = self.file
        if f is None:
            f = self.file = tempfile.TemporaryFile(prefix="kelvin-answer-")  # noqa: SIM115
            if self.account is not None and self.account.spilled is not None:
                self.account.spilled.inc()
            held, self.pieces = self.pieces, []
            await loop.run_in_executor(None, f.writelines, held)
        await loop.run_in_executor(None, f.write, piece)

    async def drain(self, chunk: int = 1 << 20) -> AsyncIterator[bytes | memoryview]:
        """Everything added, in order; memory is let go as it is sent (a spilled answer
        holds a chunk read back and its copy in the socket's buffer at its end)."""
        if self.file is None:
            for i, piece in enumerate(self.pieces):
                yield piece
                self.pieces[i] = b""
            self.pieces = []
            return
        loop = asyncio.get_running_loop()
        f = self.file
        try:
            await loop.run_in_executor(None, f.seek, 0)
            while data := await loop.run_in_executor(None, f.read, chunk):
                yield data
        finally:
            f.close()
            self.file = None


def _malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc keeps it otherwise: an answer of a few
    hundred MB would stay in the RSS until the process ends)."""
    if _libc is not None:
        _libc.malloc_trim(0)


TRIM_IDLE_S = 1.0
"""Heavy queries idle this long: freed memory goes back to the OS."""
MMAP_THRESHOLD_BYTES = 64 << 20
"""Blocks below this come from malloc's heap, not from a fresh mapping of their own."""
TRIM_THRESHOLD_BYTES = 256 << 20
"""Free memory a heap keeps at its top between answers."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_tuned: bool | None = None


def tune_malloc() -> bool:
    """Have glibc keep the memory of one answer for the next (once per process).

    An answer's buffers (a few MB each: read slices, encoded text, socket buffers) would
    each get a fresh mapping, or be given back as soon as they are freed, so every
    answer faulted all its pages in again: measured 10-20 % of a 1M-point answer's CPU.
    With fixed thresholds they stay in the heap; :class:`HeavyQueryGate` still hands
    them back once heavy queries have been idle for :data:`TRIM_IDLE_S`. False without
    glibc (nothing changes).
    """
    global _tuned
    if _tuned is None:
        mallopt = getattr(_libc, "mallopt", None)
        _tuned = mallopt is not None and bool(
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
        )
    return _tuned


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_libc = _load_libc()


class HeavyQueryGate:
    """ASGI middleware: a slot per heavy request, held until its response is sent."""

    def __init__(
        self,
        app: ASGIApp,
        max_heavy: int,
        wait_s: float,
        memory_bytes: int,
        refused: Counter,
        spilled: Counter | None = None,
    ) -> None:
        self.app = app
        self.spilled = spilled
        self.slots = asyncio.Semaphore(max_heavy)
        self.max_heavy, self.wait_s, self.memory_bytes = max_heavy, wait_s, memory_bytes
        self.refused = refused
        self.running = 0
        self._idle: asyncio.TimerHandle | None = None
        self._trimming: asyncio.Task[None] | None = None
        tune_malloc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        if scope["type"] != "http" or not scope["path"].startswith(HEAVY_PATHS):
            await app(scope, receive, send)
            return
        try:
            await wait_for(self.slots.acquire(), self.wait_s)
        except TimeoutError:
            await self._busy(scope, send)
            return
        self.running += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        token = _account.set(Account(self.memory_bytes, spilled=self.spilled))
        try:
            await app(scope, receive, send)
        finally:
            _account.reset(token)
            self.running -= 1
            self.slots.release()
            if self.running == 0 and _libc is not None:
                self._idle = asyncio.get_running_loop().call_later(TRIM_IDLE_S, self._trim)

    def _trim(self) -> None:
        self._idle = None
        if self.running == 0 and (self._trimming is None or self._trimming.done()):
            self._trimming = asyncio.ensure_future(asyncio.to_thread(_malloc_trim))

    async def _busy(self, scope: Scope, send: Send) -> None:
        self.refused.labels("busy").inc()
        _log.warning(
            "busy",
            "%s refused: %d heavy queries already running (max_heavy_queries); "
            "the client may retry",
            scope["path"],
            self.max_heavy,
        )
        body = json.dumps(
            {
                "error": "busy",
                "detail": f"{self.max_heavy} heavy queries are running already "
                f"(query_api.max_heavy_queries); retry in a few seconds",
            }
        ).encode()
        retry = str(max(1, round(self.wait_s)))
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", retry.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
