"""Virtual sensors over REST: definitions, mixed rates and units, functions, errors, auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.auth import Role
from services.query_api.app import create_service
from services.query_api.virtual.parser import MAX_DEPTH
from tests.query_api.conftest import PUE, T0, Api, S, make_config, mixed_inputs
from tests.query_api.virtual.test_parser import DEEP
from tests.support.auth import headers


async def define(api: Api, name: str, expression: str, **extra: Any) -> httpx.Response:
    return await api.client.put(
        f"/api/v1/virtual/{name.lstrip('/')}", json={"expression": expression, **extra}
    )


async def test_mixed_rates_and_units_hand_computed(api: Api) -> None:
    await mixed_inputs(api)
    r = await define(api, "/pue", PUE)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["unit"] == "" and d["interval_ms"] == 1000  # the finest input's interval
    assert d["input_intervals_ms"] == {"/a/power": 1000, "/b/power": 2000, "/it/power": 1000}
    # t:        0     1     2     3     4     5     6     7     8     9     10
    # a (W):  100   110   120   130   140   150   160   170   180   190   200
    # b (W):  200   300   400   250   100   200   300   300   300   400   500  (odd t interpolated)
    # it (W): 100 everywhere
    expected = [3.0, 4.1, 5.2, 3.8, 2.4, 3.5, 4.6, 4.7, 4.8, 5.9, 7.0]
    assert await api.values("/pue") == pytest.approx(expected)


async def test_declared_unit_numbers_with_units_and_conversions(api: Api) -> None:
    await mixed_inputs(api)
    r = await define(api, "/total", '"/a/power" + "/b/power" + 1.5 kW', unit="kW")
    assert r.status_code == 200, r.text
    # t=0: 100 W + 200 W + 1500 W = 1.8 kW; t=1: 110 + 300 + 1500 = 1.91 kW
    assert (await api.values("/total", 0, 2)) == pytest.approx([1.8, 1.91])
    r = await api.client.get(
        "/api/v1/readings", params={"sensor": "/total@W", "start": str(T0), "end": str(T0 + S)}
    )
    assert r.json()["values"] == pytest.approx([1800.0]) and r.json()["unit"] == "W"


async def test_differences_of_temperatures_carry_no_offset(api: Api) -> None:
    await api.write("/out", [0, 1], [30.0, 32.0], unit="degC")
    await api.write("/in", [0, 1], [20.0, 21.0], unit="degC")
    r = await define(api, "/dt", '"/out" - "/in"')
    assert r.status_code == 200, r.text
    assert r.json()["unit"] == "delta_degC" and "difference of temperatures" in r.text
    assert await api.values("/dt", 0, 2) == pytest.approx([10.0, 11.0])  # not -263.15
    r = await define(api, "/dt_f", '-("/in" - "/out")', unit="degF")
    assert r.json()["unit"] == "delta_degF"
    assert await api.values("/dt_f", 0, 2) == pytest.approx([18.0, 19.8])
    # a difference read by another virtual sensor converts to K without an offset too
    assert (await define(api, "/dt2", '"/dt" * 2 + 1 K')).json()["unit"] == "delta_degC"
    assert await api.values("/dt2", 0, 2) == pytest.approx([21.0, 23.0])
    # points on the scale stay points: a mean, a shifted reading, the hottest
    for expr, want in [
        ('("/out" + "/in") / 2', [25.0, 26.5]),
        ('"/in" + 5 K', [25.0, 26.0]),
        ('max("/out", "/in")', [30.0, 32.0]),
    ]:
        r = await define(api, "/point", expr)
        assert r.json()["unit"] == "degC", (expr, r.text)
        assert await api.values("/point", 0, 2) == pytest.approx(want), expr


async def test_logarithmic_inputs_add_as_powers(api: Api) -> None:
    await api.write("/p1", [0, 1], [10.0, 20.0], unit="dBm")
    await api.write("/p2", [0, 1], [10.0, 10.0], unit="dBm")
    r = await define(api, "/sum", '"/p1" + "/p2"')
    assert r.status_code == 200 and r.json()["unit"] == "dBm", r.text
    # 10 mW + 10 mW = 20 mW = 13.01 dBm; 100 mW + 10 mW = 20.41 dBm
    assert await api.values("/sum", 0, 2) == pytest.approx([13.0103, 20.4139], abs=1e-4)
    r = await define(api, "/plus", '"/p2" + 10 mW', unit="mW")
    assert await api.values("/plus", 0, 2) == pytest.approx([20.0, 20.0])


async def test_gaps_larger_than_the_limit_stay_gaps(api: Api) -> None:
    await api.write("/g", [0, 1, 2, 8, 9, 10], [1.0, 2.0, 3.0, 9.0, 10.0, 11.0], unit="W")
    assert (await define(api, "/g2", '"/g" * 2')).status_code == 200
    assert await api.values("/g2") == [
        2.0,
        4.0,
        6.0,
        None,
        None,
        None,
        None,
        None,
        18.0,
        20.0,
        22.0,
    ]
    # a declared max_gap_ms bridges it with a straight line
    assert (await define(api, "/g3", '"/g" * 2', max_gap_ms=6000)).status_code == 200
    assert await api.values("/g3", 3, 8) == pytest.approx([8.0, 10.0, 12.0, 14.0, 16.0])


async def test_functions_and_wildcards(api: Api) -> None:
    for k, base in enumerate([100.0, 200.0, 600.0]):
        await api.write(f"/dc/row0/n{k}/power", [0, 1, 2], [base, base + 10, base + 40], unit="W")
    await api.write("/dc/row0/n0/temp", [0, 1, 2], [20.0, 21.0, 22.0], unit="degC")
    cases = {
        'sum("/dc/row0/*/power")': [900.0, 930.0, 1020.0],
        'avg("/dc/row0/*/power")': [300.0, 310.0, 340.0],
        'max("/dc/row0/*/power", 650 W)': [650.0, 650.0, 650.0],
        'min("/dc/row0/*/power") - 150 W': [-50.0, -40.0, -10.0],
        'abs(100 W - "/dc/row0/n1/power")': [100.0, 110.0, 140.0],
        'delta("/dc/row0/n2/power")': [None, 10.0, 30.0],
        'rate("/dc/row0/n2/power")': [None, 10.0, 30.0],
        'integral("/dc/row0/n0/power")': [None, 105.0, 125.0],
        '"/dc/row0/n0/power" ^ 2 / 100 W': [100.0, 121.0, 196.0],
    }
    for k, (expr, want) in enumerate(cases.items()):
        r = await define(api, f"/v/f{k}", expr)
        assert r.status_code == 200, (expr, r.text)
        got = await api.values(f"/v/f{k}", 0, 3)
        assert got == pytest.approx(want, nan_ok=True), expr
    units = {(await api.client.get(f"/api/v1/virtual/v/f{k}")).json()["unit"] for k in range(6)}
    assert units == {"W"}
    assert (await api.client.get("/api/v1/virtual/v/f7")).json()["unit"] != "W"  # W*s


async def test_virtual_of_virtual(api: Api) -> None:
    await mixed_inputs(api)
    assert (await define(api, "/pue", PUE)).status_code == 200
    # a dimensionless ratio of 3.0 is 300 %: pint converts, no factor 100 by hand
    assert (await define(api, "/pue_pct", '"/pue"', unit="%")).status_code == 200
    assert (await api.values("/pue_pct", 0, 2)) == pytest.approx([300.0, 410.0])
    assert (await define(api, "/pue_x2", '"/pue_pct" * 2')).status_code == 200
    assert (await api.values("/pue_x2", 0, 2)) == pytest.approx([600.0, 820.0])


async def test_definition_errors(api: Api) -> None:
    await mixed_inputs(api)
    await api.write("/t", [0], [20.0], unit="degC")
    cases = [
        ('"/a/power" + "/t"', None, "bad_expression", 12, "cannot add"),
        ('"/a/power" + "/nope"', None, "bad_expression", 14, "unknown sensor '/nope'"),
        ('"/a/power" * 2', "degC", "bad_unit", None, "does not match"),
        ('"/a/power" ^ "/t"', None, "bad_expression", 12, "exponent must be dimensionless"),
        ('sum("/zz/*")', None, "bad_expression", 5, "matches no sensor"),
        ('"/a/power" +', None, "bad_expression", 13, "ends early"),
    ]
    for expr, unit, kind, position, fragment in cases:
        r = await define(api, "/bad", expr, **({"unit": unit} if unit else {}))
        assert r.status_code == 400, (expr, r.text)
        body = r.json()
        assert body["error"] == kind and fragment in body["detail"], body
        assert body.get("position") == position, body
    for key in ("interval_ms", "max_gap_ms"):  # a grid step must stay inside int64 ns
        r = await define(api, "/bad", '"/a/power"', **{key: 10**18})
        assert r.status_code == 422 and f"body.{key}: Input should be less" in r.text
    assert (await api.client.get("/api/v1/virtual/bad")).status_code == 404


async def test_cycles_are_rejected(api: Api) -> None:
    await mixed_inputs(api)
    assert (await define(api, "/v/x", '"/a/power" * 2')).status_code == 200
    assert (await define(api, "/v/y", '"/v/x" + 1 W')).status_code == 200
    r = await define(api, "/v/x", '"/v/y" * 2')
    assert r.status_code == 400 and "/v/x -> /v/y -> /v/x" in r.json()["detail"]
    r = await define(api, "/v/self", '"/v/self" + 1')
    assert r.status_code == 400 and "depend on itself" in r.json()["detail"]
    # a wildcard that would match the sensor being defined is a cycle too
    r = await define(api, "/v/sum", 'sum("/v/*")')
    assert r.status_code == 400 and "/v/sum" in r.json()["detail"]


async def test_list_show_redefine_delete(api: Api) -> None:
    await mixed_inputs(api)
    assert (await define(api, "/v/p", '"/a/power"', description="copy")).status_code == 200
    assert (await define(api, "/v/q", '"/v/p" * 2')).status_code == 200
    listed = (await api.client.get("/api/v1/virtual")).json()["virtual"]
    assert [d["name"] for d in listed] == ["/v/p", "/v/q"]
    shown = (await api.client.get("/api/v1/virtual/v/p")).json()
    assert shown["description"] == "copy" and shown["dependents"] == ["/v/q"]
    kids = (await api.client.get("/api/v1/sensors", params={"prefix": "/v"})).json()["children"]
    assert [(k["name"], k["is_virtual"]) for k in kids] == [("/v/p", True), ("/v/q", True)]
    assert (await api.values("/v/q", 0, 1)) == [200.0]
    # redefining drops stored results of the sensor and of what reads it
    assert (await define(api, "/v/p", '"/a/power" * 3')).status_code == 200
    assert (await api.values("/v/q", 0, 1)) == [600.0]
    r = await api.client.delete("/api/v1/virtual/v/p")
    assert r.status_code == 400 and "/v/q" in r.json()["detail"]
    assert (await api.client.delete("/api/v1/virtual/v/q")).status_code == 200
    assert (await api.client.delete("/api/v1/virtual/v/p")).status_code == 200
    assert (await api.client.delete("/api/v1/virtual/v/p")).status_code == 404
    assert (await api.client.get("/api/v1/virtual")).json()["virtual"] == []


async def test_dry_run_stores_nothing(api: Api) -> None:
    await mixed_inputs(api)
    r = await api.client.put(
        "/api/v1/virtual/v/dry", params={"dry_run": "true"}, json={"expression": PUE}
    )
    assert r.status_code == 200 and r.json()["name"] == "/v/dry"
    assert (await api.client.get("/api/v1/virtual/v/dry")).status_code == 404


async def test_changes_need_admin_and_reads_are_open_on_loopback(tmp_path: Path) -> None:
    svc = create_service(make_config(tmp_path))
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as c:
            api = Api(svc, c)
            await mixed_inputs(api)
            body = {"expression": PUE}
            assert (await c.put("/api/v1/virtual/pue", json=body)).status_code == 401
            wrong = {"Authorization": "Bearer not-a-token-of-this-service"}
            assert (await c.put("/api/v1/virtual/pue", json=body, headers=wrong)).status_code == 401
            low = await c.put("/api/v1/virtual/pue", json=body, headers=headers(Role.WRITE))
            assert low.status_code == 403, low.text
            good = headers(Role.ADMIN)
            assert (await c.put("/api/v1/virtual/pue", json=body, headers=good)).status_code == 200
            assert (await c.delete("/api/v1/virtual/pue")).status_code == 401
            assert (await c.get("/api/v1/virtual/pue")).status_code == 200
            assert (await api.values("/pue", 0, 1)) == pytest.approx([3.0])
            put = {"name": "/a/power", "unit": "kW"}
            meta = await c.put("/api/v1/metadata", json=put, headers=headers(Role.READ))
            assert meta.status_code == 403
            assert (await c.delete("/api/v1/virtual/pue", headers=good)).status_code == 200
    finally:
        await svc.stop()


async def test_reads_need_the_read_token_when_not_open(tmp_path: Path) -> None:
    svc = create_service(make_config(tmp_path, auth={"open_reads": False}))
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as c:
            await Api(svc, c).write("/a", [0], [1.0])
            assert (await c.get("/api/v1/sensors")).status_code == 401
            assert (await c.get("/api/v1/readings", params={"sensor": "/a"})).status_code == 401
            ok = await c.get("/api/v1/sensors", headers=headers(Role.READ))
            assert ok.status_code == 200
            # a pusher's write token cannot read
            assert (await c.get("/api/v1/sensors", headers=headers(Role.WRITE))).status_code == 403
            assert (await c.get("/healthz")).status_code == 200  # probes stay open
    finally:
        await svc.stop()


async def test_too_deep_expressions_are_a_counted_400_with_the_position(api: Api) -> None:
    await api.write("/a", [0, 1, 2], [1.0, 2.0, 3.0])
    for text in DEEP.values():
        r = await api.client.put("/api/v1/virtual/deep", json={"expression": text})
        assert r.status_code == 400, r.text[:300]
        body = r.json()
        assert body["error"] == "too_deep" and 1 <= body["position"] <= len(text)
        assert len(r.content) < 1000, "no traceback, no copy of the expression"
    metrics = (await api.client.get("/metrics")).text
    assert f'kelvin_query_api_rejects_total{{reason="too_deep"}} {float(len(DEEP))}' in metrics


async def test_the_deepest_allowed_expression_is_defined_and_evaluated(api: Api) -> None:
    await api.write("/a", [0, 1, 2], [1.0, 2.0, 3.0])
    depth = MAX_DEPTH - 2
    for text in ("(" * depth + '"/a"' + ")" * depth, "--" * (depth // 2) + '"/a"'):
        r = await api.client.put("/api/v1/virtual/deepest", json={"expression": text})
        assert r.status_code == 200, r.text[:300]
        assert await api.values("/deepest", 0, 3) == pytest.approx([1.0, 2.0, 3.0])
        assert (await api.client.delete("/api/v1/virtual/deepest")).status_code == 200


async def test_a_nan_or_infinite_scale_is_a_counted_400_and_changes_nothing(api: Api) -> None:
    await api.write("/m/p", [0], [1.0])
    ok = await api.client.put("/api/v1/metadata", json={"name": "/m/p", "scale": 0.5})
    assert ok.status_code == 200 and ok.json()["scale"] == 0.5
    for body in (b'{"name": "/m/p", "scale": NaN}', b'{"name": "/m/p", "scale": "Infinity"}',
                 b'{"name": "/m/p", "scale": "-inf"}'):  # fmt: skip
        r = await api.client.put(
            "/api/v1/metadata", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["error"] == "non_finite", r.text
    meta = (await api.client.get("/api/v1/metadata", params={"sensor": "/m/p"})).json()
    assert meta["scale"] == 0.5
    metrics = (await api.client.get("/metrics")).text
    assert 'kelvin_query_api_rejects_total{reason="non_finite"} 3.0' in metrics
