"""Bounded under abuse (issue 12): the query API's memory under one huge valid query, and
how long a slow-drip client holds an HTTP connection.

- memory: ``kelvin run query-api`` (a subprocess) over one SQLite sensor of
  ``--points`` readings; the server's RSS is sampled every 20 ms while one client
  fetches the whole range as JSON, as CSV and through an operation (``delta``), then
  5 s after. ``--source DIR`` runs another checkout's code (e.g. ``git archive main``)
  on the same database, for a before/after table.
- slow drip: a client sends a request's headers one byte every 100 ms; how long
  until the server closes the connection (``--drip-s`` at most).

    .venv/bin/python -m benchmarks abuse            # this checkout (and $KELVIN_ABUSE_BEFORE)
    .venv/bin/python -m benchmarks.bench_abuse --source DIR --points 49000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "abuse"
T0 = 1_700_000_000 * 10**9
STEP_NS = 1_000_000  # 1 kHz
TOKEN = "bench-admin-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(db: Path, points: int) -> None:
    done = db.with_suffix(".points")
    if db.exists() and done.exists() and int(done.read_text()) == points:
        return
    db.unlink(missing_ok=True)
    from services.common.settings import Config
    from services.common.storage import StorageSettings, create_storage

    async def run() -> None:
        cfg = Config(overrides={"storage": {"sqlite": {"path": str(db)}}})
        store = create_storage(cfg.load(StorageSettings))
        await store.open()
        from services.common.readings import Batch

        rng = np.random.default_rng(7)
        for i in range(0, points, 1_000_000):
            k = min(1_000_000, points - i)
            ts = T0 + np.arange(i, i + k, dtype=np.int64) * STEP_NS
            await store.write(Batch.single("/big/s", ts, rng.random(k)))
        await store.close()

    t = time.monotonic()
    asyncio.run(run())
    done.write_text(str(points))
    print(f"built {db} with {points:,} readings in {time.monotonic() - t:.0f} s", flush=True)


class Server:
    def __init__(self, db: Path, source: Path | None, workdir: Path) -> None:
        self.port = _free_port()
        cfg = workdir / "kelvin.yaml"
        auth = f"auth: {{admin_token: {TOKEN}, read_token: {TOKEN}x, write_token: {TOKEN}y}}\n"
        cfg.write_text(
            f"storage: {{sqlite: {{path: {db}}}}}\n"
            f"query_api: {{host: 127.0.0.1, port: {self.port}}}\n"
            + (auth if source is None else "")
        )
        env = {**os.environ, "PYTHONPATH": str(source or ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "run", "query-api", "--config", str(cfg)],
            cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("query API did not become ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _query(server: Server, sensor: str, fmt: str, points: int) -> dict[str, Any]:
    pid = server.proc.pid
    before = _rss_mb(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    params = {"sensor": sensor, "start": str(T0), "end": str(T0 + points * STEP_NS), "format": fmt}
    t = time.monotonic()
    size, status, body = 0, 0, b""
    with httpx.stream(
        "GET", f"{server.url}/api/v1/readings", params=params, timeout=600,
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as r:  # fmt: skip
        status = r.status_code
        for chunk in r.iter_raw(1 << 20):
            size += len(chunk)
            if status != 200 and len(body) < 300:
                body += chunk
    seconds = time.monotonic() - t
    done.set()
    sampler.join()
    time.sleep(5)
    return {
        "query": f"{sensor} {fmt}",
        "status": status,
        "detail": body[:200].decode(errors="replace") if status != 200 else "",
        "MB sent": round(size / 1e6),
        "s": round(seconds, 1),
        "RSS before MB": round(before),
        "RSS peak MB": round(peak[0]),
        "RSS 5 s after MB": round(_rss_mb(pid)),
    }


async def _drip(port: int, limit_s: float) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    t = time.monotonic()

    async def send() -> None:
        try:
            while True:
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.1)
        except ConnectionError:
            return

    sender = asyncio.create_task(send())
    try:
        while await asyncio.wait_for(
            reader.read(4096), max(0.01, limit_s - (time.monotonic() - t))
        ):
            pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        sender.cancel()
        writer.close()
    return time.monotonic() - t


def measure(points: int, source: Path | None, drip_s: float) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    db = OUT / f"big-{points}.sqlite"
    build(db, points)
    work = OUT / ("before" if source else "after")
    work.mkdir(exist_ok=True)
    server = Server(db, source, work)
    try:
        rows = [_query(server, "/big/s", "json", points)]
        rows.append(_query(server, "/big/s", "csv", points))
        rows.append(_query(server, "delta(/big/s)", "csv", points))
        held = asyncio.run(_drip(server.port, drip_s))
    finally:
        server.stop()
    return {"code": str(source or "this checkout"), "queries": rows, "drip held s": held}


def table(results: list[dict[str, Any]], points: int, drip_s: float) -> str:
    cols = ["query", "status", "s", "MB sent", "RSS before MB", "RSS peak MB", "RSS 5 s after MB"]
    lines = [
        f"{points:,} readings of one sensor (1 kHz), SQLite; the query API's RSS while one "
        "client fetches the whole range.\n",
        "| code | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for res in results:
        for q in res["queries"]:
            lines.append(f"| {res['code']} | " + " | ".join(str(q[c]) for c in cols) + " |")
    lines.append("")
    lines.append(
        f"Slow-drip client (a header byte every 100 ms), connection held (limit {drip_s:g} s):"
    )
    for res in results:
        held = res["drip held s"]
        shown = f">= {drip_s:g} s (still open)" if held >= drip_s - 0.5 else f"{held:.1f} s"
        lines.append(f"- {res['code']}: {shown}")
    return "\n".join(lines)


def main(quick: bool = False) -> str:
    points, drip_s = (1_000_000, 15.0) if quick else (49_000_000, 60.0)
    before = os.environ.get("KELVIN_ABUSE_BEFORE")
    results = [measure(points, Path(before), drip_s)] if before else []
    results.append(measure(points, None, drip_s))
    return table(results, points, drip_s)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_abuse", description=__doc__)
    p.add_argument("--points", type=int, default=49_000_000)
    p.add_argument("--source", type=Path, help="also run another checkout's services/ first")
    p.add_argument("--drip-s", type=float, default=60.0)
    args = p.parse_args(argv)
    results = [measure(args.points, args.source, args.drip_s)] if args.source else []
    results.append(measure(args.points, None, args.drip_s))
    print(json.dumps(results, indent=1))
    print(table(results, args.points, args.drip_s))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
