"""Wire formats between pushers and collect agents, vectorised with numpy.

Formats (see ``docs/wire-format.md``):

* **DCDB records**: N x 16 bytes little-endian, ``int64 value, uint64 timestamp_ns``;
  topic = sensor name. A payload of exactly 8 bytes is one int64 value that the
  receiver timestamps. Values are integers; the sensor's ``scale`` makes them physical.
* **Kelvin batch** (``KVB1``): many sensors in one PUBLISH on topic
  ``/KELVIN_BATCH/`` + prefix; columnar, float64 values, names relative to the prefix.
* **JSON**: ``{"ts": .., "value": ..}`` or a list of them; ``ts`` in ns (or any
  epoch unit, guessed by magnitude), optional (receipt time).
* **Control topics**: ``/DCDB_MAP/<topic>`` (public name),
  ``/DCDB_MAP/METADATA/<topic>`` (JSON metadata), ``/DCDB_JOBDATA/`` (JSON job).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from services.common import names
from services.common.errors import PayloadError, SensorNameError
from services.common.metadata_json import metadata_payload
from services.common.readings import Batch, Float64Array, Int64Array
from services.common.sensors import JobRecord, SensorMetadata

DCDB_RECORD = np.dtype([("value", "<i8"), ("ts", "<u8")])
MAP_PREFIX = "/DCDB_MAP/"
METADATA_PREFIX = "/DCDB_MAP/METADATA/"
JOBDATA_PREFIX = "/DCDB_JOBDATA/"
BATCH_PREFIX = "/KELVIN_BATCH/"
BATCH_MAGIC = b"KVB1"
_BATCH_HEAD = struct.Struct("<4sII")  # magic, n_series, n_readings
BATCH_HEAD_BYTES = _BATCH_HEAD.size

MAX_DCDB_RECORDS = 1 << 20
"""Refuse absurd payloads before allocating (16 MiB of records)."""


class TopicKind(Enum):
    """What a PUBLISH topic carries."""

    DATA = "data"
    BATCH = "batch"
    MAP = "map"
    METADATA = "metadata"
    JOBDATA = "jobdata"


def classify(topic: str) -> tuple[TopicKind, str]:
    """Split a topic into its kind and the sensor name or prefix it refers to.

    Raises SensorNameError for an invalid name and PayloadError(reason
    ``unknown_control_topic``) for an unknown upper-case control topic.
    """
    if topic.startswith(BATCH_PREFIX):
        prefix = topic[len(BATCH_PREFIX) :] or "/"
        return TopicKind.BATCH, names.validate_prefix(prefix)
    if topic.startswith(METADATA_PREFIX):
        return TopicKind.METADATA, names.validate(_rooted(topic[len(METADATA_PREFIX) :]))
    if topic.startswith(MAP_PREFIX):
        return TopicKind.MAP, names.validate(_rooted(topic[len(MAP_PREFIX) :]))
    if topic.startswith(JOBDATA_PREFIX) or topic == JOBDATA_PREFIX[:-1]:
        return TopicKind.JOBDATA, ""
    if topic.startswith(("/DCDB_", "/KELVIN_")):
        raise PayloadError(f"unknown control topic {topic[:80]!r}", "unknown_control_topic")
    return TopicKind.DATA, names.validate(topic)


def _rooted(rest: str) -> str:
    # The wire form is prefix + name (``/DCDB_MAP//a/b``); some pushers drop the
    # name's own leading slash (``/DCDB_MAP/a/b``). Both mean ``/a/b``.
    return rest if rest.startswith("/") else "/" + rest


# --------------------------------------------------------------------------- DCDB


def encode_dcdb(values: npt.ArrayLike, timestamps_ns: npt.ArrayLike) -> bytes:
    """Encode integer values and ns timestamps as DCDB 16-byte records."""
    v = np.asarray(values)
    t = np.asarray(timestamps_ns)
    if v.shape != t.shape:
        raise ValueError("values and timestamps must have the same shape")
    rec = np.empty(v.shape[0], dtype=DCDB_RECORD)
    rec["value"] = np.rint(v) if v.dtype.kind == "f" else v
    rec["ts"] = t
    return rec.tobytes()


def decode_dcdb(payload: bytes | memoryview, received_ns: int) -> tuple[Int64Array, Float64Array]:
    """Decode a DCDB data payload into (timestamps_ns, raw integer values as float64).

    ``received_ns`` timestamps the 8-byte single-value form. The caller applies
    the sensor's scale.
    """
    n = len(payload)
    if n == 8:
        value = np.frombuffer(payload, dtype="<i8").astype(np.float64)
        return np.array([received_ns], dtype=np.int64), value
    if n == 0 or n % 16:
        raise PayloadError(
            f"DCDB payload of {n} bytes: expected 8 bytes or a positive multiple of 16",
            "bad_length",
        )
    if n // 16 > MAX_DCDB_RECORDS:
        raise PayloadError(f"DCDB payload of {n // 16} records is too large", "too_large")
    rec = np.frombuffer(payload, dtype=DCDB_RECORD)
    ts = rec["ts"].astype(np.int64)
    if bool((ts < 0).any()):
        raise PayloadError("DCDB timestamp beyond int64 nanoseconds", "bad_timestamp")
    return ts, rec["value"].astype(np.float64)


def decode_dcdb_many(
    payloads: Sequence[bytes], received_ns: int
) -> tuple[Int64Array, Float64Array, Int64Array]:
    """Decode many well-formed 16-byte-multiple payloads at once.

    Joining first and decoding once is ~10x cheaper than one numpy call per
    payload when each carries a single reading. Returns (ts, raw values, offsets).
    Payloads must already be length-checked (multiples of 16, or 8).
    """
    lens = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    if bool(np.all(lens % 16 == 0)) and bool(np.all(lens > 0)):
        rec = np.frombuffer(b"".join(payloads), dtype=DCDB_RECORD)
        offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
        np.cumsum(lens // 16, out=offsets[1:])
        return rec["ts"].astype(np.int64), rec["value"].astype(np.float64), offsets
    parts = [decode_dcdb(p, received_ns) for p in payloads]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p[0]) for p in parts], out=offsets[1:])
    return (
        np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64),
        np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.float64),
        offsets,
    )


# --------------------------------------------------------------------------- Kelvin batch


def encode_batch(prefix: str, batch: Batch) -> tuple[str, bytes]:
    """Encode a batch whose sensors all lie under ``prefix`` as one KVB1 PUBLISH.

    Returns (topic, payload). Layout (little-endian)::

        magic "KVB1" | u32 n_series | u32 n_readings
        u32 count[n_series] | u16 name_len[n_series] | names (UTF-8, relative to prefix)
        i64 timestamp_ns[n_readings] | f64 value[n_readings]
    """
    base = "" if prefix == "/" else prefix
    rel: list[bytes] = []
    for s in batch.sensors:
        if not names.is_under(s, prefix):
            raise ValueError(f"sensor {s!r} is not under prefix {prefix!r}")
        rel.append(s[len(base) :].encode("utf-8"))
    return BATCH_PREFIX + ("" if prefix == "/" else prefix), encode_batch_rel(rel, batch)


def encode_batch_rel(rel_names: Sequence[bytes], batch: Batch) -> bytes:
    """Encode with names already relative to the prefix and UTF-8 encoded."""
    lens = np.fromiter((len(r) for r in rel_names), dtype="<u2", count=len(rel_names))
    return encode_batch_columns(
        batch.counts, lens, b"".join(rel_names), batch.timestamps_ns, batch.values
    )


def encode_batch_columns(
    counts: npt.NDArray[np.integer[Any]],
    name_lens: npt.NDArray[np.integer[Any]],
    names_blob: bytes,
    timestamps_ns: Int64Array,
    values: Float64Array,
) -> bytes:
    """A KVB1 payload from its columns (the pusher slices precomputed ones per message)."""
    return b"".join(
        (
            _BATCH_HEAD.pack(BATCH_MAGIC, counts.shape[0], timestamps_ns.shape[0]),
            counts.astype("<u4", copy=False).tobytes(),
            name_lens.astype("<u2", copy=False).tobytes(),
            names_blob,
            timestamps_ns.astype("<i8", copy=False).tobytes(),
            values.astype("<f8", copy=False).tobytes(),
        )
    )


def decode_batch(prefix: str, payload: bytes | memoryview) -> Batch:
    """Decode a KVB1 payload published under ``/KELVIN_BATCH/<prefix>``."""
    mv = memoryview(payload)
    n = len(mv)
    if n < _BATCH_HEAD.size:
        raise PayloadError(f"batch payload of {n} bytes is shorter than its header", "bad_length")
    magic, n_series, n_readings = _BATCH_HEAD.unpack_from(mv, 0)
    if magic != BATCH_MAGIC:
        raise PayloadError(
            f"batch payload starts with {bytes(magic)!r}, expected b'KVB1'", "bad_magic"
        )
    pos = _BATCH_HEAD.size
    fixed = pos + 6 * n_series + 16 * n_readings
    if fixed > n:
        raise PayloadError(
            f"batch payload of {n} bytes cannot hold {n_series} series / {n_readings} readings",
            "bad_length",
        )
    counts = np.frombuffer(mv, dtype="<u4", count=n_series, offset=pos).astype(np.int64)
    pos += 4 * n_series
    lens = np.frombuffer(mv, dtype="<u2", count=n_series, offset=pos).astype(np.int64)
    pos += 2 * n_series
    names_len = int(lens.sum())
    if int(counts.sum()) != n_readings or fixed + names_len != n:
        raise PayloadError("batch payload counts do not match its length", "bad_length")
    raw = bytes(mv[pos : pos + names_len])
    pos += names_len
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(
            "batch payload has a sensor name that is not UTF-8", "bad_topic"
        ) from exc
    base = "" if prefix == "/" else prefix
    sensors: list[str] = []
    if text.isascii():
        ends = np.cumsum(lens)
        starts = ends - lens
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            sensors.append(_batch_name(base, prefix, text[a:b]))
    else:
        off = 0
        for ln in lens.tolist():
            sensors.append(_batch_name(base, prefix, raw[off : off + ln].decode("utf-8")))
            off += ln
    ts = np.frombuffer(mv, dtype="<i8", count=n_readings, offset=pos).astype(np.int64)
    vs = np.frombuffer(mv, dtype="<f8", count=n_readings, offset=pos + 8 * n_readings).astype(
        np.float64
    )
    offsets = np.zeros(n_series + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return Batch(sensors, offsets, ts, vs)


def _batch_name(base: str, prefix: str, rel: str) -> str:
    if rel and rel[0] != "/":
        # "0/power" under /node1 would name /node10/power: outside the batch's prefix,
        # which is what the collect agent's ACL checked.
        raise PayloadError(
            f"batch sensor name {rel[:80]!r} under {prefix!r} must be empty or start with '/'",
            "bad_topic",
        )
    try:
        return names.validate(base + rel if rel else prefix)
    except SensorNameError as exc:
        raise PayloadError(str(exc), "bad_topic") from exc


# --------------------------------------------------------------------------- JSON


def decode_json(payload: bytes | memoryview, received_ns: int) -> tuple[Int64Array, Float64Array]:
    """Decode ``{"ts": .., "value": ..}`` or a list of such objects (or bare numbers)."""
    try:
        doc = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"JSON payload does not parse: {exc}", "bad_json") from exc
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise PayloadError("JSON payload is an empty list", "bad_json")
    ts = np.empty(len(items), dtype=np.int64)
    vs = np.empty(len(items), dtype=np.float64)
    for i, item in enumerate(items):
        if isinstance(item, int | float) and not isinstance(item, bool):
            ts[i], vs[i] = received_ns, _number(item, i)
            continue
        if not isinstance(item, dict) or "value" not in item:
            raise PayloadError(
                f"JSON reading {i} must be an object with a 'value' key, got {str(item)[:60]}",
                "bad_json",
            )
        value = item["value"]
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise PayloadError(f"JSON reading {i}: 'value' must be a number", "bad_json")
        vs[i] = _number(value, i)
        raw_ts = item.get("ts", item.get("timestamp"))
        ts[i] = received_ns if raw_ts is None else epoch_to_ns(raw_ts)
    return ts, vs


def _number(value: int | float | str, i: int) -> float:
    try:
        return float(value)
    except (ValueError, OverflowError) as exc:
        raise PayloadError(
            f"JSON reading {i}: 'value' {str(value)[:40]!r} is not a float64 number", "bad_json"
        ) from exc


def epoch_to_ns(value: Any) -> int:
    """An epoch in s, ms, µs or ns (guessed by magnitude, as DCDB does) to ns."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PayloadError(f"timestamp {value!r} is not a number", "bad_timestamp")
    v: int | float
    if isinstance(value, str):
        text = value.strip()
        try:
            v = int(text) if text.lstrip("-").isdecimal() else float(text)
        except ValueError as exc:
            raise PayloadError(f"timestamp {value!r} is not a number", "bad_timestamp") from exc
    else:
        v = value  # a float keeps its fraction: 1764500000.25 s is a quarter second later
    if v != v or v < 0:
        raise PayloadError(f"timestamp {value!r} must be a non-negative epoch", "bad_timestamp")
    if isinstance(v, float) and math.isinf(v):
        raise PayloadError(f"timestamp {value!r} is not a finite number", "bad_timestamp")
    mag = abs(v)
    if mag < 1e11:  # seconds (up to year 5138; int64 ns end in 2262)
        ns = _times(v, 1_000_000_000)
    elif mag < 1e14:
        ns = _times(v, 1_000_000)
    elif mag < 1e17:
        ns = _times(v, 1_000)
    else:
        ns = int(v)
    if ns >= 2**63:
        raise PayloadError(f"timestamp {value!r} beyond int64 nanoseconds", "bad_timestamp")
    return ns


