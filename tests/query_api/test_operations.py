"""Every DCDB operation, resampling and unit modifier, against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import cumulative_trapezoid

from services.query_api import operations
from tests.query_api.conftest import T0, Api, S

# readings at t = 0, 1, 3, 4 s (an uneven step) of a counter that resets after 3 s
TS = [0, 1, 3, 4]
VS = [10.0, 14.0, 20.0, 2.0]


async def run(api: Api, spec: str, **params: str) -> dict:  # type: ignore[type-arg]
    r = await api.client.get(
        "/api/v1/readings",
        params={"sensor": spec, "start": str(T0), "end": str(T0 + 10 * S), **params},
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("op", "values", "unit", "label"),
    [
        ("delta", [4.0, 6.0, -18.0], "J", "Delta"),
        ("delta_t", [1e9, 2e9, 1e9], "ns", "Delta_t"),
        ("derivative", [4.0, 3.0, -18.0], "J/s", "Derivative"),
        # trapezoids: (10+14)/2*1, (14+20)/2*2, (20+2)/2*1
        ("integral", [12.0, 34.0, 11.0], "J*s", "Integral"),
        # a drop is a counter reset: the increase is the new value, 2
        ("rate", [4.0, 3.0, 2.0], "J/s", "Rate"),
    ],
)
async def test_transforms(api: Api, op: str, values: list[float], unit: str, label: str) -> None:
    await api.write("/c", TS, VS, unit="J")
    body = await run(api, f"{op}(/c)")
    assert body["timestamps_ns"] == [T0 + S, T0 + 3 * S, T0 + 4 * S]
    assert body["values"] == pytest.approx(values)
    assert body["unit"] == unit and body["label"] == label


@pytest.mark.parametrize(
    ("op", "value", "unit"),
    [
        ("min", 2.0, "J"),
        ("max", 20.0, "J"),
        ("avg", 11.5, "J"),
        ("sum", 46.0, "J"),
        ("count", 4, ""),
    ],
)
async def test_aggregates_over_the_range(api: Api, op: str, value: float, unit: str) -> None:
    await api.write("/c", TS, VS, unit="J")
    body = await run(api, f"{op}(/c)")
    assert body["timestamps_ns"] == [T0]  # the range start
    assert body["values"] == [value] and body["unit"] == unit and body["label"] == op


async def test_aggregate_ignores_missing_values(api: Api) -> None:
    await api.write("/c", [0, 1, 2], [1.0, np.nan, 5.0])
    assert (await run(api, "avg(/c)"))["values"] == [3.0]
    assert (await run(api, "count(/c)"))["values"] == [2]


async def test_interval_buckets_aligned_to_the_epoch(api: Api) -> None:
    await api.write("/c", TS, VS, unit="J")
    # 2 s buckets: [0,2) holds 10, 14; [2,4) holds 20; [4,6) holds 2
    body = await run(api, "/c", interval="2s")
    assert body["timestamps_ns"] == [T0, T0 + 2 * S, T0 + 4 * S]
    assert body["values"] == [12.0, 20.0, 2.0] and body["label"] == "avg"
    assert (await run(api, "/c", interval="2s", agg="max"))["values"] == [14.0, 20.0, 2.0]
    assert (await run(api, "/c", interval="2s", agg="count"))["values"] == [2, 1, 1]
    assert (await run(api, "/c", interval="2s", agg="last"))["values"] == [14.0, 20.0, 2.0]
    # an aggregate operation with an interval reduces per bucket
    assert (await run(api, "sum(/c)", interval="2s"))["values"] == [24.0, 20.0, 2.0]


async def test_integral_per_bucket_gives_energy_per_interval(api: Api) -> None:
    await api.write("/p", [0, 1, 2, 3], [1000.0, 1000.0, 3000.0, 3000.0], unit="W")
    # per step: 1000, 2000, 3000 J stamped t=1, 2, 3; 2 s buckets: [0,2) has t=1, [2,4) t=2 and 3
    body = await run(api, "integral(/p)@kJ", interval="2s", agg="sum")
    assert body["values"] == pytest.approx([1.0, 5.0]) and body["unit"] == "kJ"
    kwh = await run(api, "sum(integral(/p))@kWh")
    assert kwh["values"] == pytest.approx([6000 / 3.6e6]) and kwh["unit"] == "kWh"


async def test_units_and_factors(api: Api) -> None:
    await api.write("/t", [0], [20.0], unit="degC")
    assert (await run(api, "/t@K"))["values"] == pytest.approx([293.15])
    assert (await run(api, "/t@degF"))["values"] == pytest.approx([68.0])
    assert (await run(api, "/t@0.5"))["values"] == [10.0]
    assert (await run(api, "/t@0.5"))["unit"] == "degC"


async def test_a_difference_of_temperatures_converts_without_the_offset(api: Api) -> None:
    await api.write("/t", [0, 1, 2], [20.0, 21.0, 23.5], unit="degC")
    body = await run(api, "delta(/t)")
    assert body["values"] == [1.0, 2.5] and body["unit"] == "delta_degC"
    assert (await run(api, "delta(/t)@K"))["values"] == pytest.approx([1.0, 2.5])
    assert (await run(api, "delta(/t)@delta_degF"))["values"] == pytest.approx([1.8, 4.5])
    assert (await run(api, "derivative(/t)@K/s"))["values"] == pytest.approx([1.0, 2.5])
    # a difference is no temperature: a precise 400, not a 500
    r = await api.client.get(
        "/api/v1/readings", params={"sensor": "delta(/t)@degF", "start": str(T0)}
    )
    assert r.status_code == 400 and r.json()["error"] == "bad_unit"
    assert "cannot convert 'delta_degC' to 'degF'" in r.json()["detail"]


async def test_logarithmic_units_convert_exactly(api: Api) -> None:
    await api.write("/rx", [0, 1, 2], [0.0, 10.0, -20.0], unit="dBm")
    assert (await run(api, "/rx@mW"))["values"] == pytest.approx([1.0, 10.0, 0.01])
    assert (await run(api, "/rx@W"))["values"] == pytest.approx([1e-3, 1e-2, 1e-5])
    assert (await run(api, "max(/rx)@mW"))["values"] == pytest.approx([10.0])


def test_unknown_operation_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown aggregate"):
        operations.aggregate("median", np.zeros(1, np.int64), np.zeros(1), 0)


series = st.integers(min_value=2, max_value=60).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(1, 10**10), min_size=n, max_size=n),
        st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=n, max_size=n),
    )
)


@settings(max_examples=150, deadline=None)
@given(series)
def test_integral_agrees_with_numpy_and_scipy(data: tuple[list[int], list[float]]) -> None:
    steps, values = data
    ts = np.cumsum(np.asarray(steps, dtype=np.int64))
    vs = np.asarray(values)
    _, per_step = operations.transform("integral", ts, vs)
    t_s = ts / 1e9
    assert per_step.sum() == pytest.approx(np.trapezoid(vs, t_s), rel=1e-9, abs=1e-6)
    assert np.cumsum(per_step) == pytest.approx(cumulative_trapezoid(vs, t_s), rel=1e-9, abs=1e-6)
