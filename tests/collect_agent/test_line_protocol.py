"""InfluxDB line protocol parsing: names, value types, escapes, precision, bad lines."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collect_agent.line_protocol import LineProtocol, LineProtocolError, ParseResult
from services.common import names

NOW = 1_764_500_000_000_000_000


def parse(body: str, precision: str = "ns", **prefixes: str) -> ParseResult:
    return LineProtocol(prefixes, "/influx").parse(body, precision, NOW)


def rows(body: str, precision: str = "ns", **prefixes: str) -> list[tuple[str, int, float]]:
    res = parse(body, precision, **prefixes)
    assert not res.errors, res.errors
    b = res.batch
    return list(zip(b.sensors, b.timestamps_ns.tolist(), b.values.tolist(), strict=True))


def test_tags_and_fields_become_sensor_levels() -> None:
    assert rows("cpu,host=n1,core=0 user=1.5,idle=97i 1764500000000000001") == [
        ("/influx/cpu/n1/0/user", NOW + 1, 1.5),
        ("/influx/cpu/n1/0/idle", NOW + 1, 97.0),
    ]


def test_value_types_and_missing_timestamp() -> None:
    got = rows('m a=1u,b=-3i,c=t,d=FALSE,e=1e3,s="text, with = and space"')
    assert got == [
        ("/influx/m/a", NOW, 1.0),
        ("/influx/m/b", NOW, -3.0),
        ("/influx/m/c", NOW, 1.0),
        ("/influx/m/d", NOW, 0.0),
        ("/influx/m/e", NOW, 1000.0),
    ]
    assert parse('m s="x"').string_fields == 1


@pytest.mark.parametrize(
    ("precision", "stamp", "ns"),
    [("s", "1764500000", NOW), ("ms", "1764500000000", NOW), ("u", "1764500000000000", NOW),
     ("n", "1764500000000000000", NOW), ("h", "490138", 490138 * 3_600_000_000_000)],
)  # fmt: skip
def test_precision(precision: str, stamp: str, ns: int) -> None:
    assert rows(f"m v=1 {stamp}", precision) == [("/influx/m/v", ns, 1.0)]


def test_escapes_and_slashes_in_tag_values_stay_one_level() -> None:
    assert rows(r"disk\ io,path=/dev/sda1,x=a\,b used\ pct=5") == [
        ("/influx/disk io/_dev_sda1/a,b/used pct", NOW, 5.0)
    ]


def test_measurement_prefix_mapping_comments_and_blank_lines() -> None:
    body = "# comment\n\nipmi,node=n7 power=250 1764500000000000000\n"
    assert rows(body, ipmi="/dc/row0") == [("/dc/row0/n7/power", NOW, 250.0)]


def test_bad_lines_are_reported_and_good_ones_kept() -> None:
    body = "\n".join(
        [
            "ok v=1",
            "nofields",
            "m v=abc",
            "m v=1 12x",
            "m,badtag v=1",
            "m v=1 99999999999999999999",
            "m v=1 ²",
            "m v=²i",
            "m v=1 -5",
            "ok w=2",
        ]
    )
    res = parse(body)
    assert res.lines == 10
    assert [(n, r) for n, r, _ in res.errors] == [
        (2, "bad_line"),
        (3, "bad_field"),
        (4, "bad_timestamp"),
        (5, "bad_line"),
        (6, "bad_timestamp"),
        (7, "bad_timestamp"),
        (8, "bad_field"),
        (9, "bad_timestamp"),
    ]
    assert list(res.batch.sensors) == ["/influx/ok/v", "/influx/ok/w"]


def test_a_quoted_string_runs_on_over_newlines_as_in_influxdb() -> None:
    res = parse('ok v=1\nm s="two\nlines",v=2 5\nm v="open\nok w=2\nok x=3')
    assert [(n, r) for n, r, _ in res.errors] == [(4, "bad_line")], "swallows to the end"
    assert res.batch.sensors == ["/influx/ok/v", "/influx/m/v"] and res.string_fields == 1
    assert res.batch.timestamps_ns.tolist() == [NOW, 5]


def test_a_line_is_all_or_nothing() -> None:
    res = parse("m a=1,b=oops")
    assert len(res.batch) == 0 and res.errors[0][1] == "bad_field"


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(LineProtocolError, match="precision 'x'"):
        parse("m v=1", "x")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.text(alphabet=' ,=\\"\n#abcxyz0123456789².-+/iutfTFé\x00', max_size=160),
    precision=st.sampled_from(["ns", "u", "ms", "s", "h"]),
)
def test_fuzz_any_body_parses_into_valid_names_or_reported_errors(
    body: str, precision: str
) -> None:
    res = parse(body, precision)
    for name in res.batch.sensors:
        assert names.validate(name) == name
    assert all(reason and msg for _, reason, msg in res.errors)
    assert len(res.errors) <= res.lines