def _times(v: int | float, unit_ns: int) -> int:
    if isinstance(v, int):
        return v * unit_ns
    # Whole and fraction apart: v * 1e9 in float64 would be off by up to 128 ns.
    whole = math.floor(v)
    return whole * unit_ns + round((v - whole) * unit_ns)


# --------------------------------------------------------------------------- control topics


def decode_metadata(sensor: str, payload: bytes | memoryview) -> SensorMetadata:
    """Decode ``/DCDB_MAP/METADATA/<sensor>``: a JSON object of DCDB metadata keys."""
    try:
        doc = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"metadata for {sensor} is not JSON: {exc}", "bad_json") from exc
    if not isinstance(doc, dict):
        raise PayloadError(f"metadata for {sensor} must be a JSON object", "bad_metadata")
    doc = {k: v for k, v in doc.items() if k != "name"}
    try:
        return SensorMetadata.model_validate({"name": sensor, **doc})
    except ValidationError as exc:
        # A NaN/infinite scale has its own reason: it would null every later reading.
        finite = any(e["type"] == "finite_number" for e in exc.errors())
        reason = "non_finite" if finite else "bad_metadata"
        raise PayloadError(f"metadata for {sensor}: {_first_error(exc)}", reason) from exc


def decode_public_name(sensor: str, payload: bytes | memoryview) -> SensorMetadata:
    """Decode ``/DCDB_MAP/<sensor>``: the payload is the sensor's public name."""
    try:
        public = bytes(payload).decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise PayloadError(f"public name for {sensor} is not UTF-8", "bad_metadata") from exc
    return SensorMetadata(name=sensor, public_name=public or None)


