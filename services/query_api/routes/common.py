"""Helpers shared by the routes: time ranges and error bodies."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from services.common import times
from services.common.errors import KelvinError, TimeSpecError
from services.query_api.context import ApiContext

Dependency = Callable[[Request], Coroutine[Any, Any, None]]

MIN_NS, MAX_NS = -(2**63), 2**63 - 1
"""Times are int64 ns since the epoch: 1677-09-21 to 2262-04-11."""


def in_range(ns: int) -> bool:
    """Whether ``ns`` (and the ns after it, an inclusive end) is an int64 time."""
    return MIN_NS <= ns < MAX_NS


def parse_time_ns(text: str, now: int, what: str) -> int:
    """A DCDB time argument, checked to be a time Kelvin can store."""
    try:
        ns = times.parse_time(text, now)
    except TimeSpecError as exc:
        raise TimeSpecError(f"{what}: {exc}") from None
    if not in_range(ns):
        raise TimeSpecError(
            f"{what}: time {text!r} lies outside 1677-09-21 .. 2262-04-11, "
            "the times int64 ns since the epoch can hold"
        )
    return ns


def time_range(ctx: ApiContext, start: str | None, end: str | None) -> tuple[int, int]:
    """Parse DCDB time arguments; defaults: the last ``default_range_s`` up to now."""
    now = times.now_ns()
    end_ns = parse_time_ns(end, now, "end") if end else now
    if start:
        start_ns = parse_time_ns(start, now, "start")
    else:
        start_ns = max(end_ns - round(ctx.settings.default_range_s * 1e9), MIN_NS)
    return start_ns, end_ns


def interval(spec: str | None) -> int | None:
    """``10s``, ``5m``, ``100ms`` (a bare number is seconds) -> ns; None when absent."""
    if spec is None or spec == "":
        return None
    try:
        ns = times.parse_duration_ns(spec)
    except TimeSpecError as exc:
        raise TimeSpecError(f"interval: {exc}") from None
    if ns <= 0:
        raise TimeSpecError(f"interval: {spec!r} must be longer than zero")
    if ns > MAX_NS:
        raise TimeSpecError(f"interval: {spec!r} is longer than int64 ns can hold (292 years)")
    return ns


def error(status: int, kind: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": kind, "detail": detail}, status_code=status)


def reject(ctx: ApiContext, exc: KelvinError, reason: str, status: int = 400) -> JSONResponse:
    """Count a bad request by reason and answer with a JSON error body."""
    ctx.metrics.rejects.labels(reason).inc()
    return error(status, reason, str(exc))
