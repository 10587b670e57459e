"""Response bodies for readings, produced chunk by chunk (JSON and DCDB CSV).

A body is an iterator of byte chunks of at most ``chunk`` readings each, so a
million-reading answer never exists as one Python string. Non-finite values
are JSON ``null`` and empty CSV fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from services.query_api import csvfast
from services.query_api.query import Result

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def numbers(arr: np.ndarray[Any, Any]) -> memoryview:
    """int64 or float64 numbers as JSON, comma-separated, no brackets: as orjson writes
    them, by the compiled encoder when there is one (it holds no GIL while writing)."""
    core = csvfast.compiled
    if core is None or arr.dtype not in (np.float64, np.int64):
        return memoryview(orjson.dumps(np.ascontiguousarray(arr), option=_NUMPY))[1:-1]
    buf, used = core.json_numbers(np.ascontiguousarray(arr), arr.dtype == np.float64)
    return memoryview(buf)[:used]


def _array_chunks(arr: np.ndarray[Any, Any], chunk: int) -> Iterator[bytes | memoryview]:
    n = arr.shape[0]
    for i in range(0, n, chunk):
        if i:
            yield b","
        yield numbers(np.ascontiguousarray(arr[i : i + chunk]))


def json_body(
    result: Result, start_ns: int, end_ns: int, chunk: int
) -> Iterator[bytes | memoryview]:
    """``{"sensor", "unit", "label", "start_ns", "end_ns", "count", "timestamps_ns", "values"}``."""
    head = {
        "sensor": result.sensor,
        "unit": result.unit,
        "label": result.label,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "count": len(result),
    }
    yield orjson.dumps(head)[:-1] + b',"timestamps_ns":['
    yield from _array_chunks(result.timestamps_ns, chunk)
    yield b'],"values":['
    yield from _array_chunks(result.values, chunk)
    yield b"]}"


def csv_header(label: str) -> bytes:
    return f"Sensor,Time,{label}\n".encode()


def csv_body(result: Result, chunk: int, iso: bool = True) -> Iterator[bytes]:
    """DCDB CSV lines ``sensor,time,value`` of one result (the caller writes the header)."""
    for i in range(0, len(result), chunk):
        ts, vs = result.timestamps_ns[i : i + chunk], result.values[i : i + chunk]
        yield csvfast.lines(result.sensor, ts, vs, iso)
