"""Pusher overhead: on a compute node beside collectd and node_exporter, and on DCDB's grid.

**Node window.** What a site compares before it lets a pusher onto compute
nodes: Kelvin's pusher with its real ``procfs`` and ``sysfs`` plugins at 1 s
(~1,000 sensors: all of /proc/meminfo, /proc/vmstat and /proc/stat per CPU,
plus numeric sysfs attributes), collectd (Debian ``collectd-core``: cpu,
memory, interface, load, disk, vmem at 1 s, published to MQTT) and
node_exporter (scraped every second by this benchmark), all started by the
benchmark and measured in the **same window**, publishing to one real
mosquitto. Per daemon: CPU-seconds over the window (summed over every thread
from ``/proc/<pid>/task/*/schedstat``), % of one core, % per 1k values/s, RSS,
and wake-ups per second (voluntary + involuntary context switches of all
threads: the OS noise a daemon adds to a node's compute jobs). With
``KELVIN_BENCH_PUSHER_BASELINE=<git ref>`` the pusher of that commit runs in
the same window too (``git archive`` of its ``services/``), for before/after.

**DCDB's grid** (paper section 6.2.2): tester sensors {100, 1k, 10k} x
interval {1 s, 100 ms} x wire format {KVB1, DCDB}, the pusher as its own
process (``kelvin run pusher``, QoS 1) publishing to mosquitto, beside an
idle Python process and one that imported the pusher's libraries (the
floor). DCDB's own figures are quoted for the ratios: < 1 % of a core and
< 50 MB at 1k sensors / 1 s; 3 % and 350 MB at 10k sensors / 100 ms.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {(1000, 1000): (0.3, 40.0), (10000, 100): (15.0, None)}
DCDB = {(1000, 1000): "< 1 % / < 50 MB", (10000, 100): "3 % / 350 MB"}
DCDB_FIGURES = {(1000, 1000): (1.0, 50.0), (10000, 100): (3.0, 350.0)}
NODE_GOAL = (0.3, 40.0)
"""Issue 17: real procfs + sysfs at 1k sensors/s: <= 0.3 % of a core, <= 40 MB RSS."""
NODE_SENSORS = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tasks(pid: int) -> list[Path]:
    with contextlib.suppress(OSError):
        return list(Path(f"/proc/{pid}/task").iterdir())
    return []


def _cpu_ns(pid: int) -> int:
    """CPU time of every live thread of ``pid`` (ns, from schedstat)."""
    total = 0
    for task in _tasks(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def _switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every live thread of ``pid``."""
    total = 0
    for task in _tasks(pid):
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(line.split()[1])
    return total


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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )


@contextlib.contextmanager
def _mosquitto(workdir: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    binary = _which("mosquitto") or "/usr/sbin/mosquitto"
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
        _stop(proc)


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


def _pusher(
    cfg: Path, section: dict[str, object], code_root: Path = ROOT
) -> subprocess.Popen[bytes]:
    cfg.write_text(json.dumps({"pusher": section, "logging": {"level": "WARNING"}}))
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "run", "pusher", "--config", str(cfg)],
        cwd=code_root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_sending(http: int, proc: subprocess.Popen[bytes]) -> None:
    _wait_port(http, proc)
    deadline = time.monotonic() + 30
    while _get(_metrics(http), "kelvin_pusher_readings_sent_total") == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the pusher sent nothing within 30 s")
        time.sleep(0.2)


# --------------------------------------------------------------------------- node window


def _numeric_sysfs_files(limit: int) -> list[str]:
    """Single-number sysfs attributes a node's pusher would read (counters, sizes, states)."""
    roots = sorted(Path("/sys/class/net").glob("*/statistics"))
    roots += sorted(Path("/sys/block").glob("*/queue"))
    roots += [Path("/sys/devices/system/cpu"), Path("/sys/kernel/mm"), Path("/sys/fs/cgroup")]
    out: list[str] = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            if dirpath.count("/") > 7:
                continue
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                    try:
                        text = os.pread(fd, 64, 0).split()
                    finally:
                        os.close(fd)
                    if len(text) != 1:
                        continue
                    float(text[0])
                except (OSError, ValueError):
                    continue
                out.append(path)
                if len(out) >= limit:
                    return out
    return out


