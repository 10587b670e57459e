"""DCDB CSV lines (``Sensor,Time,Value``) built with numpy, without a Python loop per reading.

Formatting a million readings with f-strings costs ~1.6 s; this module does it
in ~45 ms (docs/query-api.md has the measurements). How:

- **Heads** (``name,`` + time + ``,``) are fixed-width rows of a byte matrix.
  ISO times come from lookup tables: one ``YYYY-MM-DDT`` string per distinct
  day of the slice, a table of the 86,400 ``HH:MM:SS`` strings, and one of the
  1,000 three-digit groups for the nanoseconds, each copied into its columns
  as one fixed-size ``void`` item per row (a memcpy, not per-byte work).
- **Values** are formatted by orjson (shortest round-trip digits, the same
  digits as Python's ``repr``), whose separators become the newlines.
- **Lines** are assembled with two scatters through *overlapping* ``void``
  views of the output (an item at every byte offset): each value plus its
  newline as a window that ends exactly where the line ends (its spill lands
  in the line's own head), then the heads over the spills.

With the compiled core, :func:`lines` writes the same bytes in C without holding
the GIL (services/common/csrc/encode.c), in parallel with the storage reads and
the socket writes.
"""

from __future__ import annotations

import math
import threading
from types import ModuleType

import numpy as np
import numpy.typing as npt
import orjson

from services.common import native
from services.common.readings import Float64Array, Int64Array
from services.query_api.csvtimes import (
    ISO_WIDTH,
    KEEP_BYTES,
    U8,
    cols,
    int_into,
    iso_into,
    scratch,
)

_MIN_NS, _MAX_NS = -62_135_596_800 * 10**9, 253_402_300_800 * 10**9
"""Years 0001 to 9999: the fixed-width range of ISO 8601 times."""
_PAD = 32
"""Bytes before the first token and the first line: more than a token and its newline."""


def _void_at_every_byte(buf: U8, size: int) -> npt.NDArray[np.void]:
    """An item of ``size`` bytes at every byte offset of ``buf`` (overlapping view)."""
    return np.ndarray((buf.shape[0] - size + 1,), f"V{size}", buffer=buf, strides=(1,))


class _Heads(threading.local):
    """Per thread: the head matrix, and how much of it already holds the constant bytes.

    The constant bytes (name, separators) are written once per layout and kept
    from call to call: the next slice of the same sensor only writes its times.
    """

    def __init__(self) -> None:
        self.buf: U8 = np.empty(0, np.uint8)
        self.layout: tuple[bytes, int, tuple[tuple[int, bytes], ...]] | None = None
        self.rows = 0
        """Rows holding the layout's constant bytes."""
        self.zero_rows = 0
        """Rows whose nanosecond columns hold zeros."""

    def get(self, prefix: bytes, width: int, n: int, consts: dict[int, bytes]) -> tuple[U8, bool]:
        """The head matrix with the constant bytes in place, and whether it is the kept one."""
        layout = (prefix, width, tuple(sorted(consts.items())))
        if n * width > KEEP_BYTES:  # too large to keep: a fresh matrix, state untouched
            return _constants(np.empty((n, width), np.uint8), prefix, consts), False
        if self.buf.shape[0] < n * width:
            self.buf = np.empty(max(n * width, 1 << 16), np.uint8)
            self.rows = self.zero_rows = 0
        if layout != self.layout:
            self.layout, self.rows, self.zero_rows = layout, 0, 0
        head = self.buf[: n * width].reshape(n, width)
        if self.rows < n:
            _constants(head[self.rows :], prefix, consts)
            self.rows = n
        return head, True


def _constants(head: U8, prefix: bytes, consts: dict[int, bytes]) -> U8:
    cols(head, 0, len(prefix))[:] = np.void(prefix)
    for at, text in consts.items():
        cols(head, at, at + len(text))[:] = np.void(text)
    return head


_heads = _Heads()


compiled: ModuleType | None = native.encoders()
"""The compiled encoder (csrc/encode.c), None for the numpy code: the same bytes."""


