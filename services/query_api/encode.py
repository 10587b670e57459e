"""Response bodies for readings, produced chunk by chunk (JSON and DCDB CSV).

A body is an iterator of byte chunks of at most ``chunk`` readings each, so a
million-reading answer never exists as one Python string. Non-finite values
are JSON ``null`` and empty CSV fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import orjson

from services.query_api import csvfast
from services.query_api.query import Result

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _array_chunks(arr: np.ndarray[Any, Any], chunk: int) -> Iterator[bytes]:
    n = arr.shape[0]
    for i in range(0, n, chunk):
        body = orjson.dumps(np.ascontiguousarray(arr[i : i + chunk]), option=_NUMPY)[1:-1]
        yield body if i == 0 else b"," + body


def json_body(result: Result, start_ns: int, end_ns: int, chunk: int) -> Iterator[bytes]:
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


def csv_body(
    results: Iterable[Result], chunk: int, iso: bool = True, header: bool = True
) -> Iterator[bytes]:
    """DCDB CSV: one ``Sensor,Time,<label>`` header, repeated only when the label changes."""
    label: str | None = None
    for r in results:
        if r.label != label:
            label = r.label
            if header:
                yield csv_header(label)
        for i in range(0, len(r), chunk):
            yield csvfast.lines(
                r.sensor, r.timestamps_ns[i : i + chunk], r.values[i : i + chunk], iso
            )
    if label is None and header:
        yield csv_header("Value")


def json_result(result: Result) -> dict[str, Any]:
    """A small result as a plain dict (for non-streamed answers)."""
    return {
        "sensor": result.sensor,
        "unit": result.unit,
        "label": result.label,
        "count": len(result),
        "timestamps_ns": result.timestamps_ns.tolist(),
        "values": [v if np.isfinite(v) else None for v in result.values.tolist()],
    }
