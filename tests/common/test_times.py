"""DCDB time syntax."""

from __future__ import annotations

import re

import pytest

from services.common.errors import TimeSpecError
from services.common.times import (
    format_iso,
    format_iso_many,
    format_iso_short,
    parse_duration_ns,
    parse_time,
)

NOW = 1_764_500_000_000_000_000  # 2025-11-30T10:53:20Z


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("now", NOW),
        ("now-5m", NOW - 300 * 10**9),
        ("now - 2h", NOW - 7200 * 10**9),
        ("now-1d", NOW - 86400 * 10**9),
        ("now-100ms", NOW - 10**8),
        ("now+30s", NOW + 30 * 10**9),
        ("now-2y", NOW - 2 * 365 * 86400 * 10**9),  # a year is 365 days, as Prometheus counts
        ("now-90d", NOW - 90 * 86400 * 10**9),
        ("now-90days", NOW - 90 * 86400 * 10**9),
        ("now-1 week", NOW - 7 * 86400 * 10**9),
        ("now-1h30m", NOW - 5400 * 10**9),
        ("now - 2 hours, 15 minutes", NOW - 8100 * 10**9),
        ("1764500000", NOW),  # seconds
        ("1764500000000", NOW),  # ms
        ("1764500000000000", NOW),  # µs
        ("1764500000000000000", NOW),  # ns
        ("1764500000.25", NOW + 250_000_000),  # fractional seconds keep their fraction
        ("1764500000000.5", NOW + 500_000),  # fractional ms
        ("2025-11-30T10:53:20Z", NOW),
        ("2025-11-30 10:53:20", NOW),
        ("2025-11-30 10:53:20.25", NOW + 250_000_000),
        ("2025-11-30T11:53:20.000000001+01:00", NOW + 1),
    ],
)
def test_parse_time(spec: str, expected: int) -> None:
    assert parse_time(spec, now=NOW) == expected


@pytest.mark.parametrize("spec", ["", "yesterday", "now-5x", "2025-13-01", "-5"])
def test_bad_times_explain_the_syntax(spec: str) -> None:
    with pytest.raises(TimeSpecError):
        parse_time(spec, now=NOW)


def test_iso_formatting_keeps_nanoseconds() -> None:
    assert format_iso(NOW + 123) == "2025-11-30T10:53:20.000000123Z"
    import numpy as np

    assert format_iso_many(np.array([NOW, NOW + 1], np.int64)) == [
        format_iso(NOW),
        format_iso(NOW + 1),
    ]
    assert parse_time(format_iso(NOW + 987654321)) == NOW + 987654321


def test_durations() -> None:
    assert parse_duration_ns("5m") == 300 * 10**9
    assert parse_duration_ns("100ms") == 10**8
    assert parse_duration_ns(2) == 2 * 10**9
    assert parse_duration_ns("2") == 2 * 10**9
    assert parse_duration_ns("90days") == 90 * 86400 * 10**9
    assert parse_duration_ns("1.5 years") == round(1.5 * 365 * 86400) * 10**9
    assert parse_duration_ns("1m30s") == 90 * 10**9
    with pytest.raises(TimeSpecError, match="not understood"):
        parse_duration_ns("soon")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("now-5x", "unknown unit 'x'; expected ns, us, ms, s, m(in), h, d(ays), w(eeks), y(ears)"),
        ("now-2months", "a month is not a unit: say 30d"),
        ("now-5m3", "unknown unit '(none)'"),
    ],
)
def test_unknown_units_say_which_exist(spec: str, message: str) -> None:
    with pytest.raises(TimeSpecError, match=re.escape(message)):
        parse_time(spec, now=NOW)


def test_short_iso_for_messages() -> None:
    assert format_iso_short(NOW) == "2025-11-30T10:53:20Z"
    assert format_iso_short(NOW + 250_000_000) == "2025-11-30T10:53:20.25Z"
    assert format_iso_short(NOW + 1) == "2025-11-30T10:53:20.000000001Z"
