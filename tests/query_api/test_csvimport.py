"""Parsing CSV for import: times that numpy's bulk path cannot hold take the checked path."""

from __future__ import annotations

import pytest

from services.common import times
from services.query_api.csvimport import CsvError, parse


def _one(time_text: str) -> int:
    batch = parse(f"Sensor,Time,Value\n/a/p,{time_text},1.5\n")
    assert batch.sensors == ["/a/p"] and batch.values.tolist() == [1.5]
    return int(batch.timestamps_ns[0])


def test_iso_times_in_bulk_are_exact() -> None:
    batch = parse(
        "Sensor,Time,Value\n"
        "/a/p,2026-05-28T20:26:40.000000001Z,1\n"
        "/a/p,1678-01-01T00:00:00Z,2\n"
        "/a/p,2261-12-31T23:59:59.999999999Z,3\n"
    )
    assert batch.timestamps_ns.tolist() == [
        times.parse_time(t)
        for t in (
            "2026-05-28T20:26:40.000000001Z",
            "1678-01-01T00:00:00Z",
            "2261-12-31T23:59:59.999999999Z",
        )
    ]


def test_offsets_are_converted_to_utc() -> None:
    assert _one("2026-11-30T12:00:00+01:00") == times.parse_time("2026-11-30T11:00:00Z")
    assert _one("2026-11-30T12:00:00-02:30") == times.parse_time("2026-11-30T14:30:00Z")


@pytest.mark.parametrize(
    "text", ["3000-01-01T00:00:00Z", "1600-01-01T00:00:00Z", "99999999999999999999"]
)
def test_times_int64_ns_cannot_hold_are_rejected_with_their_line(text: str) -> None:
    body = f"Sensor,Time,Value\n/a/p,2026-01-01T00:00:00Z,1\n/a/p,{text},2\n"
    with pytest.raises(CsvError, match=rf"line 3: time '{text}' lies outside 1677-09-21"):
        parse(body)


def test_any_line_ending_and_a_bad_row_are_csv_errors_not_crashes() -> None:
    body = "Sensor,Time,Value\r/a/p,2026-01-01T00:00:00Z,1\r\n/a/p,2026-01-01T00:00:01Z,2\n"
    assert parse(body).values.tolist() == [1.0, 2.0]
    with pytest.raises(CsvError, match=r"^line 2: expected a header"):
        parse("\r0")
    with pytest.raises(CsvError, match=r"^line 2: .*field larger than field limit"):
        parse("Sensor,Time,Value\n/a/p,now," + "1" * 200_000 + "\n")
