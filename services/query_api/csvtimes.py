"""Time columns of DCDB CSV lines, written into a byte matrix with numpy (see :mod:`.csvfast`).

ISO 8601 times with ns are fixed-width, so each part goes into its columns of
every row at once, as one fixed-size ``void`` item per row (a memcpy, not
per-byte work): ``YYYY-MM-DDT`` from one string per distinct day (a run per
day when times are sorted, a gather otherwise), ``HH:MM:SS`` from a table of
the 86,400 seconds of a day, and the nanoseconds from a table of the 1,000
three-digit groups, skipped when every reading is on a whole second.

Temporaries live in per-thread scratch buffers: on this machine a fresh page
costs ~0.8 ms per MB to fault in, more than the formatting itself.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.readings import Int64Array

NS_PER_S = 1_000_000_000
ISO_WIDTH = 30
"""``2026-11-30T12:00:00.123456789Z``"""

U8 = npt.NDArray[np.uint8]
_local = threading.local()
_RUNS_MAX = 64
"""Up to this many days per slice are written run by run (sorted times)."""


KEEP_BYTES = 16 << 20
"""Larger scratch arrays are not kept (a caller formatting millions of readings at once
would otherwise leave that much memory with each thread)."""


def scratch(key: str, n: int, dtype: npt.DTypeLike = np.uint8) -> npt.NDArray[Any]:
    """A per-thread array of ``n`` items, reused from call to call (contents undefined)."""
    dt = np.dtype(dtype)
    nbytes = n * dt.itemsize
    if nbytes > KEEP_BYTES:
        return np.empty(n, dt)
    bufs: dict[str, U8] = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(key)
    if buf is None or buf.shape[0] < nbytes:
        buf = bufs[key] = np.empty(max(nbytes, 1 << 16), np.uint8)
    return buf[:nbytes].view(dt)


def cols(head: U8, a: int, b: int) -> npt.NDArray[np.void]:
    """Columns ``[a, b)`` of every row of ``head`` as one void item per row."""
    return head[:, a:b].view(f"V{b - a}")[:, 0]


def _digits(count: int, width: int) -> U8:
    """``count`` rows of ``width`` ASCII digits: row k is k zero-padded."""
    k = np.arange(count, dtype=np.int64)[:, None]
    return ((k // 10 ** np.arange(width - 1, -1, -1)) % 10 + 48).astype(np.uint8)


@cache
def _tables() -> tuple[npt.NDArray[np.void], npt.NDArray[np.void], U8, U8]:
    """``HH:MM:SS`` of each second of a day (V8), three digits of 0..999 (V3), and the
    digit rows of 0..9999 and 0..99 (for dates)."""
    sod = np.arange(86_400, dtype=np.int64)
    two, four = _digits(100, 2), _digits(10_000, 4)
    tod = np.empty((86_400, 8), np.uint8)
    tod[:, [2, 5]] = 58  # :
    for col, x in ((0, sod // 3600), (3, (sod // 60) % 60), (6, sod % 60)):
        tod[:, col : col + 2] = two[x]
    return tod.view("V8")[:, 0], _digits(1000, 3).view("V3")[:, 0], four, two


def _civil(days: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Days since 1970-01-01 -> (year, month, day), proleptic Gregorian (H. Hinnant's algorithm)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    return year, month, day


def dates(days: Int64Array) -> npt.NDArray[np.void]:
    """``YYYY-MM-DDT`` for each day (years 1..9999) as V11."""
    _, _, four, two = _tables()
    year, month, day = _civil(days)
    out = np.empty((days.shape[0], 11), np.uint8)
    out[:, 0:4] = four[year]
    out[:, 4] = out[:, 7] = 45  # -
    out[:, 5:7] = two[month]
    out[:, 8:10] = two[day]
    out[:, 10] = 84  # T
    return out.view("V11")[:, 0]


def iso_into(ts_ns: Int64Array, head: U8, at: int, zeros_kept: bool) -> bool:
    """Everything but the constant bytes (``.``, ``Z``) of ``YYYY-MM-DDTHH:MM:SS.fffffffffZ``
    for each timestamp, in columns ``at..at+30`` of ``head`` (years 1..9999).

    ``zeros_kept``: the nanosecond columns already hold zeros. Returns whether
    they hold zeros afterwards (every reading on a whole second).
    """
    tod, three, _, _ = _tables()
    n = ts_ns.shape[0]
    work = scratch("iso", 4 * n, np.int64)
    sec, frac, day, sod = work[:n], work[n : 2 * n], work[2 * n : 3 * n], work[3 * n :]
    np.floor_divide(ts_ns, NS_PER_S, out=sec)
    np.multiply(sec, NS_PER_S, out=frac)
    np.subtract(ts_ns, frac, out=frac)
    np.floor_divide(sec, 86_400, out=day)
    np.multiply(day, 86_400, out=sod)
    np.subtract(sec, sod, out=sod)
    _write_dates(day, cols(head, at, at + 11))
    tmp = scratch("tod", n, "V8")
    np.take(tod, sod, out=tmp, mode="clip")
    cols(head, at + 11, at + 19)[:] = tmp
    if not bool(frac.any()):  # whole seconds (the usual case)
        if not zeros_kept:
            cols(head, at + 20, at + 29)[:] = np.void(b"000000000")
        return True
    f = scratch("frac", 3 * n, np.int32)  # < 1e9: 32-bit division is twice as fast
    ms, us, rest = f[:n], f[n : 2 * n], f[2 * n :]
    rest[:] = frac
    np.floor_divide(rest, 1_000_000, out=ms)
    np.multiply(ms, 1_000_000, out=us)
    np.subtract(rest, us, out=rest)
    np.floor_divide(rest, 1000, out=us)
    cols(head, at + 20, at + 23)[:] = three[ms]
    cols(head, at + 23, at + 26)[:] = three[us]
    np.multiply(us, 1000, out=ms)
    np.subtract(rest, ms, out=rest)
    cols(head, at + 26, at + 29)[:] = three[rest]
    return False


def _write_dates(day: Int64Array, out: npt.NDArray[np.void]) -> None:
    n = day.shape[0]
    change = np.flatnonzero(day[1:] != day[:-1]) + 1
    if change.shape[0] < _RUNS_MAX and bool(np.all(day[change] > day[change - 1])):
        # sorted times: one broadcast per day
        bounds = [0, *change.tolist(), n]
        text = dates(day[bounds[:-1]])
        for k in range(len(bounds) - 1):
            out[bounds[k] : bounds[k + 1]] = text[k]
        return
    lo, hi = int(day.min()), int(day.max())
    if hi - lo > 2 * n:
        uniq, inv = np.unique(day, return_inverse=True)  # sparse: distinct days only
        out[:] = dates(uniq)[inv]
    else:
        out[:] = dates(np.arange(lo, hi + 1, dtype=np.int64))[day - lo]


def int_into(values: Int64Array, digits: int, head: U8, at: int) -> None:
    """Non-negative integers of exactly ``digits`` digits in columns ``at..at+digits``."""
    _, _, _, two = _tables()
    pairs = two.view("<u2")[:, 0]
    rest = digits
    if rest % 2:
        head[:, at] = values // 10 ** (rest - 1) + 48
        at, rest = at + 1, rest - 1
    while rest:
        pair = (values // 10 ** (rest - 2)) % 100
        head[:, at : at + 2].view("<u2")[:, 0] = pairs[pair]
        at, rest = at + 2, rest - 2
