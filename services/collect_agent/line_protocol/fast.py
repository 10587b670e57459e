"""The vectorised line-protocol parser: a whole body in a few dozen numpy calls.

It takes the plain lines (:mod:`.layout`; string fields too, :mod:`.quotes`)
whose numbers, booleans and timestamps it can convert exactly (:mod:`.numbers`)
and whose names it knows, and hands every other line, with its line number, to
the reference parser (:mod:`.scan`), which decides it exactly as InfluxDB
does. A line with a backslash or a quote the fast path cannot pair can run on
over following newlines (a quoted newline, an escaped one), so those are found
first, one scan each, and the lines they swallow are taken out of the plain set.

Readings are named through exact tables (:mod:`.table`): a line's key and first
field (``node,host=a value``, one contiguous span) give its first sensor, the
key's id and a further field's key give the others. Only a series or field
seen for the first time is named in Python, once, and the reference's rules
decide there whether the fast path may take it (a duplicate tag key, a tag or
field named ``time``, a name too deep for Kelvin: no).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from services.collect_agent.line_protocol import numbers as num
from services.collect_agent.line_protocol import quotes, scan
from services.collect_agent.line_protocol.layout import Layout, layout, separators
from services.collect_agent.line_protocol.naming import Naming
from services.collect_agent.line_protocol.table import SpanTable
from services.common.errors import SensorNameError

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]

_SPECIAL = (b"\\", b"\t", b"\x00")
MAX_SPAN = 8 * num.MAX_WORDS - 8
"""Longest key + first field (or field key) looked up; longer lines take the reference path."""
MAX_SENSORS = 1 << 18
"""Sensors remembered; past this every table starts again, so memory stays bounded
(at most ~100 MB with keys of the longest kind looked up, ~40 MB with usual ones)."""


@dataclass(slots=True)
class Fast:
    """What the fast path made of a body."""

    sensors: list[str] = field(default_factory=list)
    timestamps_ns: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    values: F64 = field(default_factory=lambda: np.zeros(0, np.float64))
    line_of: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    """Line number of each reading."""
    lines: int = 0
    """Lines parsed here."""
    strings: int = 0
    """String fields of those lines (no reading)."""
    rest: list[tuple[int, int, int]] = field(default_factory=list)
    """(line number, start, end) of the lines left to the reference parser."""


class _Names:
    """Per id of one table: the sensor's name (if the fast path may use it) and its key id."""

    def __init__(self) -> None:
        self.names = np.empty(1024, dtype=object)
        self.ok = np.zeros(1024, bool)
        self.key = np.full(1024, -1, np.int64)

    def ensure(self, size: int) -> None:
        if size <= self.names.shape[0]:
            return
        grow = max(size, 2 * self.names.shape[0], 1024)
        names = np.empty(grow, dtype=object)
        names[: self.names.shape[0]] = self.names
        ok = np.zeros(grow, bool)
        ok[: self.ok.shape[0]] = self.ok
        key = np.full(grow, -1, np.int64)
        key[: self.key.shape[0]] = self.key
        self.names, self.ok, self.key = names, ok, key


