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


def scan(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """Walk a segment's bytes: ([(seq, body_offset, body_len)], end of the last good record).

    Stops at the first torn or damaged record; the caller decides what to do
    with the bytes after it.
    """
    out: list[tuple[int, int, int]] = []
    pos = 0
    n = len(data)
    while pos + HEADER.size <= n:
        magic, length, seq, crc = HEADER.unpack_from(data, pos)
        body_at = pos + HEADER.size
        if magic != MAGIC or body_at + length > n:
            break
        if _crc(length, seq, memoryview(data)[body_at : body_at + length]) != crc:
            break
        out.append((seq, body_at, length))
        pos = body_at + length
    return out, pos
