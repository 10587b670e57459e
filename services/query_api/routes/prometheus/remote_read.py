"""Prometheus remote read (``POST /prometheus/api/v1/read``): Kelvin's sensors as a remote storage.

Configure a Prometheus with ``remote_read: [{url: http://<query-api>:8080/prometheus/api/v1/read}]``
and its PromQL, recording and alerting rules see Kelvin's series (named as in
:mod:`services.common.promnames`). A ``ReadRequest`` (snappy protobuf) holds queries
of label matchers and a millisecond range; the answer is either ``SAMPLES`` (one
snappy ``ReadResponse``) or, when the client accepts it, ``STREAMED_XOR_CHUNKS``:
length-prefixed, CRC32C-checked ``ChunkedReadResponse`` frames of XOR chunks of at
most 120 samples, written series by series so memory holds one frame.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import cramjam
import google_crc32c
import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from services.common import prompb, xorchunk
from services.common.promnames import Labels
from services.query_api.context import ApiContext
from services.query_api.promql import EvalError
from services.query_api.promql.regex import Matcher, RegexError
from services.query_api.promql.source import KelvinSource, RawSeries
from services.query_api.routes.prometheus.query import fail

MAX_FRAME_BYTES = 1 << 20
"""Prometheus' default ``maxBytesInFrame`` for streamed responses."""
STREAM_TYPE = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"


def _ms(series: RawSeries) -> tuple[np.ndarray, np.ndarray]:
    """Samples on Prometheus' millisecond grid (the last of several in one ms wins)."""
    ms = series.ts // 1_000_000
    if ms.shape[0] > 1 and bool((ms[1:] == ms[:-1]).any()):
        keep = np.ones(ms.shape[0], dtype=bool)
        keep[:-1] = ms[1:] != ms[:-1]
        return ms[keep], series.vs[keep]
    return ms, series.vs


async def _select(ctx: ApiContext, q: prompb.Query) -> list[RawSeries]:
    try:
        matchers = [Matcher.make(n, op, v) for n, op, v in q.matchers]
    except RegexError as exc:
        raise EvalError(str(exc)) from None
    if not any(not m.matches("") for m in matchers):
        raise EvalError("a remote read query needs at least one matcher that is not empty")
    source = KelvinSource(ctx.reader, ctx.settings.prometheus_max_series)
    found = await source.select(matchers, q.start_ms * 1_000_000, q.end_ms * 1_000_000 + 999_999)
    total = sum(s.ts.shape[0] for s in found)
    if total > ctx.settings.prometheus_max_samples:  # Prometheus' remote_read_sample_limit
        raise EvalError(
            f"exceeded sample limit ({ctx.settings.prometheus_max_samples}): {total} samples"
        )
    return found


def _chunks(ts: np.ndarray, vs: np.ndarray) -> list[bytes]:
    out = []
    for a in range(0, ts.shape[0], xorchunk.SAMPLES_PER_CHUNK):
        t, v = ts[a : a + xorchunk.SAMPLES_PER_CHUNK], vs[a : a + xorchunk.SAMPLES_PER_CHUNK]
        out.append(prompb.chunk(int(t[0]), int(t[-1]), xorchunk.encode(t, v)))
    return out


def _frame(message: bytes) -> bytes:
    crc = int(google_crc32c.value(message)).to_bytes(4, "big")
    return prompb.put_varint(len(message)) + crc + message


async def _stream(ctx: ApiContext, queries: list[prompb.Query]) -> AsyncIterator[bytes]:
    for index, q in enumerate(queries):
        pending: list[bytes] = []
        size = 0
        for s in await _select(ctx, q):
            ts, vs = _ms(s)
            if not ts.shape[0]:
                continue
            labels: Labels = s.labels
            chunks = _chunks(ts, vs)
            # a series larger than a frame continues in the next one, under its labels again
            part: list[bytes] = []
            for c in chunks:
                if part and size + sum(map(len, part)) + len(c) > MAX_FRAME_BYTES:
                    pending.append(prompb.chunked_series(labels, part))
                    yield _frame(prompb.chunked_read_response(pending, index))
                    pending, part, size = [], [], 0
                part.append(c)
            body = prompb.chunked_series(labels, part)
            if pending and size + len(body) > MAX_FRAME_BYTES:
                yield _frame(prompb.chunked_read_response(pending, index))
                pending, size = [], 0
            pending.append(body)
            size += len(body)
        if pending:
            yield _frame(prompb.chunked_read_response(pending, index))


def router(ctx: ApiContext, read: object) -> APIRouter:
    r = APIRouter(prefix="/prometheus/api/v1", tags=["prometheus"], dependencies=[read])  # type: ignore[list-item]

    @r.post("/read", summary="Prometheus remote read (snappy protobuf; samples or streamed chunks)")
    async def remote_read(request: Request) -> Response:
        ctx.metrics.requests.labels("prometheus_remote_read").inc()
        body = await request.body()
        try:
            req = prompb.read_request(bytes(cramjam.snappy.decompress_raw(body)))
        except Exception as exc:  # snappy or protobuf: the client sent something else
            return fail(ctx, "bad_data", f"remote read request does not decode: {exc}")
        accepted = req.accepted or [prompb.SAMPLES]
        kind = next(
            (a for a in accepted if a in (prompb.SAMPLES, prompb.STREAMED_XOR_CHUNKS)), None
        )
        if kind is None:
            return fail(
                ctx, "bad_data",
                f"server does not support any of the requested response types: {accepted}; "
                "supported: [SAMPLES STREAMED_XOR_CHUNKS]",
            )  # fmt: skip
        try:
            if kind == prompb.STREAMED_XOR_CHUNKS:
                for q in req.queries:  # refuse bad matchers before the first byte is sent
                    [Matcher.make(n, op, v) for n, op, v in q.matchers]
                return StreamingResponse(_stream(ctx, req.queries), media_type=STREAM_TYPE)
            results = []
            for q in req.queries:
                series = []
                for s in await _select(ctx, q):
                    ts, vs = _ms(s)
                    if ts.shape[0]:
                        series.append(prompb.time_series(s.labels, ts, vs))
                results.append(series)
        except (EvalError, RegexError) as exc:
            return fail(ctx, "bad_data", str(exc))
        payload = bytes(cramjam.snappy.compress_raw(prompb.read_response(results)))
        return Response(
            payload,
            media_type="application/x-protobuf",
            headers={"Content-Encoding": "snappy"},
        )

    return r
