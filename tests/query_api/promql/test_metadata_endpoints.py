"""``series``, ``labels``, ``label/<name>/values`` and ``query_exemplars`` against Prometheus.

The same samples as the differential suite; ``start``/``end`` narrow the answer to
series with samples in the range (issue 15: Kelvin used to ignore them).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.query_api.promql.dataset import SPAN_MS, T0_MS

S = T0_MS / 1000
BEFORE = {"start": str(S - 86400), "end": str(S - 3600)}
DURING = {"start": str(S + 600), "end": str(S + 1200)}
AFTER = {"start": str(S + SPAN_MS / 1000 + 3600), "end": str(S + SPAN_MS / 1000 + 7200)}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("series", {"match[]": 'node_power{row="row0"}'}),
    ("series", {"match[]": ["node_inlet_temp", '{rack="rack0", row="row1"}']}),
    ("series", {"match[]": "node_power", **BEFORE}),
    ("series", {"match[]": "node_power", **DURING}),
    ("series", {"match[]": "node_power", **AFTER}),
    ("series", {"match[]": '{__name__=~"http.*"}', **DURING}),
    ("labels", {}),
    ("labels", {"match[]": "node_power"}),
    ("labels", BEFORE),
    ("labels", {"match[]": '{__name__=~"http.*"}', **DURING}),
    ("label/row/values", {}),
    ("label/__name__/values", {}),
    ("label/__name__/values", AFTER),
    ("label/__name__/values", {"match[]": '{row="row0"}', **DURING}),
    ("label/le/values", {}),
    ("label/sensor/values", {"match[]": "dc_power"}),
    ("query_exemplars", {"query": "node_power", **DURING}),
    # errors
    ("series", {}),
    ("series", {"match[]": "node_power{"}),
    ("series", {"match[]": "node_power", "start": "x"}),
    ("labels", {"end": "yesterday"}),
    ("label/1x/values", {}),
    ("query_exemplars", {"query": "rate(x)", **DURING}),
    ("query_exemplars", {"query": "x", "start": "10", "end": "1"}),
]


ASKED = [
    pytest.param(path, params, post, id=f"{i}-{path}-{'post' if post else 'get'}")
    for i, (path, params) in enumerate(CASES)
    for post in (False, True)
    if not (post and path.startswith("label/"))  # label values are GET only
]


@pytest.mark.parametrize(("path", "params", "post"), ASKED)
def test_agrees_with_prometheus(
    prom: str, kelvin_api: str, path: str, params: dict[str, Any], post: bool
) -> None:
    answers = []
    for base in (f"{prom}/api/v1/", f"{kelvin_api}/prometheus/api/v1/"):
        r = httpx.post(base + path, data=params) if post else httpx.get(base + path, params=params)
        answers.append((r.status_code, r.json()))
    (ps, pb), (ks, kb) = answers
    assert ks == ps, (pb, kb)
    assert kb["status"] == pb["status"]
    if pb["status"] == "error":
        assert kb["errorType"] == pb["errorType"], (pb, kb)
        return
    key = (lambda x: sorted(x.items())) if path == "series" else None
    assert sorted(kb["data"], key=key) == sorted(pb["data"], key=key)