def encode_metadata(meta: SensorMetadata) -> tuple[str, bytes]:
    """The DCDB metadata PUBLISH for a sensor: (topic, JSON payload)."""
    return METADATA_PREFIX + meta.name, metadata_payload(meta)


def decode_job(payload: bytes | memoryview) -> JobRecord:
    """Decode ``/DCDB_JOBDATA/``: ``{jobid, domainid, userid, starttime, endtime, nodes}``."""
    try:
        doc = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"job record is not JSON: {exc}", "bad_json") from exc
    if not isinstance(doc, dict):
        raise PayloadError("job record must be a JSON object", "bad_job")
    try:
        return JobRecord.model_validate(doc)
    except ValidationError as exc:
        raise PayloadError(f"job record: {_first_error(exc)}", "bad_job") from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "payload"
    return f"{loc}: {err['msg']}"


def _looks_like_json(payload: bytes | memoryview) -> bool:
    # The last byte of a DCDB record is the top byte of a ns timestamp (0x17-0x1f
    # for this century), never '}' or ']', so this cannot mistake current DCDB data.
    head = bytes(payload[:1])
    if head not in (b"{", b"[", b" ", b"\n"):
        return False
    stripped = bytes(payload).strip()
    return stripped[:1] in (b"{", b"[") and stripped[-1:] in (b"}", b"]")


