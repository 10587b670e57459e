"""Prometheus remote write 1.0 (``POST /api/v1/write``): snappy-compressed protobuf in, readings out.

A ``WriteRequest`` holds ``TimeSeries`` (labels, samples in ms). Each series is
stored as the sensor :func:`services.common.promnames.sensor_name` names: its
``sensor`` label if it has one, else ``<remote_write_prefix>/<metric>/<label>=<value>/...``,
which the query API maps back to the same labels. Readings go through the same
ingest path as MQTT and ``/write``: the answer (204) is sent once the spool has
them durable; a full spool or a draining agent answers 503 (Prometheus retries),
a body that does not decode 400 (Prometheus drops it), and series that cannot be
stored (bad names, native histograms) are counted by reason and named in a 400
after the rest was stored.

The protobuf decoder is hand-written for the three messages remote write uses
(about 60 lines; the ``protobuf`` package would cost a generated module and a
Python object per sample): a series' labels are looked up by their raw bytes, so
a known series costs one dictionary lookup, and runs of regular samples are read
by numpy.
"""

from __future__ import annotations

import re
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import cramjam
import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.collect_agent.spool import SpoolError
from services.common import names, prompb
from services.common.auth import Role
from services.common.errors import SensorNameError
from services.common.http import read_capped, requires
from services.common.promnames import sensor_name
from services.common.readings import Batch
from services.common.tasks import wait_for

if TYPE_CHECKING:
    from services.collect_agent.app import CollectAgent

ADMIT_TIMEOUT_S = 10.0
_MAX_NS_MS = (2**63 - 1) // 1_000_000
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_DOUBLE = struct.Struct("<d")


