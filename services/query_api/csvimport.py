"""Reading CSV into readings, for ``POST /api/v1/import`` and ``kelvin csvimport``.

Two layouts:

* **long**, as ``kelvin query`` and DCDB's ``dcdbquery`` write it: a header
  ``Sensor,Time,<anything>`` then ``sensor,time,value`` rows (headers repeated
  between sensor blocks are skipped);
* **wide**, as DCDB's ``dcdbcsvimport`` reads it: a header ``Time,<sensor>,<sensor>...``
  then one row per time with a value per sensor.

Times in any DCDB syntax (ISO 8601 with ns, integer epochs). An empty value is
stored as a missing reading (NaN), so a query -> import round trip is exact.
Any bad row rejects the whole import (nothing half-written) with the line number.
"""

from __future__ import annotations

import csv
import io
import math
import re

import numpy as np

from services.common import names, times
from services.common.errors import KelvinError, TimeSpecError
from services.common.readings import Batch, Int64Array, Series


class CsvError(KelvinError, ValueError):
    """A CSV that cannot be imported; ``reason`` labels the reject counter."""

    reason = "bad_csv"


class PayloadTooLarge(KelvinError):
    """A request body beyond the configured limit."""

    reason = "too_large"
    http_status = 413


_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1


def _bulk_iso(t: str) -> bool:
    """An ISO time numpy parses exactly: UTC, and a year numpy's ns can hold (it wraps
    other years around silently)."""
    return len(t) > 10 and t[10] == "T" and "1678" <= t[:4] <= "2261" and not _OFFSET(t, 11)


_OFFSET = re.compile(r"[-+]").search


def _times(texts: list[str], lines: list[int]) -> Int64Array:
    """Parse times; ISO 8601 in bulk through numpy, everything else one by one."""
    if texts and all(_bulk_iso(t) for t in texts):
        try:
            bare = [t[:-1] if t.endswith(("Z", "z")) else t for t in texts]
            return np.array(bare, dtype="datetime64[ns]").astype(np.int64)
        except ValueError:
            pass  # odd forms: the slow path names the bad line
    out = np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        try:
            ns = int(t) if t.isdigit() and len(t) >= 16 else times.parse_time(t)
        except TimeSpecError as exc:
            raise CsvError(f"line {lines[i]}: {exc}") from None
        if not _MIN_NS <= ns <= _MAX_NS:
            raise CsvError(
                f"line {lines[i]}: time {t[:40]!r} lies outside 1677-09-21 .. 2262-04-11, "
                "the times int64 ns since the epoch can hold"
            )
        out[i] = ns
    return out


def _value(text: str, line: int) -> float:
    if text.strip() == "":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise CsvError(f"line {line}: value {text[:40]!r} is not a number") from None


def parse(text: str, prefix: str | None = None) -> Batch:
    """The readings in a CSV document (see module docstring)."""
    reader = csv.reader(io.StringIO(text, newline=""))  # the csv module reads \r, \r\n, \n
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a field beyond csv.field_size_limit()
        raise CsvError(f"line {reader.line_num}: {exc}") from None
    numbered = [(i + 1, r) for i, r in enumerate(rows) if r and any(c.strip() for c in r)]
    if not numbered:
        return Batch.empty()
    first, header = numbered[0]
    head = [h.strip() for h in header]
    if len(head) >= 3 and head[0].lower() == "sensor" and head[1].lower() == "time":
        return _long(numbered[1:], prefix)
    if len(head) >= 2 and not _looks_like_time(head[0]):
        return _wide(head, numbered[1:], prefix)
    raise CsvError(
        f"line {first}: expected a header 'Sensor,Time,Value' (long layout) or "
        f"'Time,<sensor>,...' (wide layout), got {','.join(head)[:80]!r}"
    )


def _looks_like_time(text: str) -> bool:
    return text[:1].isdigit()


def _name(raw: str, prefix: str | None, line: int) -> str:
    name = names.join(prefix, raw) if prefix else raw.strip()
    try:
        return names.validate(name)
    except KelvinError as exc:
        raise CsvError(f"line {line}: {exc}") from None


def _long(rows: list[tuple[int, list[str]]], prefix: str | None) -> Batch:
    sensors: dict[str, list[int]] = {}
    time_txt: list[str] = []
    values: list[float] = []
    lines: list[int] = []
    for line, row in rows:
        if (
            len(row) >= 2
            and row[0].strip().lower() == "sensor"
            and row[1].strip().lower() == "time"
        ):
            continue  # a header repeated between blocks
        if len(row) != 3:
            raise CsvError(f"line {line}: expected 3 fields sensor,time,value, got {len(row)}")
        sensors.setdefault(row[0], []).append(len(values))
        time_txt.append(row[1].strip())
        values.append(_value(row[2], line))
        lines.append(line)
    ts = _times(time_txt, lines)
    vs = np.asarray(values, dtype=np.float64)
    series = []
    for raw, idx in sensors.items():
        name = _name(raw, prefix, lines[idx[0]])
        sel = np.asarray(idx, dtype=np.int64)
        series.append(Series(name, ts[sel], vs[sel]))
    return Batch.from_series(series)


def _wide(head: list[str], rows: list[tuple[int, list[str]]], prefix: str | None) -> Batch:
    names_ = [_name(h, prefix, 1) for h in head[1:]]
    time_txt = []
    lines = []
    cols: list[list[float]] = [[] for _ in names_]
    for line, row in rows:
        if len(row) != len(head):
            raise CsvError(
                f"line {line}: expected {len(head)} fields like the header, got {len(row)}"
            )
        time_txt.append(row[0].strip())
        lines.append(line)
        for c, cell in enumerate(row[1:]):
            cols[c].append(_value(cell, line))
    ts = _times(time_txt, lines)
    series = []
    for name, col in zip(names_, cols, strict=True):
        vs = np.asarray(col, dtype=np.float64)
        keep = ~np.isnan(vs)  # an empty cell in the wide layout means "no reading at this time"
        series.append(Series(name, ts[keep], vs[keep]))
    return Batch.from_series(series)
