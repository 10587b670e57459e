"""DCDB's time syntax and Kelvin's time formatting.

Accepted everywhere a time is asked for (CLI, query API, calibration):
``now``, ``now-5m`` / ``now-2h`` / ``now-90d`` / ``now-90days`` / ``now-2y`` /
``now-1h30m`` / ``now-100ms``, ISO 8601 (``2026-11-30T12:00:00Z``,
``2026-11-30 12:00:00.5``; naive = UTC), or an integer epoch whose unit (s, ms,
µs, ns) is guessed from its magnitude. Durations take the same units, singular
or plural, spelt out or short; a year is 365 days (as Prometheus counts), a
month is not a unit (its length varies: say ``30d``).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import numpy as np

from services.common.errors import PayloadError, TimeSpecError
from services.common.readings import Int64Array

_S = 1_000_000_000
NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": _S,
    "m": 60 * _S,
    "min": 60 * _S,
    "h": 3_600 * _S,
    "d": 86_400 * _S,
    "w": 604_800 * _S,
    "y": 365 * 86_400 * _S,
}
_SPELT = {
    "ns": ("nsec", "nanosecond", "nanoseconds"),
    "us": ("usec", "microsecond", "microseconds"),
    "ms": ("msec", "millisecond", "milliseconds"),
    "s": ("sec", "secs", "second", "seconds"),
    "min": ("mins", "minute", "minutes"),
    "h": ("hr", "hrs", "hour", "hours"),
    "d": ("day", "days"),
    "w": ("wk", "wks", "week", "weeks"),
    "y": ("yr", "yrs", "year", "years"),
}
_UNIT = {**{u: u for u in NS_PER_UNIT}, **{a: u for u, names in _SPELT.items() for a in names}}
UNITS_HELP = "ns, us, ms, s, m(in), h, d(ays), w(eeks), y(ears)"
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zµ]*)")
_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(.+))?$")


def now_ns() -> int:
    return time.time_ns()


def parse_time(spec: str | int | float, now: int | None = None) -> int:
    """Parse a DCDB time argument into ns since the epoch (UTC)."""
    if isinstance(spec, bool):
        raise TimeSpecError(f"time {spec!r} is not a time")
    if isinstance(spec, int | float):
        return _epoch(spec)
    text = spec.strip()
    if not text:
        raise TimeSpecError("empty time; expected now, now-5m, ISO 8601 or an epoch")
    low = text.lower()
    m = _RELATIVE.match(low)
    if m:
        base = now_ns() if now is None else now
        if m.group(1) is None:
            return base
        delta = _span_ns(m.group(2), spec, default_unit=None)
        return base - delta if m.group(1) == "-" else base + delta
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return _epoch(float(text) if "." in text else int(text))
    iso = text.replace(" ", "T", 1) if re.match(r"^\d{4}-\d\d-\d\d \d", text) else text
    if iso.endswith(("Z", "z")):
        iso = iso[:-1] + "+00:00"
    frac_ns = 0
    fm = re.search(r"\.(\d+)", iso)
    if fm:
        digits = fm.group(1)
        frac_ns = int((digits + "000000000")[:9])
        iso = iso[: fm.start()] + iso[fm.end() :]
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError as exc:
        raise TimeSpecError(
            f"time {spec!r} is not understood; expected now, now-5m, now-90d, now-2y, "
            "'YYYY-MM-DD HH:MM:SS[.f]', ISO 8601 or an integer epoch (s, ms, us or ns)"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * 1_000_000_000 + frac_ns


def _epoch(value: int | float) -> int:
    from services.common.codec import epoch_to_ns

    try:
        return epoch_to_ns(value)
    except PayloadError as exc:
        raise TimeSpecError(str(exc)) from exc


def parse_duration_ns(spec: str | int | float) -> int:
    """``5m``, ``100ms``, ``1.5h``, ``90days``, ``2y``, ``1h30m``; a bare number is seconds."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return round(spec * 1_000_000_000)
    return _span_ns(str(spec).strip().lower(), spec, default_unit="s")


def _span_ns(text: str, spec: object, default_unit: str | None) -> int:
    """``90d``, ``1h 30m``, ``2 years``: one or more number-unit parts, summed."""
    what = "time" if default_unit is None else "duration"
    total, pos = 0.0, 0
    text = text.strip()
    while pos < len(text):
        m = _PART.match(text, pos)
        if not m:
            raise TimeSpecError(
                f"{what} {spec!r} is not understood; expected e.g. now-5m, now-90d, now-2y, "
                f"or a duration like 10s, 1h30m (units {UNITS_HELP})"
            )
        unit = m.group(2) or default_unit
        if unit is None or unit not in _UNIT:
            raise TimeSpecError(
                f"{what} {spec!r}: unknown unit {m.group(2) or '(none)'!r}; expected {UNITS_HELP}"
                + (
                    " (a month is not a unit: say 30d)"
                    if (m.group(2) or "").startswith("mo")
                    else ""
                )
            )
        total += float(m.group(1)) * NS_PER_UNIT[_UNIT[unit]]
        pos = m.end()
        while pos < len(text) and text[pos] in " ,":
            pos += 1
    if pos == 0:
        raise TimeSpecError(f"empty {what} in {spec!r}")
    return round(total)


def format_iso(ts_ns: int) -> str:
    """ns epoch -> ``2026-11-30T12:00:00.123456789Z`` (full ns precision)."""
    sec, frac = divmod(int(ts_ns), 1_000_000_000)
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def format_iso_short(ts_ns: int) -> str:
    """ns epoch -> ISO 8601 for messages: ``2026-11-30T12:00:00Z``, ``...:00.25Z`` (no zeros)."""
    text = format_iso(ts_ns)
    return text.replace(".000000000Z", "Z") if ".000000000" in text else text[:-1].rstrip("0") + "Z"


def format_iso_many(ts_ns: Int64Array) -> list[str]:
    """Vectorised :func:`format_iso` for CSV output."""
    if ts_ns.shape[0] == 0:
        return []
    sec = (ts_ns // 1_000_000_000).astype("datetime64[s]")
    frac = ts_ns % 1_000_000_000
    base = np.datetime_as_string(sec, unit="s")
    return [f"{b}.{f:09d}Z" for b, f in zip(base.tolist(), frac.tolist(), strict=True)]
