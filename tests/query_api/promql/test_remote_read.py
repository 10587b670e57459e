"""Remote read: Kelvin's answers against Prometheus' own remote-read server on the same samples.

Both are asked the same ReadRequests (samples and streamed XOR chunks); the streamed
frames are checked (length, CRC32C) and their chunks decoded with
:func:`services.common.xorchunk.decode` — the decoder is first shown to read
Prometheus' own chunks exactly.
"""

from __future__ import annotations

import cramjam
import google_crc32c
import httpx
import numpy as np
import pytest

from services.common import prompb, xorchunk
from tests.query_api.promql import dataset
from tests.query_api.promql.dataset import SPAN_MS, T0_MS

HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
           "X-Prometheus-Remote-Read-Version": "0.1.0"}  # fmt: skip
QUERIES = [
    [("__name__", "=", "node_power")],
    [("__name__", "=~", "node_(energy|odd)"), ("row", "=", "row0")],
    [("sensor", "=", "/dc/row0/rack1/node1/odd")],
    [("__name__", "=", "http_latency_seconds_bucket"), ("le", "!=", "+Inf")],
    [("__name__", "=", "nonexistent")],
]


def ask(url: str, queries: list[prompb.Query], accepted: list[int]) -> httpx.Response:
    req = prompb.encode_read_request(queries, accepted)
    return httpx.post(
        url, content=bytes(cramjam.snappy.compress_raw(req)), headers=HEADERS, timeout=60
    )


def samples_answer(
    r: httpx.Response,
) -> list[dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]]]:
    assert r.status_code == 200, r.text
    buf = bytes(cramjam.snappy.decompress_raw(r.content))
    out = []
    for num, _, a, b in prompb.fields(buf):
        assert num == 1
        result: dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]] = {}
        for _, _, x, y in prompb.fields(buf, a, b):
            labels, ts, vs = [], [], []
            for n3, _, s, e in prompb.fields(buf, x, y):
                if n3 == 1:
                    kv = {k: buf[s2:e2].decode() for k, _, s2, e2 in prompb.fields(buf, s, e)}
                    labels.append((kv.get(1, ""), kv.get(2, "")))
                elif n3 == 2:
                    t, v = 0, 0.0
                    for n4, _, s2, e2 in prompb.fields(buf, s, e):
                        if n4 == 1:
                            v = float(np.frombuffer(buf[s2:e2], "<f8")[0])
                        elif n4 == 2:
                            t = prompb.signed(prompb.varint(buf, s2)[0])
                    ts.append(t)
                    vs.append(v)
            result[tuple(labels)] = (ts, vs)
        out.append(result)
    return out


def streamed_answer(
    r: httpx.Response,
) -> dict[int, dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-streamed-protobuf")
    data = r.content
    pos = 0
    out: dict[int, dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]]] = {}
    while pos < len(data):
        size, pos = prompb.varint(data, pos)
        crc = int.from_bytes(data[pos : pos + 4], "big")
        msg = data[pos + 4 : pos + 4 + size]
        pos += 4 + size
        assert google_crc32c.value(msg) == crc
        series_parts, index = [], 0
        for num, _, a, b in prompb.fields(msg):
            if num == 1:
                series_parts.append((a, b))
            elif num == 2:
                index = prompb.varint(msg, a)[0]
        for a, b in series_parts:
            labels, ts, vs = [], [], []
            for n2, _, x, y in prompb.fields(msg, a, b):
                if n2 == 1:
                    kv = {k: msg[s:e].decode() for k, _, s, e in prompb.fields(msg, x, y)}
                    labels.append((kv.get(1, ""), kv.get(2, "")))
                elif n2 == 2:
                    parts = {k: (s, e) for k, _, s, e in prompb.fields(msg, x, y)}
                    s, e = parts[4]
                    t, v = xorchunk.decode(msg[s:e])
                    lo, hi = (
                        prompb.varint(msg, parts[k][0])[0] if k in parts else 0 for k in (1, 2)
                    )
                    assert (lo, hi) == (t[0], t[-1])
                    ts += t
                    vs += v
            old = out.setdefault(index, {}).get(tuple(labels), ([], []))
            out[index][tuple(labels)] = (old[0] + ts, old[1] + vs)
    return out


def query(i: int, start: int = T0_MS + 600_000, end: int = T0_MS + SPAN_MS) -> prompb.Query:
    return prompb.Query(start, end, QUERIES[i])


def same(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    return a[0] == b[0] and np.array_equal(np.array(a[1]), np.array(b[1]), equal_nan=True)


def test_the_decoder_reads_prometheus_chunks(prom: str) -> None:
    """Prometheus' own streamed chunks decode to exactly the samples it was fed."""
    got = streamed_answer(
        ask(f"{prom}/api/v1/read", [query(0, T0_MS - 60_000, T0_MS + SPAN_MS)], [1])
    )[0]
    want = dataset.samples()
    assert len(got) == 8
    for labels, (ts, vs) in got.items():
        sensor = dict(labels)["sensor"]
        wts, wvs = want[sensor]
        assert ts == (wts // 1_000_000).tolist() and np.array_equal(np.array(vs), wvs)


@pytest.mark.parametrize("i", range(len(QUERIES)))
def test_samples_agree(prom: str, kelvin_api: str, i: int) -> None:
    q = [query(i)]
    p = samples_answer(ask(f"{prom}/api/v1/read", q, [0]))
    k = samples_answer(ask(f"{kelvin_api}/prometheus/api/v1/read", q, [0]))
    assert sorted(k[0]) == sorted(p[0])
    assert all(same(k[0][key], p[0][key]) for key in p[0])


def test_streamed_chunks_agree(prom: str, kelvin_api: str) -> None:
    qs = [query(i) for i in range(len(QUERIES))]
    p = streamed_answer(ask(f"{prom}/api/v1/read", qs, [1, 0]))
    k = streamed_answer(ask(f"{kelvin_api}/prometheus/api/v1/read", qs, [1, 0]))
    assert sorted(k) == sorted(p) and p
    for index, series in p.items():
        assert sorted(k[index]) == sorted(series)
        assert all(same(k[index][key], series[key]) for key in series)


def test_no_request_type_kelvin_knows_is_refused(kelvin_api: str) -> None:
    r = ask(f"{kelvin_api}/prometheus/api/v1/read", [query(0)], [7])
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data"
    r = httpx.post(f"{kelvin_api}/prometheus/api/v1/read", content=b"garbage", headers=HEADERS)
    assert r.status_code == 400
