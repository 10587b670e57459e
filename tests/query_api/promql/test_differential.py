"""The definition of done of Kelvin's PromQL: the same queries, a real Prometheus, equal answers.

Every query runs as a range query and as an instant query (GET and POST
alternate) on Prometheus 2.42 and on Kelvin over the same samples
(:mod:`.dataset`); status, error type, result type, label sets, timestamps and
values must agree. Values are compared exactly (NaN equals NaN) except where
Go's and C's libm may differ in the last bits (exp, log, trigonometry: a few ulp).
All requests go out concurrently once per session; each test compares one answer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.query_api.promql.dataset import T0_MS

S = T0_MS / 1000
RANGES = [
    {"start": f"{S + 300:.3f}", "end": f"{S + 7190:.3f}", "step": "60"},
    {"start": f"{S + 1000.25:.3f}", "end": f"{S + 3000.75:.3f}", "step": "17.5"},
]
TIMES = [f"{S + 1800:.3f}", f"{S + 2234.567:.3f}", f"{S + 7000:.3f}"]
ULP = 1e-14  # relative: functions whose libm result may differ in the last bits

NODE = ["node_power", "node_energy", "node_odd", "node_spiky", "node_fan_rpm", "node_flat",
        "node_delta_t", "node_inlet_temp"]  # fmt: skip
RANGE_FUNCS = ["rate", "increase", "delta", "irate", "idelta", "deriv", "changes", "resets",
               "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
               "count_over_time", "last_over_time", "stddev_over_time", "stdvar_over_time",
               "present_over_time", "absent_over_time"]  # fmt: skip
TRANSCENDENTAL = ["exp", "ln", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                  "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"]  # fmt: skip


def queries() -> list[tuple[str, float]]:
    q: list[tuple[str, float]] = []
    add = lambda text, tol=0.0: q.append((text, tol))  # noqa: E731
    # selectors and matchers
    for text in [
        "node_power", 'node_power{row="row0"}', 'node_power{row!="row0"}',
        'node_power{rack=~"rack.*", node!~"node1"}', '{__name__=~"node_power|row_power"}',
        '{__name__=~".+_power"}', 'node_power{sensor="/dc/row0/rack0/node0/power"}',
        "node_fan_rpm", "node_odd", "node_spiky", "dc_power", "row_power",
        '{node="node0", __name__!~"node_energy|node_inlet_temp"}', 'node_power{row=~"row(0|1)"}',
        'http_latency_seconds_bucket{le="+Inf"}', 'node_power{node=~"NODE0"}',
        'node_power{node=~"(?i)NODE0"}', 'node_power{row=~"row\\\\d"}', "nonexistent",
        "node_power offset 5m", "node_power offset 1h", "node_fan_rpm offset 10m",
        "node_power offset -5m", f"node_power @ {S + 3600:.3f}", f"node_power @ {S + 3600.5:.3f} offset 10m",
        "node_power @ start()", "node_power @ end()", "node_power[5m]", "node_odd[2m]",
        "node_power[1m] offset 30s", f"node_energy[10m] @ {S + 4000:.3f}",
    ]:  # fmt: skip
        add(text)
    # functions of range vectors
    for fn in RANGE_FUNCS:
        for sel in NODE[:6]:
            add(f"{fn}({sel}[5m])")
        add(f"{fn}(node_power[1m])")
        add(f"{fn}(node_energy[90s] offset 2m)")
    for text in [
        "rate(node_energy[10m])", "rate(http_latency_seconds_bucket[5m])",
        "quantile_over_time(0.5, node_power[10m])", "quantile_over_time(0.9, node_odd[5m])",
        "quantile_over_time(0, node_power[5m])", "quantile_over_time(1.5, node_power[5m])",
        "quantile_over_time(-1, node_power[5m])", "predict_linear(node_power[10m], 600)",
        "predict_linear(node_energy[15m], 3600)", "predict_linear(node_flat[10m], 60)",
        "holt_winters(node_power[10m], 0.5, 0.5)", "holt_winters(node_energy[10m], 0.1, 0.9)",
        "deriv(node_flat[10m])", "absent_over_time(nonexistent[5m])",
        'absent_over_time(nonexistent{job="x"}[5m])', "rate(node_energy[5m:1m])",
        "max_over_time(rate(node_energy[5m])[30m:1m])", "avg_over_time(node_power[10m:30s])",
        "sum_over_time(node_spiky[10m:])", f"max_over_time(node_power[10m:1m] @ {S + 5000:.3f})",
        "min_over_time(sum(node_power)[15m:2m] offset 5m)", "rate(node_power[2m:15s])",
        "count_over_time(node_fan_rpm[20m:1m])", "last_over_time(node_power[10m])",
        "avg_over_time(node_spiky[30m])", "sum_over_time(node_spiky[1h])",
        "stddev_over_time(node_spiky[30m])", "increase(node_energy[1h])",
        "irate(node_energy[5m])", "changes(node_inlet_temp[10m])", "resets(node_energy[1h])",
    ]:  # fmt: skip
        add(text)
    # functions of instant vectors
    for fn in ["abs", "ceil", "floor", "sqrt", "sgn", "rad", "deg"]:
        add(f"{fn}(node_delta_t)")
        add(f"{fn}(node_odd)")
    for fn in TRANSCENDENTAL:
        add(f"{fn}(node_delta_t / 10)", ULP)
        add(f"{fn}(node_odd / 20)", ULP)
    add("node_power atan2 100", ULP)
    add("node_delta_t atan2 node_delta_t", ULP)
    add("node_power ^ 0.5", ULP)
    add("node_inlet_temp ^ 1.7", ULP)
    for text in [
        "clamp(node_power, 205, 230)", "clamp(node_odd, 5, 1)", "clamp_max(node_odd, 12)",
        "clamp_min(node_power, 220)", "round(node_inlet_temp)", "round(node_inlet_temp, 0.25)",
        "round(node_odd, 3)", "timestamp(node_power)", "timestamp(node_fan_rpm offset 10m)",
        "timestamp(sum(node_power))", "sort(node_power)", "sort_desc(node_power)",
        "sort(node_odd)", "absent(nonexistent)", 'absent(nonexistent{job="a", x=~"y"})',
        "absent(node_power)", "scalar(dc_power)", "scalar(node_power)", "vector(1)",
        "vector(time())", "time()", "pi()", "hour()", "minute()", "day_of_week()",
        "day_of_month()", "day_of_year()", "days_in_month()", "month()", "year()",
        "hour(node_power * 1e6)", "year(timestamp(node_power))", "days_in_month(vector(1709251200))",
        'label_replace(node_power, "pos", "$1-$2", "sensor", "/dc/(row.)/(rack.)/.*")',
        'label_replace(node_power, "row", "", "row", ".*")',
        'label_replace(node_power, "x", "$1x", "node", "(node)(.*)")',
        'label_replace(node_power, "x", "${2}y", "node", "(node)(.*)")',
        'label_join(node_power, "where", "-", "row", "rack", "node")',
        'label_join(node_power, "node", "", "nothing")',
        "histogram_quantile(0.9, sum by (le) (rate(http_latency_seconds_bucket[5m])))",
        "histogram_quantile(0.5, sum by (le, instance) (rate(http_latency_seconds_bucket[10m])))",
        "histogram_quantile(0.99, sum without (sensor) (http_latency_seconds_bucket))",
        "histogram_quantile(0, sum by (le) (http_latency_seconds_bucket))",
        "histogram_quantile(1, sum by (le) (http_latency_seconds_bucket))",
        "histogram_quantile(1.5, sum by (le) (http_latency_seconds_bucket))",
        "histogram_quantile(0.9, rate(http_latency_seconds_bucket[5m]))",
        'histogram_quantile(0.9, sum by (le) (http_latency_seconds_bucket{le!="+Inf"}))',
    ]:  # fmt: skip
        add(text)
    # aggregations
    for agg in ["sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"]:
        add(f"{agg}(node_power)")
        add(f"{agg} by (row) (node_power)")
        add(f"{agg}(node_inlet_temp) without (sensor, node)")
        add(f"{agg} by (rack, row) (rate(node_energy[5m]))")
    for text in [
        "sum(node_odd)", "avg(node_odd)", "max(node_odd)", "min(node_odd)", "avg(node_spiky)",
        "sum by (le) (http_latency_seconds_bucket)", "topk(2, node_power)",
        "bottomk(2, node_power)", "topk by (row) (1, node_power)", "bottomk(3, node_inlet_temp) by (row)",
        "topk(0, node_power)", "topk(100, node_power)", "quantile(0.5, node_power)",
        "quantile by (row) (0.9, node_inlet_temp)", "quantile(1.2, node_power)",
        "quantile(-1, node_power)", 'count_values("value", node_flat)',
        'count_values by (row) ("v", round(node_inlet_temp))', "sum(sum by (row) (node_power))",
        "count(count by (rack) (node_power))", "sum by (nonexistent) (node_power)",
        "sum without (sensor) (node_power)", "max by (__name__) ({__name__=~\"node_(power|flat)\"})",
        "avg(node_power) by ()", "group without (row, rack, node, sensor) (node_power)",
        "stddev(node_odd)", "sum(rate(node_energy[5m])) by (row)",
    ]:  # fmt: skip
        add(text)
    # binary operators
    for text in [
        "node_power * 2 - 1", "1 - node_power / 1000", "-node_power", "+node_power",
        "node_power % 7", "node_power ^ 2", "2 ^ 3 ^ 2", "-2 ^ 2", "(-2) ^ 2", "node_odd * NaN",
        "node_power * NaN", "(node_power - node_power) / 0", "node_power / 0", "-node_power / 0",
        "1 + 1", "5 % 3", "10 / 4", "1 > bool 2", "3 >= bool 3", "node_power > 220",
        "node_power > bool 220", "220 < node_power", "220 < bool node_power", "node_odd == 5",
        "node_odd != bool 5", "node_power >= 200 <= 230",
        "node_power / ignoring(sensor) node_inlet_temp", "node_power / on(row, rack, node) node_inlet_temp",
        "node_power - on(row, rack, node) group_left node_inlet_temp",
        "node_power * on(row) group_left(dc) row_power", "row_power / on(row) group_right node_power",
        "node_power / on(row) group_left row_power", "sum by (row) (node_power) / on(row) row_power",
        "sum by (row) (node_power) - ignoring(sensor) row_power",
        "node_power / ignoring(sensor, rack, node) group_left row_power",
        "node_power and node_inlet_temp", "node_power and on(row, rack, node) node_inlet_temp",
        "node_power or node_inlet_temp", "node_power or on(row) row_power",
        "node_fan_rpm or node_power", "node_power unless node_inlet_temp",
        "node_power unless on(row, rack, node) node_inlet_temp > 21",
        "node_power unless on(node) node_power{node=\"node0\"}", "node_power > 220 or node_power < 205",
        "(node_power > 220) and on() vector(1)", "vector(1) + vector(2)", "vector(1) + 1",
        "node_power + on(nonexistent) dc_power", "node_power == bool on(row, rack, node) node_power",
        "sum(node_power) > bool 1000", "dc_power - ignoring(sensor, dc) sum(row_power)",
        "node_power + node_power", "node_power * on() group_left dc_power",
        "node_power > on(row, rack, node) group_left node_inlet_temp",
        "node_energy / on(row, rack, node) node_power", "node_power / node_power{row=\"row0\"}",
        "node_power and node_power{rack=\"rack0\"} or node_inlet_temp",
    ]:  # fmt: skip
        add(text)
    # language details
    for text in [
        "SUM(node_power)", "sum BY (row) (node_power)", "Sum By (row) (node_power OFFSET 5m)",
        "node_power AND node_inlet_temp",
        "0x10 * node_flat", "0x1F", "1e3 + node_flat", "Inf", "-Inf", "NaN", ".5 + 1.",
        '"a string"', "'single'", "`raw \\n`", '"esc\\t\\u00e9"', "node_power # a comment",
        "sum(\n  node_power # the power\n)", "((node_power))", "(1 + 2) * 3", "1 + 2 * 3",
        "node_power offset 1m5s", "rate(node_energy[1h30m])", "rate(node_energy[300s])",
        "node_flat + 1 > bool 42", "2 * -node_flat", "- -node_flat", "010 + 1", "1_0",
    ]:  # fmt: skip
        add(text)
    # errors
    for text in [
        "", "node_power{", "foo_bar(node_power)", "rate(node_power)", "sum(nonexistent[5m])",
        "abs(-1)", 'node_power{a=~"(?=x)"}', 'node_power{a=~"("}', 'node_power{a="\\q"}',
        "1 > 2", "{}", '{a=""}', "node_power[5m] offset 1m [1m]", "sum(node_power) offset 1m",
        "topk(node_power)", "node_power[0s]", "node_power[5m:0s]", "(node_power)[5m]",
        "node_power @ 1 @ 2", "node_power offset 1m offset 2m", "rate(node_power[5m]) [1m]",
        "histogram_quantile(node_power)", "label_replace(node_power, \"x\")", "time(1)",
        "round(node_power, 1, 2)", "node_power + on(row) group_left(row) row_power",
        "node_power and bool node_inlet_temp", "1 and 1", "node_power and on(row) group_left row_power",
        "count_values(1, node_power)", "quantile(\"x\", node_power)", "-\"x\"",
        "node_power{__name__=\"x\"}", "rate(node_energy[5m:1m:1m])", "node_power[5m:1m][1m]",
        "day_of_week(1, 2)", "sum(node_power", "node_power)", "node_power}", "[5m]",
        "node_power{row=\"a\" row=\"b\"}",
        "node_power / on(row) row_power", "node_power + node_inlet_temp * on() group_left dc_power",
        'label_replace(node_power, "x-y", "1", "node", ".*")',
        'label_replace(node_power, "x", "1", "node", "(")', "holt_winters(node_power[5m], 2, 0.5)",
        "topk(1e30, node_power)", 'count_values("a-b", node_power)', "node_power offset -",
        'label_join(node_power, "x", "-", "1abc")', "sum(node_power) by (row",
    ]:  # fmt: skip
        add(text)
    return q


QUERIES = queries()


async def _ask(
    c: httpx.AsyncClient, url: str, path: str, params: dict[str, str], post: bool
) -> tuple[int, Any]:
    r = await (c.post(url + path, data=params) if post else c.get(url + path, params=params))
    return r.status_code, r.json()


@pytest.fixture(scope="session")
def answers(prom: str, kelvin_api: str) -> dict[tuple[str, int], tuple[Any, Any]]:
    """Every query asked of both, concurrently: (query, case) -> (prometheus, kelvin)."""

    async def run() -> dict[tuple[str, int], tuple[Any, Any]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(timeout=60, limits=limits) as c:
            sem = asyncio.Semaphore(12)

            async def both(
                key: tuple[str, int], path: str, params: dict[str, str], post: bool
            ) -> tuple[tuple[str, int], tuple[Any, Any]]:
                async with sem:
                    p, k = await asyncio.gather(
                        _ask(c, prom, "/api/v1" + path, params, post),
                        _ask(c, kelvin_api, "/prometheus/api/v1" + path, params, post),
                    )
                return key, (p, k)

            jobs = []
            for n, (text, _) in enumerate(QUERIES):
                for case in cases(n):
                    path, params = request_of(text, case)
                    jobs.append(both((text, case), path, params, post=(n + case) % 2 == 1))
            return dict(await asyncio.gather(*jobs))

    return asyncio.run(run())


def cases(n: int) -> list[int]:
    """0: range query R1; 1: instant at TIMES[n % 3]; 2: range R2 (every fourth query)."""
    return [0, 1, 2] if n % 4 == 0 else [0, 1]


def request_of(text: str, case: int) -> tuple[str, dict[str, str]]:
    n = [q for q, _ in QUERIES].index(text)
    if case == 1:
        return "/query", {"query": text, "time": TIMES[n % len(TIMES)]}
    return "/query_range", {"query": text, **RANGES[0 if case == 0 else 1]}


def _values(result: Any, kind: str) -> dict[Any, list[tuple[float, str]]]:
    if kind in ("scalar", "string"):
        return {(): [(float(result[0]), str(result[1]))]}
    out: dict[Any, list[tuple[float, str]]] = {}
    for r in result:
        key = tuple(sorted(r["metric"].items()))
        assert key not in out, f"duplicate series {key}"
        pts = r["values"] if "values" in r else [r["value"]]
        out[key] = [(float(t), v) for t, v in pts]
    return out


def _same(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    x, y = float(a), float(b)
    if math.isnan(x) and math.isnan(y):
        return True
    return tol > 0 and math.isfinite(x) and math.isclose(x, y, rel_tol=tol, abs_tol=1e-300)


def compare(text: str, tol: float, p: tuple[int, Any], k: tuple[int, Any]) -> None:
    (ps, pb), (ks, kb) = p, k
    assert ks == ps, (text, pb, kb)
    assert kb["status"] == pb["status"], (text, pb, kb)
    if pb["status"] == "error":
        assert kb["errorType"] == pb["errorType"], (text, pb, kb)
        return
    pd, kd = pb["data"], kb["data"]
    assert kd["resultType"] == pd["resultType"], (text, pd, kd)
    pv, kv = _values(pd["result"], pd["resultType"]), _values(kd["result"], kd["resultType"])
    assert sorted(kv) == sorted(pv), (text, sorted(pv)[:3], sorted(kv)[:3])
    for key, pts in pv.items():
        got = kv[key]
        assert [t for t, _ in got] == [t for t, _ in pts], (text, key)
        bad = [(t, a, b) for (t, a), (_, b) in zip(pts, got, strict=True) if not _same(a, b, tol)]
        assert not bad, (text, key, bad[:5])
    if text.startswith(("sort(", "sort_desc(")) and pd["resultType"] == "vector":
        values = [float(r["value"][1]) for r in pd["result"]]
        if len(set(values)) == len(values):  # Go's sort is not stable: order ties freely
            assert [r["metric"] for r in kd["result"]] == [r["metric"] for r in pd["result"]], text


def all_cases() -> Iterator[Any]:
    for n, (text, tol) in enumerate(QUERIES):
        for case in cases(n):
            yield pytest.param(text, tol, case, id=f"{n}-{case}")


@pytest.mark.parametrize(("text", "tol", "case"), list(all_cases()))
def test_agrees_with_prometheus(
    answers: dict[tuple[str, int], tuple[Any, Any]], text: str, tol: float, case: int
) -> None:
    p, k = answers[(text, case)]
    compare(text, tol, p, k)


def test_suite_is_large_and_mostly_answers(answers: dict[tuple[str, int], tuple[Any, Any]]) -> None:
    """Hundreds of queries, most of them answered with data (not only errors or empty)."""
    assert len(QUERIES) >= 300
    with_data = sum(
        1 for p, _ in answers.values() if p[1]["status"] == "success" and p[1]["data"]["result"]
    )
    assert with_data >= 0.7 * len(answers)


def test_raw_samples_agree(answers: dict[tuple[str, int], tuple[Any, Any]]) -> None:
    """Both hold the same samples: sub-second timestamps and values, bit for bit."""
    p, k = answers[("node_power[5m]", 1)]
    assert p[1]["data"]["result"] and p == k
