"""Pusher overhead on DCDB's grid (paper section 6.2.2), beside an idle Python process.

Tester sensors {100, 1k, 10k} x interval {1 s, 100 ms} x wire format {KVB1,
DCDB}: each point runs the pusher as its own process (``kelvin run
pusher``, QoS 1) publishing to a real mosquitto, and measures over a
window after warm-up: CPU (% of one core, from /proc/<pid>/schedstat), RSS,
readings produced and acknowledged by the broker, messages, the broker's CPU,
and whether the point is sustained (no drops, no skipped beats, no growing
backlog). References measured in the same run: an idle Python process and an
idle Python process that imported the pusher's libraries (the floor any
Python pusher pays). DCDB's own figures (Skylake, SuperMUC-NG) are quoted for
the ratios: < 1 % of a core and < 50 MB at 1k sensors / 1 s; 3 % and 350 MB at
10k sensors / 100 ms.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {(1000, 1000): (0.5, 64.0), (10000, 100): (15.0, None)}
DCDB = {(1000, 1000): "< 1 % / < 50 MB", (10000, 100): "3 % / 350 MB"}
DCDB_FIGURES = {(1000, 1000): (1.0, 50.0), (10000, 100): (3.0, 350.0)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


@contextlib.contextmanager
def _mosquitto(workdir: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = _free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
        "max_queued_messages 0\nmax_inflight_messages 0\npersistence false\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port, proc)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(10)


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(kelvin_pusher_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            key = m.group(1) + (m.group(2) or "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _get(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


@dataclass
class Point:
    label: str
    cpu_pct: float
    rss_mb: float
    readings_s: float = 0.0
    acked_s: float = 0.0
    msgs_s: float = 0.0
    broker_cpu_pct: float = 0.0
    sustained: str = ""


def _idle(label: str, code: str, window_s: float) -> Point:
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        time.sleep(1.5)
        c0, t0 = _cpu_ns(proc.pid), time.monotonic()
        time.sleep(window_s)
        c1, t1 = _cpu_ns(proc.pid), time.monotonic()
        return Point(label, 100 * (c1 - c0) / 1e9 / (t1 - t0), _rss_mb(proc.pid))
    finally:
        proc.kill()
        proc.wait()


def _run(
    workdir: Path,
    broker: tuple[int, subprocess.Popen[bytes]],
    sensors: int,
    interval_ms: int,
    fmt: str,
    window_s: float,
) -> Point:
    http = _free_port()
    cfg = workdir / f"pusher-{sensors}-{interval_ms}-{fmt}.yaml"
    cfg.write_text(
        json.dumps(
            {
                "pusher": {
                    "host": "127.0.0.1",
                    "port": http,
                    "prefix": "/bench",
                    "brokers": [f"127.0.0.1:{broker[0]}"],
                    "format": fmt,
                    "qos": 1,
                    "state_dir": str(workdir / "state"),
                    "plugins": {"tester": {"sensors": sensors, "interval": interval_ms}},
                },
                "logging": {"level": "WARNING"},
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "run", "pusher", "--config", str(cfg)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(http, proc)
        deadline = time.monotonic() + 30
        while _get(_metrics(http), "kelvin_pusher_readings_sent_total") == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the pusher sent nothing within 30 s")
            time.sleep(0.2)
        time.sleep(max(2.0, 2 * interval_ms / 1000))  # past the metadata burst at connect
        m0, c0, b0, t0 = _metrics(http), _cpu_ns(proc.pid), _cpu_ns(broker[1].pid), time.monotonic()
        time.sleep(window_s)
        m1, c1, b1, t1 = _metrics(http), _cpu_ns(proc.pid), _cpu_ns(broker[1].pid), time.monotonic()
        dt = t1 - t0
        rss = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def delta(name: str) -> float:
        return _get(m1, name) - _get(m0, name)

    produced = delta("kelvin_pusher_readings_total")
    backlog = _get(m1, "kelvin_pusher_buffer_readings") - _get(m0, "kelvin_pusher_buffer_readings")
    dropped = delta("kelvin_pusher_readings_dropped_total")
    skipped = delta("kelvin_pusher_skipped_beats_total")
    per_cycle = sensors
    ok = dropped == 0 and skipped == 0 and backlog <= per_cycle
    why = (
        []
        if ok
        else [
            f"{w} {v:.0f}"
            for w, v in (("dropped", dropped), ("skipped", skipped), ("backlog +", backlog))
            if v > (per_cycle if w == "backlog +" else 0)
        ]
    )
    return Point(
        f"{sensors} x {interval_ms} ms, {fmt.upper()}",
        100 * (c1 - c0) / 1e9 / dt,
        rss,
        produced / dt,
        delta("kelvin_pusher_readings_sent_total") / dt,
        delta('kelvin_pusher_messages_sent_total{kind="data"}') / dt,
        100 * (b1 - b0) / 1e9 / dt,
        "yes" if ok else "no (" + ", ".join(why) + ")",
    )


def main(quick: bool) -> str:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()):
        return "mosquitto is not installed (Debian package mosquitto): benchmark not run"
    grid = [(1000, 1000), (10000, 100)] if quick else [
        (100, 1000), (1000, 1000), (10000, 1000), (100, 100), (1000, 100), (10000, 100),
    ]  # fmt: skip
    window = 3.0 if quick else 5.0
    points: list[tuple[tuple[int, int] | None, Point]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        points.append(
            (None, _idle("idle Python (reference)", "import time; time.sleep(1e6)", window))
        )
        points.append((None, _idle(
            "idle Python + the pusher's libraries (floor)",
            "import services.pusher.app, time; time.sleep(1e6)", window,
        )))  # fmt: skip
        with _mosquitto(workdir) as broker:
            for sensors, interval in grid:
                for fmt in ("kvb1", "dcdb"):
                    win = window * (1.6 if interval >= 1000 else 1.0)
                    points.append(
                        ((sensors, interval), _run(workdir, broker, sensors, interval, fmt, win))
                    )
    base, floor = points[0][1], points[1][1]
    lines = [
        "| configuration | readings/s | acked/s | msgs/s | CPU % of a core | RSS MB | RSS over floor MB "
        "| broker CPU % | sustained | goal (CPU % / MB) | vs DCDB (CPU, RSS) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, p in points:
        kvb1 = key is not None and "KVB1" in p.label
        goal = GOALS.get(key) if kvb1 and key else None
        goal_txt = ""
        if goal:
            cpu_ok = p.cpu_pct <= goal[0]
            mem_ok = goal[1] is None or p.rss_mb <= goal[1]
            mem = f"≤ {goal[1]:g}" if goal[1] else "-"
            goal_txt = f"≤ {goal[0]:g} / {mem}: CPU {'met' if cpu_ok else 'missed'}" + (
                f", RSS {'met' if mem_ok else 'missed'}" if goal[1] else ""
            )
        vs = ""
        if key in DCDB_FIGURES:
            cpu_ref, rss_ref = DCDB_FIGURES[key]
            vs = f"{DCDB[key]}: {p.cpu_pct / cpu_ref:.2f}x, {p.rss_mb / rss_ref:.2f}x"
        over = "" if key is None else f"{p.rss_mb - floor.rss_mb:.1f}"
        lines.append(
            f"| {p.label} | {p.readings_s:,.0f} | {p.acked_s:,.0f} | {p.msgs_s:,.0f} | "
            f"{p.cpu_pct:.2f} | {p.rss_mb:.1f} | {over} | {p.broker_cpu_pct:.2f} | {p.sustained} | "
            f"{goal_txt} | {vs} |"
        )
    lines.append("")
    lines.append(
        f"Floor: an idle Python process that imported the pusher's libraries (asyncio/ssl, numpy, "
        f"pydantic, FastAPI, uvicorn, aiomqtt) holds {floor.rss_mb:.1f} MB; a bare idle Python "
        f"{base.rss_mb:.1f} MB. CPU from /proc/<pid>/schedstat over the window; QoS 1; 'acked' = "
        "PUBACKed by mosquitto; 'vs DCDB' divides by DCDB's published figure (its bound where it "
        "gives one). The DCDB format sends one PUBLISH per sensor with all its queued readings, "
        "so a pusher that falls behind sends fewer, fuller messages."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv))
