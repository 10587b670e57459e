"""The DCDB metadata document of a sensor (``/DCDB_MAP/METADATA/<name>``), as bytes.

Shared by the codec and the pusher, which encodes it without the codec (numpy,
pydantic) on compute nodes. ``meta`` is anything with SensorMetadata's fields.
"""

from __future__ import annotations

import json
from typing import Any


def metadata_payload(meta: Any) -> bytes:
    """The JSON payload: DCDB's keys, only the optional ones that are set, booleans always."""
    doc: dict[str, Any] = {}
    if meta.public_name:
        doc["publicName"] = meta.public_name
    if meta.pattern:
        doc["pattern"] = meta.pattern
    if meta.unit:
        doc["unit"] = meta.unit
    doc["scale"] = meta.scale
    if meta.ttl_ms is not None:
        doc["ttl"] = meta.ttl_ms
    if meta.interval_ms is not None:
        doc["interval"] = meta.interval_ms
    if meta.operations:
        doc["operations"] = ",".join(meta.operations)
    for key, attr in (
        ("integrable", "integrable"),
        ("monotonic", "monotonic"),
        ("delta", "delta"),
        ("isVirtual", "is_virtual"),
        ("isOperation", "is_operation"),
    ):
        doc[key] = bool(getattr(meta, attr))
    return json.dumps(doc, separators=(",", ":")).encode()
