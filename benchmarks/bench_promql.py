"""PromQL and remote write beside a real Prometheus (and VictoriaMetrics), same samples, one run.

1. Range queries: ``rate``, ``sum by``, ``max_over_time`` and ``histogram_quantile``
   over 1 h and 1 day at 15 s and 1 min steps, on Prometheus 2.42 (samples
   backfilled with promtool) and on ``kelvin run query-api`` (the same samples in
   SQLite), both as their own processes, asked over HTTP. Each query runs once to
   warm up, then ``RUNS`` times alternating; the table gives the median wall time
   and each server's CPU time per query (``/proc/<pid>/stat``), and Kelvin over
   Prometheus. Goal: at most 1.5x.
2. Remote write: ``kelvin run collect-agent`` (SQLite, acknowledged once spooled)
   beside VictoriaMetrics and Prometheus' own receiver, fed the same snappy
   WriteRequests (500 series x 1 sample, as a Prometheus sends; and 100 series x
   20 samples) from 4 connections. Samples per second of wall time and per
   server CPU-second (the one-core figure), Kelvin also with its sensor cache off
   (``cache_window_s: 0``) to show that cost apart. Goal: >= 200k samples/s on one core.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cramjam
import httpx
import numpy as np

from services.common import prompb
from services.common.promnames import series_labels
from services.common.readings import Batch, Series

RUNS = int(os.environ.get("BENCH_PROMQL_RUNS", "5"))
"""Timed runs per query (``BENCH_PROMQL_RUNS``): more on a busy machine, for steadier medians."""
ONLY_1H = os.environ.get("BENCH_PROMQL_ONLY_1H") == "1"
"""Only the 1 h ranges and no remote write (``BENCH_PROMQL_ONLY_1H=1``): the fixed-cost rows."""
STEP_MS = 15_000
CLK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


# ---------------------------------------------------------------------- data
def dataset(nodes: int, span_s: int, t0_ms: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(42)
    ts_ms = t0_ms + np.arange(0, span_s * 1000, STEP_MS, dtype=np.int64)
    ts = ts_ms * 1_000_000
    k = ts.shape[0]
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for n in range(nodes):
        node = f"/dc/row{n % 4}/rack{(n // 4) % 4}/node{n}"
        out[f"{node}/power"] = (ts, 200 + 50 * np.sin(np.arange(k) / 40 + n) + rng.normal(0, 2, k))
        out[f"{node}/energy"] = (ts, np.cumsum(rng.integers(100, 300, k)).astype(np.float64))
    for inst in range(max(2, nodes // 5)):
        counts = np.cumsum(rng.integers(0, 10, (k, 8)), axis=0).cumsum(axis=1).astype(np.float64)
        for j, le in enumerate(("0.01", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "%2BInf")):
            out[f"/dc/api/http_latency_seconds_bucket/instance=i{inst}/le={le}"] = (
                ts,
                counts[:, j],
            )
    return out


def dense(series: int, span_s: int, t0_ms: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Readings every second (a probe's temperature), for the functions that walk each window."""
    rng = np.random.default_rng(43)
    ts = (t0_ms + np.arange(0, span_s * 1000, 1000, dtype=np.int64)) * 1_000_000
    k = ts.shape[0]
    return {f"/dc/dense/probe{i}/temp": (ts, 24 + 3 * np.sin(np.arange(k) / 900 + i) + rng.normal(0, 0.2, k))
            for i in range(series)}  # fmt: skip


def openmetrics(data: dict[str, tuple[np.ndarray, np.ndarray]], path: Path) -> None:
    with path.open("w") as f:
        by_family: dict[str, list[str]] = {}
        for name in data:
            by_family.setdefault(dict(series_labels(name))["__name__"], []).append(name)
        for family, names in by_family.items():
            f.write(f"# TYPE {family} unknown\n")
            for name in names:
                labels = dict(series_labels(name))
                lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
                ts, vs = data[name]
                ms = ts // 1_000_000
                lines = [
                    f"{family}{{{lab}}} {v!r} {m // 1000}.{m % 1000:03d}5\n"
                    for m, v in zip(ms.tolist(), vs.tolist(), strict=True)
                ]
                f.writelines(lines)
        f.write("# EOF\n")