@dataclass(frozen=True, slots=True)
class Decoded:
    """Result of decoding one PUBLISH: readings and/or metadata and/or a job."""

    batch: Batch | None = None
    metadata: SensorMetadata | None = None
    job: JobRecord | None = None
    raw_integers: bool = False
    """True when values are DCDB integers that still need the sensor's scale."""


def decode_publish(topic: str, payload: bytes | memoryview, received_ns: int) -> Decoded:
    """Decode any supported PUBLISH. Raises PayloadError (with a reason) on bad input."""
    try:
        kind, name = classify(topic)
    except SensorNameError as exc:
        raise PayloadError(str(exc), "bad_topic") from exc
    if kind is TopicKind.DATA:
        if _looks_like_json(payload):
            try:
                ts, vs = decode_json(payload, received_ns)
                return Decoded(batch=Batch.single(name, ts, vs))
            except PayloadError:
                # A binary payload can start with '{' by chance. It is DCDB data
                # only if its length fits and its last byte is not '}' or ']':
                # that byte is the top byte of a timestamp (0x17-0x1f this
                # century; ']' would be the year 2182) or of an 8-byte value.
                if (len(payload) != 8 and len(payload) % 16) or payload[-1] in b"}]":
                    raise
        ts, vs = decode_dcdb(payload, received_ns)
        return Decoded(batch=Batch.single(name, ts, vs), raw_integers=True)
    if kind is TopicKind.BATCH:
        return Decoded(batch=decode_batch(name, payload))
    if kind is TopicKind.METADATA:
        return Decoded(metadata=decode_metadata(name, payload))
    if kind is TopicKind.MAP:
        return Decoded(metadata=decode_public_name(name, payload))
    return Decoded(job=decode_job(payload))
