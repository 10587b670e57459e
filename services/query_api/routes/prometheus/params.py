"""Parameters of the Prometheus HTTP API, read and refused as Prometheus 2.42 reads them.

Endpoints take them from the query string or a form-encoded POST body. Times are
unix seconds (fractions rounded to the millisecond) or RFC 3339; steps are seconds
or durations, truncated to milliseconds. Errors are ``bad_data`` with
Prometheus' wording (``invalid parameter "start": ...``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import orjson
from fastapi import Request, Response

from services.common import times
from services.common.errors import KelvinError, TimeSpecError
from services.query_api.promql import parse_duration_ns
from services.query_api.promql.functions import go_parse_float
from services.query_api.routes.common import MAX_NS, MIN_NS, in_range

MAX_POINTS = 11_000
"""Prometheus' limit of steps per series in a range query."""
MIN_TIME_NS, MAX_TIME_NS = MIN_NS + 1, MAX_NS - 1
"""Defaults of ``start``/``end`` where Prometheus means "all time"."""

Params = list[tuple[str, str]]


class BadData(KelvinError):
    """A request Prometheus answers with 400 ``bad_data``."""


def ok(data: Any) -> Response:
    return Response(
        orjson.dumps({"status": "success", "data": data}), media_type="application/json"
    )


async def read_params(request: Request) -> Params:
    items = list(request.query_params.multi_items())
    if request.method == "POST":
        body = (await request.body()).decode("utf-8", "replace")
        items.extend(parse_qsl(body, keep_blank_values=True))
    return items


def one(params: Params, key: str) -> str | None:
    for k, v in params:
        if k == key:
            return v
    return None


def _go_round(x: float) -> float:
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def time_ns(params: Params, key: str, default_ns: int | None = None) -> int:
    """A time parameter in ns, on Prometheus' millisecond grid."""
    raw = one(params, key)
    if raw is None or raw == "":
        if default_ns is None:
            raise BadData(f'invalid parameter "{key}": cannot parse "" to a valid timestamp')
        return default_ns
    ns: int | None = None
    value = go_parse_float(raw)
    if value is not None and math.isfinite(value) and abs(value) < 9.2e9:
        # Go: Modf, round the fraction to ms, time.Unix(sec, int64(frac * 1e9)), then ms
        frac, whole = math.modf(value)
        frac = _go_round(frac * 1000) / 1000
        total = int(whole) * 1_000_000_000 + int(frac * 1e9)
        ns = total // 1_000_000 * 1_000_000
    elif value is None:
        with contextlib.suppress(TimeSpecError):
            ns = times.parse_time(raw) // 1_000_000 * 1_000_000
    if ns is None or not in_range(ns):
        raise BadData(f'invalid parameter "{key}": cannot parse "{raw}" to a valid timestamp')
    return ns


def step_ns(raw: str | None) -> int:
    """The ``step`` of a range query in ns (whole milliseconds, as Prometheus evaluates)."""
    text = raw or ""
    value = go_parse_float(text)
    if value is not None:
        ns_f = value * 1e9
        if not math.isfinite(ns_f) or abs(ns_f) > 9.223372036854775807e18:
            raise BadData(
                f'invalid parameter "step": cannot parse "{text}" to a valid duration. '
                "It overflows int64"
            )
        ns = int(ns_f)
    else:
        try:
            ns = parse_duration_ns(text)
        except ValueError:
            raise BadData(
                f'invalid parameter "step": cannot parse "{text}" to a valid duration'
            ) from None
    if ns <= 0 or ns < 1_000_000:  # Prometheus' millisecond grid makes a sub-ms step zero
        raise BadData(
            'invalid parameter "step": zero or negative query resolution step widths are not '
            "accepted. Try a positive integer"
        )
    return ns // 1_000_000 * 1_000_000


def range_steps(params: Params) -> tuple[int, int, int]:
    start = time_ns(params, "start")
    end = time_ns(params, "end")
    if end < start:
        raise BadData('invalid parameter "end": end timestamp must not be before start time')
    step = step_ns(one(params, "step"))
    if (end - start) // step > MAX_POINTS:
        raise BadData(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing "
            "the query resolution (?step=XX)"
        )
    return start, end, step


def fmt_time(ns: int) -> float | int:
    """A sample time as Prometheus writes it: seconds, with milliseconds when there are any."""
    ms = ns // 1_000_000
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def times_seconds(ns: np.ndarray) -> list[Any]:
    """:func:`fmt_time` for many times at once."""
    ms = ns // 1_000_000
    if bool((ms % 1000 == 0).all()):
        return (ms // 1000).tolist()  # type: ignore[no-any-return]
    return [m // 1000 if m % 1000 == 0 else m / 1000 for m in ms.tolist()]


PARAM_DOCS = {
    "query": "PromQL expression (docs/query-api.md)",
    "time": "evaluation time: unix seconds or RFC 3339 (default now)",
    "start": "range start: unix seconds or RFC 3339",
    "end": "range end: unix seconds or RFC 3339",
    "step": "resolution: seconds or a duration such as 15s",
    "match[]": "series selector, repeatable",
}


def openapi(*names: str) -> dict[str, Any]:
    """OpenAPI parameters for a route that reads them itself (GET query or POST form)."""
    params = [
        {
            "name": n,
            "in": "query",
            "required": False,
            "schema": {"type": "array", "items": {"type": "string"}}
            if n == "match[]"
            else {"type": "string"},
            "description": PARAM_DOCS[n],
        }
        for n in names
    ]
    return {"parameters": params}