async def fill_sqlite(data: dict[str, tuple[np.ndarray, np.ndarray]], db: Path) -> None:
    from services.common.storage import open_storage
    from services.common.storage.settings import StorageSettings

    st = await open_storage(StorageSettings(sqlite={"path": str(db)}))
    try:
        items = list(data.items())
        for a in range(0, len(items), 20):
            await st.write(
                Batch.from_series(Series(n, ts, vs) for n, (ts, vs) in items[a : a + 20])
            )
    finally:
        await st.close()


# ---------------------------------------------------------------------- servers
class Server:
    def __init__(
        self, argv: list[str], ready: str, workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log = open(workdir / f"{Path(argv[0]).name}-{len(os.listdir(workdir))}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir,
                                     env={**os.environ, **(env or {})})  # fmt: skip
        _wait(ready, self.proc)

    def cpu(self) -> float:
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


BENCH_TOKENS = {"read_token": "bench-read-token-00000000", "write_token": "bench-write-token-0000000",
                "admin_token": "bench-admin-token-0000000"}  # fmt: skip


def kelvin(service: str, workdir: Path, config: str, port: int, ready: str) -> Server:
    cfg = workdir / f"{service}.yaml"
    cfg.write_text(config + "auth:\n" + "".join(f"  {k}: {v}\n" for k, v in BENCH_TOKENS.items()))
    return Server([sys.executable, "-m", "services.cli", "run", service, "--config", str(cfg)],
                  f"http://127.0.0.1:{port}{ready}", workdir, {"KELVIN_LOGGING_LEVEL": "WARNING"})  # fmt: skip


# ---------------------------------------------------------------------- queries
QUERIES = [
    "rate(node_energy[5m])",
    "sum by (row) (node_power)",
    "max_over_time(node_power[10m])",
    "histogram_quantile(0.9, sum by (le) (rate(http_latency_seconds_bucket[5m])))",
]
DENSE_QUERIES = [
    "sum_over_time(probe_temp[1h])",
    "avg_over_time(probe_temp[1h])",
    "stddev_over_time(probe_temp[1h])",
    "stdvar_over_time(probe_temp[1h])",
    "quantile_over_time(0.9, probe_temp[1h])",
    "holt_winters(probe_temp[1h], 0.5, 0.5)",
    "deriv(probe_temp[1h])",
]
"""Functions that walk every sample of each window, over 1 s readings: 3,600 per window."""
DENSE_RUNS = max(3, RUNS // 2)


def _time_query(client: httpx.Client, url: str, params: dict[str, str]) -> float:
    t = time.perf_counter()
    r = client.get(url, params=params)
    r.raise_for_status()
    assert r.json()["status"] == "success"
    return time.perf_counter() - t


def queries(
    prom: Server,
    prom_url: str,
    kel: Server,
    kel_url: str,
    end_s: float,
    ranges: list[tuple[str, int]],
    texts: list[str],
    runs: int = RUNS,
) -> list[str]:
    rows = ["| query | range | step | Prometheus ms (CPU) | Kelvin ms (CPU) | Kelvin / Prometheus |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    with httpx.Client(timeout=300) as c:
        for q in texts:
            for label, span in ranges:
                for step in ("15", "60"):
                    params = {
                        "query": q,
                        "start": str(end_s - span),
                        "end": str(end_s),
                        "step": step,
                    }
                    p_times, k_times, p_cpu, k_cpu = [], [], 0.0, 0.0
                    _time_query(c, f"{prom_url}/api/v1/query_range", params)
                    _time_query(c, f"{kel_url}/prometheus/api/v1/query_range", params)
                    for _ in range(runs):
                        a = prom.cpu()
                        p_times.append(_time_query(c, f"{prom_url}/api/v1/query_range", params))
                        p_cpu += prom.cpu() - a
                        a = kel.cpu()
                        k_times.append(
                            _time_query(c, f"{kel_url}/prometheus/api/v1/query_range", params)
                        )
                        k_cpu += kel.cpu() - a
                    pm, km = statistics.median(p_times) * 1e3, statistics.median(k_times) * 1e3
                    rows.append(
                        f"| `{q}` | {label} | {step} s | {pm:.1f} ({p_cpu / runs * 1e3:.0f}) | "
                        f"{km:.1f} ({k_cpu / runs * 1e3:.0f}) | {km / pm:.2f}x |"
                    )
                    print(rows[-1], file=sys.stderr, flush=True)  # progress: a long run
    return rows


# ---------------------------------------------------------------------- remote write
Expected = dict[tuple[tuple[str, str], ...], tuple[np.ndarray, np.ndarray]]
"""Per series (sorted label pairs): the millisecond timestamps and values sent."""


def write_bodies(
    series: int, samples: int, requests: int, t0_ms: int, conn: int
) -> tuple[list[bytes], Expected]:
    """One connection's requests (its own series, so each series' samples arrive in order)
    and what they carry."""
    rng = np.random.default_rng(7 + conn)
    labels = [[("__name__", "node_cpu_seconds_total"), ("cpu", str(i % 16)),
               ("instance", f"host{conn}-{i // 16}:9100"), ("job", "node"), ("mode", "idle")]
              for i in range(series)]  # fmt: skip
    bodies, sent = [], []
    for r in range(requests):
        ts = t0_ms + (r * samples + np.arange(samples, dtype=np.int64)) * 1000
        batch = [(lab, ts, rng.random(samples) * 1e4) for lab in labels]
        sent.append(batch)
        bodies.append(bytes(cramjam.snappy.compress_raw(prompb.write_request(batch))))
    expected: Expected = {}
    for i, lab in enumerate(labels):
        expected[tuple(sorted(lab))] = (
            np.concatenate([b[i][1] for b in sent]),
            np.concatenate([b[i][2] for b in sent]),
        )
    return bodies, expected


def _mismatch(who: str, key: object, got_ts: np.ndarray, got_vs: np.ndarray,
              want: tuple[np.ndarray, np.ndarray], rel: float = 0.0) -> None:  # fmt: skip
    ts, vs = want
    same = np.array_equal(got_ts, ts) and (
        np.array_equal(got_vs, vs) if rel == 0 else bool(np.allclose(got_vs, vs, rtol=rel, atol=0))
    )
    if not same:
        raise RuntimeError(f"{who} {key}: {got_ts.shape[0]} samples stored, {ts.shape[0]} sent "
                           "(loss, duplicates or changed values)")  # fmt: skip


def count_kelvin(db: Path, expected: Expected) -> int:
    """Every series read back from the agent's SQLite file, sample for sample."""
    from services.common.promnames import sensor_name
    from services.common.storage import open_storage
    from services.common.storage.settings import StorageSettings

    async def run() -> int:
        st = await open_storage(StorageSettings(sqlite={"path": str(db)}))
        found = 0
        try:
            names = {key: sensor_name(dict(key), "/prometheus") for key in expected}
            stored = await st.read_many(list(names.values()), 0, 2**62)
            for key, want in expected.items():
                got = stored[names[key]]
                _mismatch("Kelvin", key, got.timestamps_ns // 1_000_000, got.values, want)
                found += len(got)
        finally:
            await st.close()
        return found

    return asyncio.run(run())


def count_victoria(port: int, expected: Expected) -> int:
    """Every series exported back (VictoriaMetrics keeps duplicates: they would show)."""
    import json

    httpx.get(f"http://127.0.0.1:{port}/internal/force_flush", timeout=60).raise_for_status()
    r = httpx.get(f"http://127.0.0.1:{port}/api/v1/export",
                  params={"match[]": "node_cpu_seconds_total"}, timeout=300)  # fmt: skip
    found, seen = 0, set()
    for line in r.text.splitlines():
        row = json.loads(line)
        key = tuple(sorted(row["metric"].items()))
        order = np.argsort(np.array(row["timestamps"], np.int64), kind="stable")
        ts = np.array(row["timestamps"], np.int64)[order]
        # VictoriaMetrics keeps 12 significant decimal digits (measured: 1.00006e-12 relative)
        _mismatch("VictoriaMetrics", key, ts, np.array(row["values"])[order], expected[key], 1e-11)
        found += ts.shape[0]
        seen.add(key)
    if len(seen) != len(expected):
        raise RuntimeError(f"VictoriaMetrics: {len(seen)} series stored, {len(expected)} sent")
    return found


def count_prometheus(port: int, expected: Expected, t0_ms: int) -> int:
    """Every series counted and summed back by PromQL over the whole span written."""
    last = max(int(ts[-1]) for ts, _ in expected.values())
    span_s = (last - t0_ms) // 1000 + 2
    at = f"{last / 1000:.3f}"
    got: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for fn in ("count_over_time", "sum_over_time"):
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", timeout=300,
                      params={"query": f"{fn}(node_cpu_seconds_total[{span_s}s])", "time": at})  # fmt: skip
        for res in r.json()["data"]["result"]:
            key = tuple(sorted({**res["metric"], "__name__": "node_cpu_seconds_total"}.items()))
            got.setdefault(key, []).append(float(res["value"][1]))
    found = 0
    for key, (ts, vs) in expected.items():
        n, total = got.get(key, [0.0, 0.0])
        if n != ts.shape[0] or not np.isclose(total, vs.sum(), rtol=1e-9):
            raise RuntimeError(f"Prometheus {key}: {n:.0f} samples stored, {ts.shape[0]} sent")
        found += int(n)
    return found


def _stored(port: int, n: int) -> None:
    """Wait until the agent's writer has put ``n`` readings into storage."""
    headers = {"Authorization": f"Bearer {BENCH_TOKENS['read_token']}"}
    deadline = time.monotonic() + 300
    while httpx.get(f"http://127.0.0.1:{port}/api/v1/stats", headers=headers,
                    timeout=30).json()["readings_written"] < n:  # fmt: skip
        if time.monotonic() > deadline:
            raise TimeoutError("the agent's writer did not store every sample")
        time.sleep(0.05)


async def _send(url: str, per_conn: list[list[bytes]]) -> None:
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
               "X-Prometheus-Remote-Write-Version": "0.1.0",
               "Authorization": f"Bearer {BENCH_TOKENS['write_token']}"}  # fmt: skip
    async with httpx.AsyncClient(
        timeout=60, limits=httpx.Limits(max_connections=len(per_conn))
    ) as c:

        async def worker(bodies: list[bytes]) -> None:
            for b in bodies:
                r = await c.post(url, content=b, headers=headers)
                assert r.status_code in (200, 204), r.text[:200]

        await asyncio.gather(*(worker(b) for b in per_conn))


def remote_write(work: Path, quick: bool) -> list[str]:
    rows = ["| receiver | batch | samples | wall s | samples/s | server CPU s | samples per CPU-second |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    t0 = int(time.time() * 1000) - 86_400_000
    shapes = [(500, 1, 200 if quick else 1000), (100, 20, 50 if quick else 250)]
    for name in ("kelvin", "kelvin, cache off", "victoria-metrics", "prometheus"):
        for series, samples, requests in shapes:
            d = Path(tempfile.mkdtemp(dir=work))
            port = _free_port()
            if name.startswith("kelvin"):
                extra = "  cache_window_s: 0\n" if "off" in name else ""
                srv = kelvin("collect-agent", d,
                             f"collect_agent:\n  host: 127.0.0.1\n  port: {port}\n  mqtt_enabled: false\n{extra}"
                             f"  spool_dir: {d / 'spool'}\nstorage:\n  sqlite:\n    path: {d / 'k.sqlite'}\n",
                             port, "/healthz")  # fmt: skip
                url = f"http://127.0.0.1:{port}/api/v1/write"
            elif name == "victoria-metrics":
                binary = shutil.which("victoria-metrics")
                if binary is None:
                    continue
                srv = Server([binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={d}"],
                             f"http://127.0.0.1:{port}/health", d)  # fmt: skip
                url = f"http://127.0.0.1:{port}/api/v1/write"
            else:
                binary = shutil.which("prometheus")
                if binary is None:
                    continue
                (d / "p.yml").write_text("global: {}\n")
                srv = Server([binary, f"--config.file={d / 'p.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                             f"http://127.0.0.1:{port}/-/ready", d)  # fmt: skip
                url = f"http://127.0.0.1:{port}/api/v1/write"
            loads = [write_bodies(series, samples, requests // 4, t0, k) for k in range(4)]
            per_conn = [bodies for bodies, _ in loads]
            expected = {key: want for _, sent in loads for key, want in sent.items()}
            n = series * samples * (requests // 4) * 4
            try:
                c0, t = srv.cpu(), time.perf_counter()
                asyncio.run(_send(url, per_conn))
                wall, cpu = time.perf_counter() - t, srv.cpu() - c0
                if name.startswith("kelvin"):
                    _stored(port, n)
                elif name == "victoria-metrics":
                    found = count_victoria(port, expected)
                else:
                    found = count_prometheus(port, expected, t0)
            finally:
                srv.stop()
            if name.startswith("kelvin"):
                found = count_kelvin(d / "k.sqlite", expected)
            if found != n:
                raise RuntimeError(f"{name}: {found:,} samples stored of {n:,} sent")
            rows.append(f"| {name} | {series} x {samples} | {n:,} | {wall:.2f} | {n / wall:,.0f} | "
                        f"{cpu:.2f} | {n / max(cpu, 1e-9):,.0f} |")  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(quick: bool) -> str:
    work = Path(tempfile.mkdtemp(prefix="bench-promql-"))
    try:
        nodes, span_s = (12, 6 * 3600) if quick else (50, 26 * 3600)
        end_ms = (int(time.time()) // 60 * 60 - 600) * 1000
        t0_ms = end_ms - span_s * 1000
        data = dataset(nodes, span_s, t0_ms)
        samples = sum(ts.shape[0] for ts, _ in data.values())
        probes = dense(2, span_s, t0_ms)
        dense_samples = sum(ts.shape[0] for ts, _ in probes.values())
        data.update(probes)
        om = work / "data.om"
        openmetrics(data, om)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(work / "tsdb")],
                       check=True, capture_output=True)  # fmt: skip
        om.unlink()
        db = work / "kelvin.sqlite"
        asyncio.run(fill_sqlite(data, db))
        pport, kport = _free_port(), _free_port()
        (work / "prometheus.yml").write_text("global: {scrape_interval: 1h}\n")
        prom = Server(["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                       f"--web.listen-address=127.0.0.1:{pport}", "--storage.tsdb.retention.time=100y"],
                      f"http://127.0.0.1:{pport}/-/ready", work)  # fmt: skip
        kel = kelvin("query-api", work,
                     f"query_api:\n  host: 127.0.0.1\n  port: {kport}\nstorage:\n  sqlite:\n    path: {db}\n",
                     kport, "/readyz")  # fmt: skip
        try:
            ranges = [("1 h", 3600), ("1 d", 86400) if not quick else ("5 h", 5 * 3600)]
            ranges = ranges[:1] if ONLY_1H else ranges
            servers = (prom, f"http://127.0.0.1:{pport}", kel, f"http://127.0.0.1:{kport}")
            rows = queries(*servers, end_ms / 1000, ranges, QUERIES)
            dense_rows = queries(*servers, end_ms / 1000, ranges, DENSE_QUERIES, DENSE_RUNS)
        finally:
            prom.stop()
            kel.stop()
        out = [f"{len(data) - len(probes)} series, {samples:,} samples at 15 s; medians of {RUNS} runs, CPU per query in ms.", "",
               *rows, "", f"{len(probes)} series, {dense_samples:,} samples at 1 s; medians of {DENSE_RUNS} runs.", "",
               *dense_rows, "", "Remote write (4 connections, snappy protobuf as Prometheus sends; every sample "
               "counted back from each receiver's storage):", "", *([] if ONLY_1H else remote_write(work, quick))]  # fmt: skip
        return "\n".join(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