class FastParser:
    """Parses bodies; remembers the series and fields it has named (module docstring)."""

    def __init__(self, naming: Naming, max_sensors: int = MAX_SENSORS) -> None:
        self.naming = naming
        self.max_sensors = max_sensors
        self._keys = SpanTable()
        self._firsts = SpanTable()
        self._fields = SpanTable()
        self.clear()

    def clear(self) -> None:
        for t in (self._keys, self._firsts, self._fields):
            t.clear()
        self._heads: list[str | None] = []
        self._head_ok = np.zeros(0, bool)
        self._first_names = _Names()
        """By id in ``_firsts`` (key and first field)."""
        self._field_names = _Names()
        """By id in ``_fields`` (key id and a further field)."""

    # ------------------------------------------------------------------ a body
    def parse(self, body: bytes, scale: int, default_ns: int) -> Fast:
        out = Fast()
        n = len(body)
        if n == 0:
            return out
        if len(self._firsts) + len(self._fields) > self.max_sensors:
            self.clear()
        buf = num.padded(body)
        raw = buf[num.PAD : num.PAD + n]
        nl = np.flatnonzero(raw == 0x0A)
        starts = np.concatenate(([0], nl + 1))
        ends = np.concatenate((nl, [n]))
        first = buf[starts + num.PAD]  # 0 for the empty segment after a final newline
        candidate = (starts < ends) & (first != 0x23)  # '#': a comment
        seps, codes, seg = separators(buf, num.PAD, n)
        special = np.zeros(starts.shape[0], bool)
        if any(s in body for s in _SPECIAL):
            at = np.flatnonzero((raw == 0x5C) | (raw == 0x09) | (raw == 0x00))
            special[np.searchsorted(starts, at, "right") - 1] = True
        text = np.zeros(seps.shape[0], bool)  # separators inside quoted string fields
        if b'"' in body:
            q = np.flatnonzero(raw == 0x22)
            qseg = np.searchsorted(starts, q, "right") - 1
            bad, text = quotes.check(buf, num.PAD, starts, q, qseg, seps, codes, seg)
            special |= bad
        taken = np.zeros(starts.shape[0], bool)
        if special.any():
            self._runs(body, starts, np.flatnonzero(special), taken, out)
        # a leading space: the reference skips whitespace (and whitespace-only lines)
        plain = candidate & ~taken & (first != 0x20)
        punt = candidate & ~taken & ~plain
        keep = plain[seg] & ~text
        if not keep.all():
            seps, codes, seg = seps[keep], codes[keep], seg[keep]
        if seps.shape[0]:
            lay = layout(starts, seps, codes, seg)
            punt[lay.bad] = True
            if lay.lines.shape[0]:
                self._convert(body, buf, lay, scale, default_ns, punt, out)
        out.lines = int((plain & ~punt).sum())
        for s in np.flatnonzero(punt).tolist():
            a, e = scan.skip_whitespace(body, int(starts[s])), int(ends[s])
            if a < e and body[a] != 0x23:  # not whitespace only, not a comment
                out.rest.append((s + 1, a, e))
        out.rest.sort()
        return out

    def _runs(self, body: bytes, starts: I64, segs: I64, taken: Mask, out: Fast) -> None:
        """Lines with a backslash, tab, NUL or a quote the fast path cannot pair go to the
        reference, with the lines they swallow."""
        until = -1
        for seg in segs.tolist():
            s = int(starts[seg])
            if s <= until:
                continue
            end = scan.line_end(body, s)
            taken[seg : int(np.searchsorted(starts, end, "right"))] = True
            until = end
            first = scan.skip_whitespace(body, s)
            if first < end and body[first] != 0x23:
                stop = end - 1 if body[end - 1] == 0x0A else end
                out.rest.append((seg + 1, first, stop))

    def _convert(
        self, body: bytes, buf: U8, lay: Layout, scale: int, default_ns: int, punt: Mask, out: Fast
    ) -> None:
        bad = np.zeros(lay.lines.shape[0], bool)
        names = self._sensor_names(body, buf, lay, bad)
        values, good, string = _values(buf, lay.v_start, lay.v_len)
        bad[lay.f_line[~good]] = True
        ts = np.full(lay.lines.shape[0], default_ns, np.int64)
        if lay.t_line.shape[0]:
            stamp, ok = _stamps(buf, lay.t_start, lay.t_len)
            ok &= stamp <= np.uint64(scan.MAX_NS // scale)
            ts[lay.t_line] = stamp.astype(np.int64) * scale
            bad[lay.t_line[~ok]] = True
        f_line = lay.f_line
        if bad.any() or string is not None:
            punt[lay.lines[bad]] = True
            keep = ~bad[f_line]
            if string is not None:
                out.strings = int((string & keep).sum())
                keep &= ~string
            f_line, names, values = f_line[keep], names[keep], values[keep]
        out.sensors = names.tolist()
        out.timestamps_ns = ts[f_line]
        out.values = values
        out.line_of = lay.lines[f_line] + 1

    # ------------------------------------------------------------------ naming
    def _sensor_names(
        self, body: bytes, buf: U8, lay: Layout, bad: Mask
    ) -> npt.NDArray[np.object_]:
        """The sensor name of each field; its line marked bad where the fast path has none."""
        single = lay.f_line.shape[0] == lay.lines.shape[0]  # one field per line
        first = np.arange(lay.f_line.shape[0]) if single else np.flatnonzero(lay.f_first)
        fl = first if single else lay.f_line[first]
        start = lay.key_start[fl]
        span = lay.key_len[fl] + 1 + lay.fk_len[first]  # "measurement,tags field"
        tid = self._ids(self._firsts, self._first_names, buf, start, span, body, lay, first, fl)
        fine = tid >= 0
        fine[fine] = self._first_names.ok[tid[fine]]
        if single:
            bad[fl[~fine]] = True
            return self._first_names.names[np.where(fine, tid, 0)]
        names = np.empty(lay.f_line.shape[0], dtype=object)
        names[first] = self._first_names.names[np.where(fine, tid, 0)]
        ok = np.zeros(lay.f_line.shape[0], bool)
        ok[first] = fine
        line_key = np.full(lay.lines.shape[0], -1, np.int64)
        line_key[fl[tid >= 0]] = self._first_names.key[tid[tid >= 0]]
        rest = np.flatnonzero(~lay.f_first)
        kid = line_key[lay.f_line[rest]]
        rows, span, fits = self._rows(buf, lay.fk_start[rest], lay.fk_len[rest])
        both = np.empty((rows.shape[0], rows.shape[1] + 1), np.uint64)
        both[:, 0] = kid.astype(np.uint64)
        both[:, 1:] = rows
        rid = self._fields.find(both, span + 8)
        miss = np.flatnonzero((rid < 0) & fits & (kid >= 0))
        if miss.shape[0]:
            got = self._fields.insert(both[miss], span[miss] + 8)
            self._name(self._field_names, got, kid[miss], body, lay, rest[miss])
            rid[miss] = got
        rid[~fits | (kid < 0)] = -1
        fine = rid >= 0
        fine[fine] = self._field_names.ok[rid[fine]]
        names[rest] = self._field_names.names[np.where(fine, rid, 0)]
        ok[rest] = fine
        bad[lay.f_line[~ok]] = True
        return names

    @staticmethod
    def _rows(buf: U8, start: I64, span: I64) -> tuple[npt.NDArray[np.uint64], I64, Mask]:
        fits = span <= MAX_SPAN
        span = np.where(fits, span, 0)
        words = (int(span.max(initial=0)) + 7) // 8 or 1
        return num.rows(buf, start, span, words), span, fits

    def _ids(
        self,
        table: SpanTable,
        names: _Names,
        buf: U8,
        start: I64,
        span: I64,
        body: bytes,
        lay: Layout,
        fields: I64,
        lines: I64,
    ) -> I64:
        """Ids in ``table`` of key + first field spans, named the first time (-1: none)."""
        rows, span, fits = self._rows(buf, start, span)
        tid = table.find(rows, span)
        miss = np.flatnonzero((tid < 0) & fits)
        if miss.shape[0]:
            kid = self._key_ids(body, buf, lay, lines[miss])
            new = np.full(miss.shape[0], -1, np.int64)
            has = kid >= 0
            if has.any():
                new[has] = table.insert(rows[miss[has]], span[miss[has]])
                self._name(names, new[has], kid[has], body, lay, fields[miss[has]])
            tid[miss] = new
        tid[~fits] = -1
        return tid

    def _key_ids(self, body: bytes, buf: U8, lay: Layout, lines: I64) -> I64:
        """Key id (its head named the first time) of each of ``lines``; -1 where none."""
        rows, span, fits = self._rows(buf, lay.key_start[lines], lay.key_len[lines])
        kid = self._keys.find(rows, span)
        miss = np.flatnonzero((kid < 0) & fits)
        if miss.shape[0]:
            kid[miss] = self._keys.insert(rows[miss], span[miss])
            fresh, at = np.unique(kid[miss], return_index=True)
            have = len(self._heads)
            heads: list[str | None] = [None] * max(int(fresh.max()) + 1 - have, 0)
            for i, row in zip(fresh.tolist(), miss[at].tolist(), strict=True):
                if i >= have:
                    s = int(lay.key_start[lines[row]])
                    heads[i - have] = self._head(body[s : s + int(span[row])])
            self._heads.extend(heads)
            self._head_ok = np.concatenate((self._head_ok, [h is not None for h in heads]))
        kid[~fits] = -1
        known = kid >= 0
        known[known] = self._head_ok[kid[known]]
        return np.where(known, kid, -1)

    def _head(self, key: bytes) -> str | None:
        """The name head of a plain series key; None for one the reference must refuse."""
        measurement, *tags = key.split(b",")
        pairs = [t.split(b"=", 1) for t in tags]
        tag_keys = [k for k, _ in pairs]
        if len(set(tag_keys)) != len(tag_keys) or b"time" in tag_keys:
            return None
        return self.naming.head(_text(measurement), [_text(v) for _, v in pairs])

    def _name(
        self, names: _Names, ids: I64, kid: I64, body: bytes, lay: Layout, fields: I64
    ) -> None:
        """Name the sensors of new table ids (-1: a hash collision, left to the reference)."""
        valid = ids >= 0
        if not valid.any():
            return
        names.ensure(int(ids.max()) + 1)
        fresh, at = np.unique(ids[valid], return_index=True)
        rows = np.flatnonzero(valid)[at]
        for i, row in zip(fresh.tolist(), rows.tolist(), strict=True):
            k = int(kid[row])
            names.key[i] = k
            s = int(lay.fk_start[fields[row]])
            field = body[s : s + int(lay.fk_len[fields[row]])]
            head = self._heads[k]
            if field == b"time" or head is None:
                continue  # InfluxDB skips a field named time: the reference does that
            try:
                names.names[i] = self.naming.sensor(head, _text(field))
                names.ok[i] = True
            except SensorNameError:
                pass


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _values(buf: U8, start: I64, length: I64) -> tuple[F64, Mask, Mask | None]:
    """Each field's value, False where the fast path leaves it to the reference, and
    which fields are strings (None: none is)."""
    first = buf[start + num.PAD]
    last = buf[start + length - 1 + num.PAD]
    numeric = ((first >= 0x30) & (first <= 0x39)) | (first == 0x2D) | (first == 0x2E)
    integer = numeric & ((last == 0x69) | (last == 0x75))  # i, u
    if not integer.any() and numeric.all():
        return (*num.floats(buf, start, length), None)
    string = (first == 0x22) & (last == 0x22) & (length >= 2)  # quotes paired by quotes.check
    real = numeric & ~integer
    boolean = (first == 0x74) | (first == 0x66) | (first == 0x54) | (first == 0x46)
    values = np.zeros(start.shape[0], np.float64)
    good = np.zeros(start.shape[0], bool)
    for which, conv, cut in (
        (real, num.floats, 0),
        (integer, num.integers, 1),
        (boolean, num.booleans, 0),
    ):
        if which.any():
            v, ok = conv(buf, start[which], length[which] - cut)
            values[which] = v
            good[which] = ok
    # 'u' must not follow a sign: leave "-5u" to the reference
    good &= ~(integer & (last == 0x75) & (first == 0x2D))
    good |= string
    return values, good, string if string.any() else None


def _stamps(buf: U8, start: I64, length: I64) -> tuple[npt.NDArray[np.uint64], Mask]:
    """Timestamps; a run of equal ones (lines sampled together) is converted once."""
    m, inside = num.right(buf, start, length)
    words = (m * inside).view(np.uint64)
    if bool((words == words[0]).all()):  # one instant for the whole body
        value, ok = num.unsigned_matrix(m[:1], inside[:1], length[:1])
        return np.full(start.shape, value[0]), np.full(start.shape, ok[0])
    change = np.ones(start.shape[0], bool)
    change[1:] = (words[1:] != words[:-1]).any(axis=1)
    if change.all():
        return num.unsigned_matrix(m, inside, length)
    heads = np.flatnonzero(change)
    value, ok = num.unsigned_matrix(m[heads], inside[heads], length[heads])
    run = np.cumsum(change) - 1
    return value[run], ok[run]
