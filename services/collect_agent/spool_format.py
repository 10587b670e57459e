"""The spool's on-disk record format: framed, checksummed, columnar readings.

A segment file is a sequence of records::

    magic "KSP1" | u32 body_len | u64 seq | u32 crc32(body_len, seq, body) | body

and a body is one of ``R`` (a batch of readings), ``M`` (sensor metadata as
JSON) or ``J`` (a job record as JSON). A readings body is columnar so that
encoding and decoding a group commit of many thousand readings is a handful
of numpy calls::

    "R" | u32 n_series | u32 n_readings | u32 names_len
        | names (UTF-8, NUL-separated; NUL cannot occur in a sensor name)
        | u32 count[n_series] | i64 timestamp_ns[n_readings] | f64 value[n_readings]
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata

MAGIC = b"KSP1"
HEADER = struct.Struct("<4sIQI")
"""magic, body length, sequence number, crc32 of length, sequence number and body."""
_COVERED = struct.Struct("<IQ")
_READINGS_HEAD = struct.Struct("<III")

READINGS, METADATA, JOB = ord("R"), ord("M"), ord("J")


class CorruptRecord(Exception):
    """A record fails its checksum or framing (torn write at a crash, or damage)."""


def _crc(length: int, seq: int, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(_COVERED.pack(length, seq)))


def frame(seq: int, body: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(body), seq, _crc(len(body), seq, body)) + body


def encode_readings(batch: Batch) -> bytes:
    blob = "\x00".join(batch.sensors).encode("utf-8")
    return b"".join(
        (
            b"R",
            _READINGS_HEAD.pack(batch.series_count, len(batch), len(blob)),
            blob,
            batch.counts.astype("<u4").tobytes(),
            batch.timestamps_ns.astype("<i8", copy=False).tobytes(),
            batch.values.astype("<f8", copy=False).tobytes(),
        )
    )


def encode_metadata(meta: SensorMetadata) -> bytes:
    # exclude_unset keeps the merge semantics of put_metadata on replay.
    return b"M" + meta.model_dump_json(exclude_unset=True).encode()


def encode_job(job: JobRecord) -> bytes:
    return b"J" + job.model_dump_json().encode()


def readings_count(body: bytes | memoryview) -> int:
    """Readings in a body without decoding it (0 for metadata and jobs)."""
    if body[0] != READINGS:
        return 0
    return int(_READINGS_HEAD.unpack_from(body, 1)[1])


def decode(body: bytes | memoryview) -> Batch | SensorMetadata | JobRecord:
    kind = body[0]
    if kind == READINGS:
        n_series, n_readings, names_len = _READINGS_HEAD.unpack_from(body, 1)
        pos = 1 + _READINGS_HEAD.size
        names = bytes(body[pos : pos + names_len]).decode("utf-8").split("\x00") if n_series else []
        pos += names_len
        counts = np.frombuffer(body, dtype="<u4", count=n_series, offset=pos).astype(np.int64)
        pos += 4 * n_series
        ts = np.frombuffer(body, dtype="<i8", count=n_readings, offset=pos).astype(np.int64)
        pos += 8 * n_readings
        vs = np.frombuffer(body, dtype="<f8", count=n_readings, offset=pos).astype(np.float64)
        offsets = np.zeros(n_series + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Batch(names, offsets, ts, vs)
    if kind == METADATA:
        return SensorMetadata.model_validate_json(bytes(body[1:]))
    if kind == JOB:
        return JobRecord.model_validate_json(bytes(body[1:]))
    raise CorruptRecord(f"unknown spool record kind {kind!r}")


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a segment that are no record: skipped on replay and set aside."""

    offset: int
    size: int
    incomplete: bool
    """The span ends the file and starts with a record cut short: a write that was
    interrupted (a crash, a failed write), not one the agent acknowledged."""
    records: int
    """Records whose headers can still be read in the span (a damaged header hides one)."""
    readings: int
    """Readings those headers' bodies claim (best effort: the damage may have hit them)."""


def _valid_at(data: bytes, view: memoryview, pos: int) -> tuple[int, int, int] | None:
    """(seq, body_offset, body_len) if a whole record with a good CRC starts at ``pos``."""
    if pos + HEADER.size > len(data):
        return None
    magic, length, seq, crc = HEADER.unpack_from(data, pos)
    body_at = pos + HEADER.size
    if magic != MAGIC or body_at + length > len(data):
        return None
    if _crc(length, seq, view[body_at : body_at + length]) != crc:
        return None
    return seq, body_at, length


def header_crc(data: bytes | memoryview, body_offset: int) -> int:
    """The CRC field of the record whose body starts at ``body_offset``."""
    return int(HEADER.unpack_from(data, body_offset - HEADER.size)[3])


def _damage(data: bytes, start: int, end: int) -> Damage:
    records = readings = 0
    pos = start if data.startswith(MAGIC, start) else data.find(MAGIC, start + 1, end)
    incomplete = False
    while pos != -1 and pos + HEADER.size <= end:
        _, length, _, _ = HEADER.unpack_from(data, pos)
        body_at = pos + HEADER.size
        records += 1
        if body_at + length > len(data) and pos == start and end == len(data):
            incomplete = True
        if min(length, len(data) - body_at) > _READINGS_HEAD.size and data[body_at] == READINGS:
            n = _READINGS_HEAD.unpack_from(data, body_at + 1)[1]
            readings += n if 16 * n <= length else 0  # a count the body cannot hold is damage
        pos = data.find(MAGIC, pos + 1, end)
    if end == len(data) and end - start < HEADER.size and not records:
        incomplete = True  # a header cut short
    return Damage(start, end - start, incomplete, records, readings)


def scan(data: bytes) -> tuple[list[tuple[int, int, int]], list[Damage]]:
    """Walk a segment's bytes: its intact records [(seq, body_offset, body_len)] and the
    damaged spans between them.

    After a record that fails its framing or CRC, the walk resynchronises on the next
    offset where a whole record with a good CRC starts and goes on from there, so one
    damaged record costs only itself.
    """
    out: list[tuple[int, int, int]] = []
    damage: list[Damage] = []
    view = memoryview(data)
    pos, n = 0, len(data)
    while pos < n:
        rec = _valid_at(data, view, pos)
        if rec is not None:
            out.append(rec)
            pos = rec[1] + rec[2]
            continue
        nxt = data.find(MAGIC, pos + 1)
        while nxt != -1 and _valid_at(data, view, nxt) is None:
            nxt = data.find(MAGIC, nxt + 1)
        end = n if nxt == -1 else nxt
        damage.append(_damage(data, pos, end))
        pos = end
    return out, damage


def check(frame_bytes: bytes, seq: int) -> bytes:
    """The body of a record read back from disk (header + body), CRC checked."""
    rec = _valid_at(frame_bytes, memoryview(frame_bytes), 0)
    if rec is None or rec[0] != seq or rec[1] + rec[2] != len(frame_bytes):
        raise CorruptRecord(f"spool record {seq} fails its checksum when read back")
    return frame_bytes[HEADER.size :]