def lines(name: str, ts_ns: Int64Array, values: Float64Array, iso: bool = True) -> bytes:
    """CSV lines ``name,time,value\\n`` for one sensor; NaN values are empty fields."""
    n = ts_ns.shape[0]
    if n == 0:
        return b""
    prefix = _csv_field(name).encode() + b","
    p = len(prefix)
    if compiled is not None:
        if iso:  # (C writes any int64 time as ISO: no bounds to look for)
            width = p + ISO_WIDTH + 1
        else:
            lo, hi = int(ts_ns.min()), int(ts_ns.max())
            width = p + len(str(hi)) + 1
            if lo < 0 or len(str(lo)) != width - p - 1:
                return _slow_lines(name, ts_ns, values, iso)
        got = compiled.csv_lines(
            prefix,
            np.ascontiguousarray(ts_ns, np.int64),
            np.ascontiguousarray(values, np.float64),
            iso,
            min(_PAD - 1, width),  # as _assemble: a longer value takes the slow path
        )
        return _slow_lines(name, ts_ns, values, iso) if got is None else bytes(got)
    if bool(np.isinf(values).any()):
        return _slow_lines(name, ts_ns, values, iso)
    lo, hi = int(ts_ns.min()), int(ts_ns.max())
    if iso:
        if lo < _MIN_NS or hi >= _MAX_NS:
            return _slow_lines(name, ts_ns, values, iso)
        width = p + ISO_WIDTH + 1
        head, kept = _heads.get(prefix, width, n, {p + 19: b".", p + 29: b"Z,"})
        zeros = iso_into(ts_ns, head, p, zeros_kept=kept and _heads.zero_rows >= n)
        if kept:
            _heads.zero_rows = max(_heads.zero_rows, n) if zeros else 0
    else:
        digits = len(str(hi))
        if lo < 0 or len(str(lo)) != digits:  # raw times must share a width for the fast path
            return _slow_lines(name, ts_ns, values, iso)
        width = p + digits + 1
        head, _ = _heads.get(prefix, width, n, {width - 1: b","})
        int_into(ts_ns, digits, head, p)
    out = _assemble(head, values)
    return _slow_lines(name, ts_ns, values, iso) if out is None else out


def _assemble(head: U8, values: Float64Array) -> bytes | None:
    """Lines = row i of ``head`` + shortest repr of ``values[i]`` (NaN: nothing) + newline;
    None when a value is longer than the head is wide (short names with raw times)."""
    n, width = head.shape
    raw = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)  # [1.5,null,...]
    body = scratch("body", _PAD + len(raw))
    body[:_PAD] = 0
    body[_PAD:] = np.frombuffer(raw, np.uint8)
    work = scratch("assemble", 4 * n, np.int64)
    ends, length, line_end, at = work[:n], work[n : 2 * n], work[2 * n : 3 * n], work[3 * n :]
    # where each token's separator is: the n - 1 commas, then the closing bracket
    ends[:-1] = np.flatnonzero(body == 44)  # 3x faster than np.compress into a buffer
    ends[-1] = body.shape[0] - 1
    body[ends] = 10  # every separator becomes the newline that ends its line
    length[0] = ends[0] - _PAD - 1
    np.subtract(ends[1:], ends[:-1], out=length[1:])
    length[1:] -= 1
    nan = np.isnan(values)
    if bool(nan.any()):
        length[nan] = 0  # orjson wrote null: the field stays empty
    window = int(length.max()) + 1
    if window > min(_PAD, width + 1):  # a spill would reach the line before
        return None
    np.add(length, width + 1, out=at)
    np.cumsum(at, out=line_end)
    total = int(line_end[-1])
    out = scratch("out", _PAD + total)
    line_end += _PAD
    # values with their newline first, as windows ending where each line ends: what
    # they drag along from the left lands inside the line's own head...
    np.add(ends, 1 - window, out=ends)
    tokens = _void_at_every_byte(body, window)[ends]  # faster than np.take into a buffer
    np.subtract(line_end, window, out=at)
    _void_at_every_byte(out, window)[at] = tokens
    # ...which the heads then overwrite
    np.subtract(line_end, length, out=at)
    at -= width + 1
    _void_at_every_byte(out, width)[at] = head.view(f"V{width}")[:, 0]
    return out[_PAD:].tobytes()


def _slow_lines(name: str, ts_ns: Int64Array, values: Float64Array, iso: bool) -> bytes:
    """Python formatting for what the fast path leaves out (±inf, years outside 1..9999)."""
    from services.common.times import format_iso_many

    times = format_iso_many(ts_ns) if iso else [str(t) for t in ts_ns.tolist()]
    head = _csv_field(name)
    return "".join(
        f"{head},{t},{_fmt(v)}\n" for t, v in zip(times, values.tolist(), strict=True)
    ).encode()


def _fmt(v: float) -> str:
    if math.isnan(v):
        return ""
    return repr(v)


def _csv_field(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text
