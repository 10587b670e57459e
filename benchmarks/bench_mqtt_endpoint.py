"""The built-in MQTT endpoint under abuse and under scaling, beside mosquitto.

1. Memory: RSS of the agent while 1,000 connections each hold a large partial
   packet (a 4 MiB PUBLISH of which ``--partial-mib`` arrived), before any
   CONNECT and after one; beside mosquitto 2.0 (Debian) under the same flood, and,
   with ``--reference DIR`` (a checkout of another revision), that revision's
   agent. ``/ping`` is timed during the flood: the agent must keep answering.
2. Rebalancing: N pushers (raw-socket MQTT 5 clients that reconnect with up to
   1 s of jitter, as Kelvin's pusher does) all on one agent behind a stand-in for
   the Service (``tests/support/tcp_balancer.py``); two agents are added, and the
   time until every agent holds its fair share is measured at the default
   rebalancing settings.

Run: ``python -m benchmarks mqtt_endpoint`` or
``python -m benchmarks.bench_mqtt_endpoint [--quick] [--reference DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import math
import os
import random
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import CollectAgent, create_service
from services.common import codec
from services.common.settings import Config
from tests.support.auth import AUTH_SECTION, MQTT_LOGIN
from tests.support.servers import free_port, wait_port
from tests.support.tcp_balancer import Balancer

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


# --------------------------------------------------------------------------- memory


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))


class _Server:
    """A collect agent of a source tree, or mosquitto, as a process on free ports."""

    def __init__(self, kind: str, work: Path, tree: Path | None = None) -> None:
        self.kind, self.work, self.tree = kind, work, tree
        self.port, self.http_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> _Server:
        if self.kind == "mosquitto":
            exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
            conf = self.work / "mosquitto.conf"
            conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
            cmd, cwd, env = [exe, "-c", str(conf)], None, None
        else:
            tree = self.tree or ROOT
            cfg = self.work / "agent.yaml"
            doc: dict[str, Any] = {
                "collect_agent": {
                    "host": "127.0.0.1", "port": self.http_port, "mqtt_port": self.port,
                    "spool_dir": str(self.work / "spool"), "fsync": "off",
                    "connect_timeout_s": 120,
                },
                "storage": {"sqlite": {"path": str(self.work / "k.sqlite")}},
            }  # fmt: skip
            if self.tree is None:
                # Auth on, as by default (the flood logs in); an older reference tree
                # without these keys takes any login.
                doc["auth"] = AUTH_SECTION
            cfg.write_text(yaml.safe_dump(doc))
            cmd = [
                sys.executable,
                "-m",
                "services.cli",
                "run",
                "collect-agent",
                "--config",
                str(cfg),
            ]
            cwd, env = tree, {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_limits,
        )  # fmt: skip
        wait_port(self.port, timeout=60, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def ping_ms(self) -> float | None:
        if self.kind == "mosquitto":
            return None
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        try:
            conn.request("GET", "/ping")
            conn.getresponse().read()
        except OSError:
            return math.inf
        finally:
            conn.close()
        return (time.perf_counter() - t0) * 1000


def memory_row(
    kind: str, label: str, tree: Path | None, n: int, part_mib: float, connect: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = _Server(kind, Path(tmp), tree).start()
        try:
            assert server.proc is not None
            time.sleep(1.0)  # let the agent finish starting (storage, scales)
            idle, _ = _rss(server.proc.pid)
            packet = mp.publish("/flood/x", bytes(4 * MIB - 64), 1, 1)
            part = memoryview(packet)[: int(part_mib * MIB)]
            conns: list[socket.socket] = []
            held_open = _flood_hold(server.port, n, connect, part, conns)
            rss, hwm = _rss(server.proc.pid)
            ping = server.ping_ms()
            for s in conns:
                s.close()
            return {
                "server": label, "connect": connect, "idle_mb": idle / MIB,
                "flood_mb": rss / MIB, "peak_mb": hwm / MIB, "open": held_open, "ping_ms": ping,
            }  # fmt: skip
        finally:
            server.stop()


def _flood_hold(
    port: int, n: int, connect: bool, part: memoryview, conns: list[socket.socket]
) -> int:
    """Open ``n`` connections (kept in ``conns``), CONNECT on each if asked, then send
    ``part`` without buffering it in this process; returns how many the server has
    not closed once nothing moves for 1.5 s."""
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, memoryview] = {}
    for i in range(n):
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        if connect:
            s.sendall(mp.connect(f"flood-{i}", **MQTT_LOGIN))
        s.setblocking(False)
        pending[s] = part
        conns.append(s)
        sel.register(s, selectors.EVENT_WRITE, s)
    closed: set[socket.socket] = set()
    last = time.monotonic()
    while pending and time.monotonic() - last < 1.5:
        for key, _ in sel.select(timeout=0.2):
            s = key.data
            try:
                sent = s.send(pending[s][: 1 << 16])
            except BlockingIOError:
                continue
            except OSError:
                closed.add(s)
                sent = len(pending[s])
            last = time.monotonic()
            pending[s] = pending[s][sent:]
            if not pending[s]:
                sel.unregister(s)
                del pending[s]
    time.sleep(0.5)
    for s in conns:
        if s in closed:
            continue
        try:
            if s.recv(1 << 16, socket.MSG_PEEK) == b"":
                closed.add(s)
        except BlockingIOError:
            pass
        except OSError:
            closed.add(s)
    return n - len(closed)


# --------------------------------------------------------------------------- rebalancing


class _Pusher:
    """A raw MQTT 5 client: one QoS 1 reading a second; reconnects after a close."""

    def __init__(self, i: int, port: int, rng: random.Random) -> None:
        self.i, self.port, self.rng = i, port, rng

    async def run(self, stop: asyncio.Event) -> None:
        k = 0
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(mp.connect(f"bench-{self.i}", level=5, **MQTT_LOGIN))
                while not stop.is_set():
                    rec = codec.encode_dcdb([k], [1_764_500_000_000_000_000 + k])
                    writer.write(mp.publish(f"/rb/p{self.i}", rec, 1, k % 65535 + 1, level=5))
                    k += 1
                    with contextlib.suppress(TimeoutError):
                        data = await asyncio.wait_for(reader.read(1 << 16), 1.0)
                        if not data:
                            break
                writer.close()
            except OSError:
                pass
            await asyncio.sleep(self.rng.uniform(0, 1.0))  # the pusher's reconnect jitter


async def rebalance_time(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ports = [free_port() for _ in range(3)]

        async def agent(i: int) -> CollectAgent:
            cfg = Config(overrides={
                "collect_agent": {
                    "host": "127.0.0.1", "port": ports[i], "mqtt_port": 0, "fsync": "off",
                    "spool_dir": f"{tmp}/spool{i}",
                    "mqtt_peers": [f"http://127.0.0.1:{p}" for j, p in enumerate(ports) if j != i],
                },
                "storage": {"sqlite": {"path": f"{tmp}/k{i}.sqlite"}},
                "auth": AUTH_SECTION,
            })  # fmt: skip
            a = create_service(cfg)
            await a.start()
            return a

        agents = [await agent(0)]
        lb = await Balancer([agents[0].mqtt_port or 0]).start()
        stop = asyncio.Event()
        rng = random.Random(7)
        tasks = [asyncio.create_task(_Pusher(i, lb.port, rng).run(stop)) for i in range(n)]

        def counts() -> list[int]:
            return [len(a.mqtt.conns) if a.mqtt else 0 for a in agents]

        async def until(check: Any, timeout_s: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while not check(counts()):
                        waits = [
                            asyncio.ensure_future(a.mqtt.changed.wait()) for a in agents if a.mqtt
                        ]
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                        for a, w in zip(agents, waits, strict=False):
                            w.cancel()
                            if a.mqtt is not None:
                                a.mqtt.changed.clear()

        await until(lambda c: c == [n], 60)
        agents += [await agent(1), await agent(2)]
        lb.backends += [agents[1].mqtt_port or 0, agents[2].mqtt_port or 0]
        t0 = time.monotonic()
        fair = math.ceil(n / 3)
        slack = max(1, math.ceil(fair * 0.1))
        # The agents' own rule: nobody above the fair share plus the tolerance.
        await until(lambda c: sum(c) == n and max(c) <= fair + slack, 600)
        took = time.monotonic() - t0
        final = counts()
        moved = sum(
            (a.metrics.service.registry.get_sample_value(
                "kelvin_collect_agent_mqtt_disconnects_total", {"reason": "rebalance"}
            ) or 0) for a in agents
        )  # fmt: skip
        stop.set()
        await asyncio.gather(*tasks)
        await lb.stop()
        for a in agents:
            await a.stop()
        return {"n": n, "seconds": took, "final": final, "moved": int(moved), "fair": fair}


# --------------------------------------------------------------------------- report


def run(quick: bool, reference: Path | None, part_mib: float) -> str:
    n = 100 if quick else 1000
    rows = []
    servers: list[tuple[str, str, Path | None]] = [("agent", "Kelvin (this tree)", None)]
    if reference is not None:
        servers.append(("agent", f"Kelvin ({reference.name})", reference))
    if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists():
        servers.append(("mosquitto", "mosquitto 2.0", None))
    for connect in (False, True):
        for kind, label, tree in servers:
            rows.append(memory_row(kind, label, tree, n, part_mib, connect))
    out = [
        f"{n} connections, each {part_mib:g} MiB into a 4 MiB PUBLISH "
        "(RSS in MiB; /ping during the flood):",
        "",
        "| server | CONNECT first | idle RSS | RSS under the flood | peak | connections kept | /ping |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ping = "—" if r["ping_ms"] is None else f"{r['ping_ms']:.1f} ms"
        out.append(
            f"| {r['server']} | {'yes' if r['connect'] else 'no'} | {r['idle_mb']:.0f} | "
            f"{r['flood_mb']:.0f} | {r['peak_mb']:.0f} | {r['open']} | {ping} |"
        )
    rb = asyncio.run(rebalance_time(60 if quick else 300))
    out += [
        "",
        f"Rebalancing (defaults: peers read every 5 s, at most 20 moves/s per agent): {rb['n']} "
        f"pushers on one agent, two agents added: no agent above its fair share "
        f"({rb['fair']} + 10 %) after **{rb['seconds']:.1f} s**; final {rb['final']}, "
        f"{rb['moved']} moves.",
    ]
    return "\n".join(out)


def main(quick: bool = False) -> str:
    return run(quick, None, 1.0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reference", type=Path, help="another checkout to measure side by side")
    ap.add_argument("--partial-mib", type=float, default=1.0)
    args = ap.parse_args()
    print(run(args.quick, args.reference, args.partial_mib))