def _node_plugins(state: Path) -> tuple[dict[str, object], int]:
    """procfs (everything) + sysfs (discovered + numeric attributes) to reach ~1k sensors."""
    meminfo = len(Path("/proc/meminfo").read_text().splitlines())
    vmstat = len(Path("/proc/vmstat").read_text().splitlines())
    stat_lines = Path("/proc/stat").read_text().splitlines()
    cpus = sum(1 for ln in stat_lines if ln.startswith("cpu"))
    procfs = meminfo + vmstat + 10 * cpus + 6
    files = _numeric_sysfs_files(max(0, NODE_SENSORS - procfs))
    sensors = [{"name": f"f{i:04d}", "path": p} for i, p in enumerate(files)]
    plugins: dict[str, object] = {
        "procfs": {"interval": 1000},
        "sysfs": {
            "interval": 1000,
            "groups": [{"name": "attrs", "sensors": sensors}] if sensors else [],
        },
    }
    return plugins, procfs + len(files)


def _collectd_conf(workdir: Path, broker: int) -> Path:
    conf = workdir / "collectd.conf"
    conf.write_text(
        f'Interval 1\nBaseDir "{workdir}"\nPIDFile "{workdir}/collectd.pid"\n'
        'PluginDir "/usr/lib/collectd"\nTypesDB "/usr/share/collectd/types.db"\n'
        'FQDNLookup false\nHostname "bench"\n'
        "LoadPlugin logfile\n<Plugin logfile>\n  LogLevel warning\n  File STDERR\n</Plugin>\n"
        "LoadPlugin cpu\nLoadPlugin memory\nLoadPlugin interface\nLoadPlugin load\n"
        "LoadPlugin disk\nLoadPlugin vmem\nLoadPlugin mqtt\n"
        f'<Plugin mqtt>\n  <Publish "bench">\n    Host "127.0.0.1"\n    Port {broker}\n'
        '    ClientId "collectd-bench"\n    QoS 1\n    Prefix "collectd"\n  </Publish>\n</Plugin>\n'
    )
    return conf


class _Counter(threading.Thread):
    """Counts what a peer produces, in a background thread: values and messages."""

    def __init__(self, step: Callable[[], tuple[int, int]]) -> None:
        super().__init__(daemon=True)
        self.step = step
        self.values = 0
        self.messages = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(Exception):
                v, m = self.step()
                self.values += v
                self.messages += m

    def snapshot(self) -> tuple[int, int]:
        return self.values, self.messages


