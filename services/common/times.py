"""DCDB's time syntax and Kelvin's time formatting.

Accepted everywhere a time is asked for (CLI, query API, calibration):
``now``, ``now-5m`` / ``now-2h`` / ``now-1d`` / ``now-30s`` / ``now-100ms``,
ISO 8601 (``2026-11-30T12:00:00Z``, ``2026-11-30 12:00:00.5``; naive = UTC), or an
integer epoch whose unit (s, ms, µs, ns) is guessed from its magnitude.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import numpy as np

from services.common.errors import PayloadError, TimeSpecError
from services.common.readings import Int64Array

NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "min": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
    "w": 604_800_000_000_000,
}
_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|min|m|h|d|w))?$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|min|m|h|d|w)?$")


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
        delta = round(float(m.group(2)) * NS_PER_UNIT[m.group(3)])
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
            f"time {spec!r} is not understood; expected now, now-5m, now-2h, "
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
    """``5m``, ``100ms``, ``1.5h``; a bare number is seconds."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return round(spec * 1_000_000_000)
    m = _DURATION.match(str(spec).strip().lower())
    if not m:
        raise TimeSpecError(f"duration {spec!r} is not understood; expected e.g. 10s, 5m, 100ms")
    return round(float(m.group(1)) * NS_PER_UNIT[m.group(2) or "s"])


def format_iso(ts_ns: int) -> str:
    """ns epoch -> ``2026-11-30T12:00:00.123456789Z`` (full ns precision)."""
    sec, frac = divmod(int(ts_ns), 1_000_000_000)
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def format_iso_many(ts_ns: Int64Array) -> list[str]:
    """Vectorised :func:`format_iso` for CSV output."""
    if ts_ns.shape[0] == 0:
        return []
    sec = (ts_ns // 1_000_000_000).astype("datetime64[s]")
    frac = ts_ns % 1_000_000_000
    base = np.datetime_as_string(sec, unit="s")
    return [f"{b}.{f:09d}Z" for b, f in zip(base.tolist(), frac.tolist(), strict=True)]