class DecodeError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Decoded:
    """Series and samples of one request, gathered flat (one numpy pass decodes them)."""

    sensors: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    first_error: str = ""
    # per sample, in series order: where its double and its timestamp varint start
    # (regular samples), or -1 and the decoded values in `slow_*` (irregular ones)
    value_at: list[int] = field(default_factory=list)
    time_at: list[int] = field(default_factory=list)
    slow_t: list[int] = field(default_factory=list)
    slow_v: list[float] = field(default_factory=list)
    buf: bytes = b""

    def reject(self, reason: str, message: str, n: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + n
        self.first_error = self.first_error or message

    def batch(self) -> Batch:
        if not self.sensors:
            return Batch.empty()
        offsets = np.zeros(len(self.sensors) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=offsets[1:])
        vpos = np.asarray(self.value_at, dtype=np.int64)
        tpos = np.asarray(self.time_at, dtype=np.int64)
        fast = vpos >= 0
        raw = np.frombuffer(self.buf + bytes(10), dtype=np.uint8)
        vs = np.empty(vpos.shape[0])
        ts = np.empty(vpos.shape[0], dtype=np.int64)
        if bool(fast.any()):
            vs[fast] = raw[vpos[fast][:, None] + np.arange(8)].copy().view("<f8").ravel()
            ts[fast] = _varints_at(raw, tpos[fast])
        if not bool(fast.all()):
            slow = ~fast
            vs[slow] = self.slow_v
            ts[slow] = self.slow_t
        bad = (ts > _MAX_NS_MS) | (ts < -_MAX_NS_MS)
        if bool(bad.any()):  # beyond int64 ns: drop those samples only
            self.reject(
                "bad_timestamp", "a sample timestamp beyond int64 nanoseconds", int(bad.sum())
            )
            series = np.repeat(np.arange(len(self.sensors)), np.diff(offsets))
            counts = np.bincount(series[~bad], minlength=len(self.sensors))
            offsets = np.zeros(len(self.sensors) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            ts, vs = ts[~bad], vs[~bad]
        return Batch(self.sensors, offsets, ts * 1_000_000, vs)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    try:
        return prompb.varint(buf, pos)
    except prompb.ProtobufError as exc:
        raise DecodeError("bad_protobuf", str(exc)) from None


def _skip(buf: bytes, pos: int, wire: int) -> int:
    try:
        return prompb.skip(buf, pos, wire)
    except prompb.ProtobufError as exc:
        raise DecodeError("bad_protobuf", str(exc)) from None


def _varints_at(raw: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Signed int64 varints starting at ``pos`` (``raw`` padded so 10 bytes can be read)."""
    window = raw[pos[:, None] + np.arange(10)].astype(np.uint64)
    cont = (window & np.uint64(0x80)) != 0
    # bytes up to and including the first one without the continuation bit
    keep = np.cumprod(
        np.concatenate([np.ones((pos.shape[0], 1), bool), cont[:, :-1]], axis=1), axis=1
    )
    shifts = np.uint64(7) * np.arange(10, dtype=np.uint64)
    value = ((window & np.uint64(0x7F)) << shifts) * keep.astype(np.uint64)
    return np.asarray(value.sum(axis=1, dtype=np.uint64)).view(np.int64)


class Decoder:
    """Decodes WriteRequests; remembers each series' sensor name by its label bytes."""

    def __init__(self, prefix: str, max_series: int = 200_000) -> None:
        self.prefix = prefix
        self.max_series = max_series
        self._names: dict[bytes, str | tuple[str, str]] = {}

    def decode(self, buf: bytes) -> Decoded:
        out = Decoded(buf=buf)
        pos, end = 0, len(buf)
        while pos < end:
            tag = buf[pos]
            if tag == 0x0A:  # field 1: TimeSeries
                n = buf[pos + 1] if pos + 1 < end else 0x80
                if n < 0x80:
                    pos += 2
                else:
                    n, pos = _varint(buf, pos + 1)
                stop = pos + n
                if stop > end:
                    raise DecodeError("bad_protobuf", "TimeSeries runs past the end of the body")
                self._series(buf, pos, stop, out)
                pos = stop
            else:  # metadata (3) and anything newer: not stored
                tag, pos = _varint(buf, pos)
                pos = _skip(buf, pos, tag & 7)
        if pos != end:
            raise DecodeError("bad_protobuf", "a field runs past the end of the body")
        return out

    def _series(self, buf: bytes, pos: int, end: int, out: Decoded) -> None:
        start = pos
        while pos < end and buf[pos] == 0x0A:  # labels first, as every sender writes them
            n = buf[pos + 1]
            if n < 0x80:
                pos += 2 + n
            else:
                n, p = _varint(buf, pos + 1)
                pos = p + n
        labels = buf[start:pos]
        value_at, time_at = out.value_at, out.time_at
        count = slow = 0
        while pos < end:
            # the common Sample: 12 <len> 09 <8-byte double> 10 <varint ms>
            if (
                buf[pos] == 0x12
                and pos + 12 <= end
                and buf[pos + 2] == 0x09
                and buf[pos + 11] == 0x10
            ):
                n = buf[pos + 1]
                value_at.append(pos + 3)
                time_at.append(pos + 12)
                pos += 2 + n
                count += 1
                continue
            head = pos
            tag, pos = _varint(buf, pos)
            if tag == 0x12:  # an irregular Sample (zero value or time left out, ...)
                n, pos = _varint(buf, pos)
                t, v = _sample(buf, pos, pos + n)
                value_at.append(-1)
                time_at.append(-1)
                out.slow_t.append(t)
                out.slow_v.append(v)
                pos += n
                count += 1
                slow += 1
            elif tag == 0x0A:  # a label after the samples: unusual, still a label
                n, pos = _varint(buf, pos)
                pos += n
                labels += buf[head:pos]
            elif tag == 0x22:  # field 4: native histogram
                n, pos = _varint(buf, pos)
                pos += n
                out.reject(
                    "native_histogram", "native histograms are not stored (float samples only)"
                )
            else:
                pos = _skip(buf, pos, tag & 7)
        if pos != end:
            raise DecodeError("bad_protobuf", "a TimeSeries field runs past its end")
        name = self._names.get(labels)
        if name is None:
            name = self._name_of(labels)
            if len(self._names) >= self.max_series:
                self._names.clear()
            self._names[labels] = name
        if isinstance(name, tuple):  # not stored: take its samples back out
            if count:
                del value_at[-count:], time_at[-count:]
            if slow:
                del out.slow_t[-slow:], out.slow_v[-slow:]
            out.reject(name[0], name[1], max(count, 1))
            return
        if count:
            out.sensors.append(name)
            out.counts.append(count)

    def _name_of(self, raw: bytes) -> str | tuple[str, str]:
        """The sensor for these label bytes, or (reason, message) why there is none."""
        labels: dict[str, str] = {}
        try:
            for num, wire, a, b in prompb.fields(raw):
                if num != 1 or wire != 2:
                    continue
                name, value = self._label(raw, a, b)
                if name in labels:
                    return "bad_labels", f"label {name!r} given twice"
                labels[name] = value
        except (prompb.ProtobufError, UnicodeDecodeError) as exc:
            return "bad_labels", f"labels do not decode: {exc}"
        metric = labels.get("__name__", "")
        if not _METRIC_NAME.fullmatch(metric):
            return "bad_metric_name", f"metric name {metric!r} is not valid"
        for k in labels:
            if not _LABEL_NAME.fullmatch(k):
                return "bad_labels", f"{metric}: label name {k!r} is not valid"
        sensor = sensor_name(labels, self.prefix)
        try:
            names.validate(sensor)
        except SensorNameError as exc:
            return "bad_name", f"{metric}: {exc}"
        return sensor

    @staticmethod
    def _label(buf: bytes, pos: int, end: int) -> tuple[str, str]:
        name = value = ""
        for num, wire, a, b in prompb.fields(buf, pos, end):
            if wire == 2 and num in (1, 2):
                text = buf[a:b].decode("utf-8")
                if num == 1:
                    name = text
                else:
                    value = text
        return name, value


def _sample(buf: bytes, pos: int, end: int) -> tuple[int, float]:
    t, v = 0, 0.0
    while pos < end:
        tag, pos = _varint(buf, pos)
        if tag == 0x09:
            v = _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif tag == 0x10:
            raw, pos = _varint(buf, pos)
            t = prompb.signed(raw)
        else:
            pos = _skip(buf, pos, tag & 7)
    return t, v


def decompress(body: bytes, limit: int) -> bytes:
    """Snappy (block format, as remote write sends it), refusing to expand past ``limit``."""
    try:
        declared, _ = _varint(body, 0)
    except DecodeError:
        raise DecodeError(
            "bad_snappy", "body is not snappy-compressed (no length header)"
        ) from None
    if declared > limit:
        raise DecodeError(
            "too_large", f"body expands to {declared} bytes, over max_payload_bytes={limit}"
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise DecodeError("bad_snappy", f"body does not snappy-decompress: {exc}") from None


def router(agent: CollectAgent) -> APIRouter:
    r = APIRouter()
    decoder = Decoder(agent.settings.remote_write_prefix)
    decode_seconds = agent.metrics.service.histogram(
        "remote_write_decode_seconds",
        "Time to decompress and decode one remote-write request",
        buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
    )

    @r.post(
        "/api/v1/write",
        tags=["prometheus"],
        status_code=204,
        dependencies=[requires(Role.WRITE)],
        summary="Prometheus remote write 1.0 (snappy protobuf); 204 once durable",
    )
    async def remote_write(request: Request) -> Response:
        ing = agent.ingestor
        if getattr(ing, "draining", False):
            return _unavailable("the agent is shutting down; retry against another replica")
        try:
            await wait_for(ing.admitted(), ADMIT_TIMEOUT_S)
        except TimeoutError:
            return _unavailable("spool full (storage behind); retry later")
        limit = agent.settings.max_payload_bytes
        body = await read_capped(request, limit)
        if body is None:
            ing.reject(
                None, "too_large", f"remote write from {request.client}: body over {limit} bytes"
            )
            return JSONResponse(
                {"error": f"body exceeds max_payload_bytes={limit}"}, status_code=413
            )
        started = time.perf_counter()
        try:
            decoded = decoder.decode(decompress(body, limit))
        except DecodeError as exc:
            ing.reject(None, exc.reason, f"remote write from {request.client}: {exc}")
            return JSONResponse({"error": str(exc)}, status_code=400)
        decode_seconds.observe(time.perf_counter() - started)
        for reason, n in decoded.rejected.items():
            ing.reject(None, reason, f"remote write: {decoded.first_error}")  # logs, counts one
            if n > 1:
                ing.metrics.rejected.labels(reason).inc(n - 1)
                ing.rejected[reason] = ing.rejected.get(reason, 0) + n - 1
        batch = decoded.batch()
        try:
            await ing.receive_batch(batch, len(decoded.sensors), "remote_write")
        except SpoolError as exc:
            return _unavailable(str(exc))
        if decoded.rejected:
            total = sum(decoded.rejected.values())
            return JSONResponse(
                {"error": f"{total} sample(s) or series not stored: {decoded.first_error}"},
                status_code=400,
            )
        return Response(status_code=204)

    return r


def _unavailable(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=503, headers={"Retry-After": "5"})