def _collectd_counter(broker: int) -> tuple[_Counter, subprocess.Popen[bytes]]:
    sub = subprocess.Popen(
        [_which("mosquitto_sub") or "mosquitto_sub", "-p", str(broker), "-t", "collectd/#", "-v"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert sub.stdout is not None
    out = sub.stdout

    def step() -> tuple[int, int]:
        line = out.readline()
        if not line:
            time.sleep(0.1)
            return 0, 0
        payload = line.rsplit(b" ", 1)[-1] if b" " in line.strip() else b""
        return max(0, payload.strip().count(b":")), 1  # "time:v1:v2": one value per colon

    return _Counter(step), sub


def _scraper(url: str) -> _Counter:
    def step() -> tuple[int, int]:
        started = time.monotonic()
        text = urllib.request.urlopen(url, timeout=5).read()
        samples = sum(1 for ln in text.split(b"\n") if ln and not ln.startswith(b"#"))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        return samples, 1

    return _Counter(step)


@dataclass
class Daemon:
    label: str
    reads: str
    proc: subprocess.Popen[bytes]
    values: Callable[[], float]
    """Cumulative values produced (read at both ends of the window)."""
    messages: Callable[[], float] = lambda: 0.0
    start: dict[str, float] = field(default_factory=dict)
    result: dict[str, float] = field(default_factory=dict)

    def mark(self) -> dict[str, float]:
        pid = self.proc.pid
        return {
            "cpu": _cpu_ns(pid) / 1e9,
            "sw": _switches(pid),
            "values": self.values(),
            "msgs": self.messages(),
            "t": time.monotonic(),
        }


def _node_window(workdir: Path, broker: int, window_s: float) -> str:
    daemons: list[Daemon] = []
    extra: list[subprocess.Popen[bytes]] = []
    counters: list[_Counter] = []
    notes: list[str] = []
    plugins, n_sensors = _node_plugins(workdir)
    roots = [("Kelvin pusher", ROOT)]
    baseline = os.environ.get("KELVIN_BENCH_PUSHER_BASELINE")
    if baseline:
        base_root = workdir / "baseline"
        base_root.mkdir()
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", baseline, "services"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base_root)], input=tar, check=True)
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", baseline],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        roots.append((f"Kelvin pusher before ({rev})", base_root))
    try:
        for label, code_root in roots:
            http = _free_port()
            name = "after" if code_root == ROOT else "before"
            section = {
                "host": "127.0.0.1",
                "port": http,
                "prefix": f"/bench-{name}",
                "brokers": [f"127.0.0.1:{broker}"],
                "format": "kvb1",
                "qos": 1,
                "state_dir": str(workdir / f"state-{name}"),
                "plugins": plugins,
            }
            proc = _pusher(workdir / f"node-{name}.yaml", section, code_root)
            _wait_sending(http, proc)

            def sent(port: int = http) -> float:
                return _get(_metrics(port), "kelvin_pusher_readings_sent_total")

            def msgs(port: int = http) -> float:
                return _get(_metrics(port), 'kelvin_pusher_messages_sent_total{kind="data"}')

            daemons.append(
                Daemon(label, f"procfs + sysfs, {n_sensors} sensors, 1 s", proc, sent, msgs)
            )
        collectd = _which("collectd")
        if collectd and Path("/usr/lib/collectd/mqtt.so").exists():
            counter, sub = _collectd_counter(broker)
            extra.append(sub)
            counter.start()
            counters.append(counter)
            time.sleep(0.3)  # the subscription first
            proc = subprocess.Popen(
                [collectd, "-f", "-C", str(_collectd_conf(workdir, broker))],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            daemons.append(
                Daemon(
                    "collectd 5.12",
                    "cpu, memory, interface, load, disk, vmem, 1 s, to MQTT",
                    proc,
                    lambda c=counter: float(c.snapshot()[0]),  # type: ignore[misc]
                    lambda c=counter: float(c.snapshot()[1]),  # type: ignore[misc]
                )
            )
        else:
            notes.append("collectd (Debian collectd-core) is not installed: not measured.")
        exporter = _which("prometheus-node-exporter") or _which("node_exporter")
        if exporter:
            port = _free_port()
            proc = subprocess.Popen(
                [exporter, f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait_port(port, proc)
            counter = _scraper(f"http://127.0.0.1:{port}/metrics")
            counter.start()
            counters.append(counter)
            daemons.append(
                Daemon(
                    "node_exporter 1.5",
                    "default collectors, scraped every 1 s",
                    proc,
                    lambda c=counter: float(c.snapshot()[0]),  # type: ignore[misc]
                    lambda c=counter: float(c.snapshot()[1]),  # type: ignore[misc]
                )
            )
        else:
            notes.append("node_exporter (Debian prometheus-node-exporter) is not installed.")
        time.sleep(4.0)  # warm-up: past the metadata burst and the first scrapes
        for d in daemons:
            d.start = d.mark()
        time.sleep(window_s)
        for d in daemons:
            end = d.mark()
            dt = end["t"] - d.start["t"]
            d.result = {
                "cpu_s": end["cpu"] - d.start["cpu"],
                "dt": dt,
                "values_s": (end["values"] - d.start["values"]) / dt,
                "msgs_s": (end["msgs"] - d.start["msgs"]) / dt,
                "wakeups_s": (end["sw"] - d.start["sw"]) / dt,
                "rss": _rss_mb(d.proc.pid),
            }
    finally:
        for c in counters:
            c.done.set()
        for d in daemons:
            _stop(d.proc)
        for p in extra:
            _stop(p)
    lines = [
        f"Node window: {window_s:.0f} s, all daemons at once, publishing to one mosquitto "
        f"(QoS 1 for the pushers).",
        "",
        "| daemon | reads | values/s | msgs/s | CPU-s in window | CPU % of a core "
        "| CPU % per 1k values/s | RSS MB | wake-ups/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in daemons:
        r = d.result
        if not r:
            continue
        pct = 100 * r["cpu_s"] / r["dt"]
        per_k = pct / (r["values_s"] / 1000) if r["values_s"] else float("nan")
        lines.append(
            f"| {d.label} | {d.reads} | {r['values_s']:,.0f} | {r['msgs_s']:,.1f} | "
            f"{r['cpu_s']:.3f} | {pct:.3f} | {per_k:.3f} | {r['rss']:.1f} | {r['wakeups_s']:.1f} |"
        )
    kelvin = daemons[0].result if daemons else {}
    if kelvin:
        pct = 100 * kelvin["cpu_s"] / kelvin["dt"]
        cpu_ok = pct <= NODE_GOAL[0]
        mem_ok = kelvin["rss"] <= NODE_GOAL[1]
        lines += [
            "",
            f"Goal (issue 17): <= {NODE_GOAL[0]} % of a core and <= {NODE_GOAL[1]:g} MB RSS: "
            f"CPU {'met' if cpu_ok else 'missed'} ({pct:.3f} %), "
            f"RSS {'met' if mem_ok else 'missed'} ({kelvin['rss']:.1f} MB; DCDB < 50 MB).",
        ]
    lines += [
        "",
        "CPU from /proc/<pid>/task/*/schedstat (every thread) over the window; wake-ups = "
        "voluntary + involuntary context switches of every thread per second; values: "
        "Kelvin's readings acknowledged by mosquitto, collectd's values received by a "
        "subscriber, node_exporter's samples per scrape (the scraper is this benchmark, "
        "not counted).",
        *notes,
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- DCDB grid


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
    wakeups_s: float = 0.0


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
    section = {
        "host": "127.0.0.1",
        "port": http,
        "prefix": "/bench",
        "brokers": [f"127.0.0.1:{broker[0]}"],
        "format": fmt,
        "qos": 1,
        "state_dir": str(workdir / "state"),
        "plugins": {"tester": {"sensors": sensors, "interval": interval_ms}},
    }
    proc = _pusher(workdir / f"pusher-{sensors}-{interval_ms}-{fmt}.yaml", section)
    try:
        _wait_sending(http, proc)
        time.sleep(max(2.0, 2 * interval_ms / 1000))  # past the metadata burst at connect
        m0, c0, b0, t0 = _metrics(http), _cpu_ns(proc.pid), _cpu_ns(broker[1].pid), time.monotonic()
        s0 = _switches(proc.pid)
        time.sleep(window_s)
        m1, c1, b1, t1 = _metrics(http), _cpu_ns(proc.pid), _cpu_ns(broker[1].pid), time.monotonic()
        s1 = _switches(proc.pid)
        dt = t1 - t0
        rss = _rss_mb(proc.pid)
    finally:
        _stop(proc)

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
        (s1 - s0) / dt,
    )


def _grid(workdir: Path, broker: tuple[int, subprocess.Popen[bytes]], quick: bool) -> str:
    grid = [(1000, 1000), (10000, 100)] if quick else [
        (100, 1000), (1000, 1000), (10000, 1000), (100, 100), (1000, 100), (10000, 100),
    ]  # fmt: skip
    window = 3.0 if quick else 5.0
    points: list[tuple[tuple[int, int] | None, Point]] = []
    points.append((None, _idle("idle Python (reference)", "import time; time.sleep(1e6)", window)))
    points.append((None, _idle(
        "idle Python + the pusher's libraries (floor)",
        "import services.pusher.app, time; time.sleep(1e6)", window,
    )))  # fmt: skip
    for sensors, interval in grid:
        for fmt in ("kvb1", "dcdb"):
            win = window * (1.6 if interval >= 1000 else 1.0)
            points.append(((sensors, interval), _run(workdir, broker, sensors, interval, fmt, win)))
    base, floor = points[0][1], points[1][1]
    lines = [
        "| configuration | readings/s | acked/s | msgs/s | CPU % of a core | RSS MB | RSS over floor MB "
        "| wake-ups/s | broker CPU % | sustained | goal (CPU % / MB) | vs DCDB (CPU, RSS) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
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
        wake = "" if key is None else f"{p.wakeups_s:.1f}"
        lines.append(
            f"| {p.label} | {p.readings_s:,.0f} | {p.acked_s:,.0f} | {p.msgs_s:,.0f} | "
            f"{p.cpu_pct:.2f} | {p.rss_mb:.1f} | {over} | {wake} | {p.broker_cpu_pct:.2f} | "
            f"{p.sustained} | {goal_txt} | {vs} |"
        )
    lines.append("")
    lines.append(
        f"Floor: an idle Python process that imported the pusher (services.pusher.app) holds "
        f"{floor.rss_mb:.1f} MB; a bare idle Python {base.rss_mb:.1f} MB. CPU from "
        "/proc/<pid>/task/*/schedstat over the window; QoS 1; 'acked' = PUBACKed by mosquitto; "
        "'vs DCDB' divides by DCDB's published figure (its bound where it gives one). The DCDB "
        "format sends one PUBLISH per sensor with all its queued readings, so a pusher that "
        "falls behind sends fewer, fuller messages."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- encoders


def _per_reading_us(fn: Callable[[], object], readings: int, min_s: float = 0.2) -> float:
    """CPU µs per reading of ``fn`` (process time: the machine may be shared)."""
    fn()
    n, spent = 0, 0.0
    start = time.process_time()
    while spent < min_s:
        fn()
        n += 1
        spent = time.process_time() - start
    return 1e6 * spent / n / readings


def _encoder_rows(n: int) -> list[str]:
    from array import array

    import numpy as np

    from services.common import codec
    from services.pusher.formats import Route, SensorMetadata, encode_dcdb, encode_kvb1

    names = [f"/node17/procfs/meminfo/Sensor{i:05d}" for i in range(n)]
    route = Route([SensorMetadata(name=x, scale=0.001) for x in names])
    ts0 = 1_764_500_000_000_000_000
    row = array("d", [float(i) * 1.5 for i in range(n)])
    masked = array("B", [1] * n)
    masked[7] = 0
    ten = [array("d", row) for _ in range(10)]
    lens = np.array(route.lens, dtype="<u2")
    np_row = np.frombuffer(row, dtype=np.float64)

    np_rows = np.stack([np_row] * 10)
    np_ts = np.arange(ts0, ts0 + 10, dtype=np.int64)
    np_keep = np.frombuffer(masked, dtype=np.uint8).astype(bool)

    def np_kvb1(k: int = 1) -> bytes:
        if k == 1:
            vs, ts = np_row, np.full(n, ts0, dtype=np.int64)
        else:  # the old encoder's layout: each sensor's k readings together
            vs, ts = np_rows[:k].T.ravel(), np.tile(np_ts[:k], n)
        return codec.encode_batch_columns(np.full(n, k, dtype="<u4"), lens, route.blob, ts, vs)

    def np_kvb1_masked() -> bytes:
        keep = np.flatnonzero(np_keep)
        blob = b"".join([route.rel[i] for i in keep.tolist()])
        return codec.encode_batch_columns(
            np.ones(keep.shape[0], dtype="<u4"), lens[keep], blob,
            np.full(keep.shape[0], ts0, dtype=np.int64), np_row[keep],
        )  # fmt: skip

    def np_dcdb() -> list[bytes]:
        rec = np.empty((n, 1), dtype=codec.DCDB_RECORD)
        rec["value"] = np.rint(np_row[:, None] / 0.001)
        rec["ts"] = ts0
        buf = rec.tobytes()
        return [buf[j * 16 : (j + 1) * 16] for j in range(n)]

    cases: list[tuple[str, Callable[[], object], Callable[[], object] | None, int]] = [
        ("KVB1, 1 cycle", lambda: encode_kvb1(route, [ts0], [row], None), np_kvb1, n),
        (
            "KVB1, 1 cycle, one reading masked",
            lambda: encode_kvb1(route, [ts0], [row], [masked]),
            np_kvb1_masked,
            n,
        ),
        (
            "KVB1, 10 cycles (bursty, outage)",
            lambda: encode_kvb1(route, list(range(ts0, ts0 + 10)), ten, None),
            lambda: np_kvb1(10),
            10 * n,
        ),
        ("DCDB, 1 cycle", lambda: encode_dcdb(route, [ts0], [row], None), np_dcdb, n),
    ]
    rows = []
    for label, ours, ref, readings in cases:
        mine = _per_reading_us(ours, readings)
        theirs = _per_reading_us(ref, readings) if ref else float("nan")
        ratio = f"{mine / theirs:.2f}x" if ref else ""
        ref_txt = f"{theirs:.3f}" if ref else "-"
        rows.append(f"| {n:,} sensors, {label} | {mine:.3f} | {ref_txt} | {ratio} |")
    return rows


def _encoders(quick: bool) -> str:
    """The pusher's array/struct encoders beside numpy doing the same (what it did before)."""
    rows = [r for n in ((1000,) if quick else (1000, 10000)) for r in _encoder_rows(n)]
    return "\n".join(
        [
            "Encoding, CPU µs per reading (process time), the pusher's array/struct encoders "
            "beside numpy building the same bytes (the codec's columns, as the pusher did "
            "before; for DCDB numpy's records and one slice per sensor):",
            "",
            "| encoding | array/struct (now) | numpy | ratio |",
            "|---|---|---|---|",
            *rows,
        ]
    )


def main(quick: bool) -> str:
    if not (_which("mosquitto")):
        return "mosquitto is not installed (Debian package mosquitto): benchmark not run"
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with _mosquitto(workdir) as broker:
            node = _node_window(workdir, broker[0], 10.0 if quick else 60.0)
            grid = _grid(workdir, broker, quick)
    return (
        f"### On a compute node, beside collectd and node_exporter\n\n{node}\n\n"
        f"### DCDB's grid (tester plugin)\n\n{grid}\n\n### Encoders\n\n{_encoders(quick)}"
    )


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv))
