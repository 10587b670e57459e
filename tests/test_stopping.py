"""Every ``kelvin`` process stops on SIGTERM and on Ctrl-C (SIGINT), within its deadline.

Real processes: ``kelvin up``, ``kelvin up --demo`` and ``kelvin run <service>`` for each
service. As it begins to stop, a process logs the deadline it keeps
(docs/architecture.md: every service's ``stop_timeout_s`` and grace plus an exit margin;
past it, it exits with status 1 whatever hangs); :meth:`KelvinUp.stop` waits that long
plus a margin, so a stop that hangs fails here instead of hanging the suite. Exit status
0 means every service stopped within its own ``stop_timeout_s``. How fast is not asserted.

``kelvin up`` on SIGTERM is tests/test_end_to_end.py's last test and ``kelvin up --demo``
on SIGINT is tests/test_demo.py's fixture; this module has the two other pairs.

The pusher's and the allocator's broker, and the Slurm bridge's slurmrestd and allocator,
are a :class:`SilentPeer`: it takes the connection and never answers (an MQTT CONNECT
without CONNACK, an HTTP request without response), the peer that kept stops waiting;
the process is stopped while it waits.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.support.kelvin import KelvinUp

pytestmark = pytest.mark.slow

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SilentPeer:
    """A loopback port that accepts connections, holds them and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self.arrived = threading.Condition()
        threading.Thread(target=self._accept, name="silent-peer", daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed: the test is over
            while True:
                conn, _ = self.sock.accept()
                with self.arrived:
                    self.held.append(conn)
                    self.arrived.notify_all()

    def wait_connections(self, n: int, timeout_s: float = 30.0) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.held) >= n, timeout_s):
                raise TimeoutError(f"{len(self.held)} of {n} connections within {timeout_s} s")

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentPeer]:
    peer = SilentPeer()
    try:
        yield peer
    finally:
        peer.close()


def _assert_stopped(up: KelvinUp, sig: signal.Signals, rc: int) -> None:
    out = up.tail(6000)
    assert rc == 0, f"exit status {rc} after {sig.name}:\n{out}"
    assert f"received {sig.name}" in up.output(), out
    assert "did not stop" not in up.output(), out


@pytest.mark.parametrize(
    ("args", "sig"), [((), signal.SIGINT), (("--demo",), signal.SIGTERM)], ids=["up", "demo"]
)
def test_kelvin_up_stops_within_its_deadline(
    tmp_path: Path, args: tuple[str, ...], sig: signal.Signals
) -> None:
    up = KelvinUp(tmp_path, *args).start(timeout_s=120.0)
    try:
        _assert_stopped(up, sig, up.stop(sig))
    finally:
        up.stop()


SERVICES = ("collect-agent", "query-api", "allocator", "pusher", "slurm-bridge")
CONNECTS_TO = {"pusher": "mqtt", "allocator": "mqtt", "slurm-bridge": "allocator"}
"""Who waits on a peer, and the port flag that names it when it runs alone."""


def _config(path: Path, silent: int) -> Path:
    nowhere = f"http://127.0.0.1:{silent}"
    bridge = {"slurmrestd_url": nowhere, "allocator_url": nowhere, "token": "never-checked"}
    sections = {"pusher": {"plugins": {"tester": {"sensors": 2, "interval": 100}}}}
    path.write_text(yaml.safe_dump({**sections, "slurm_bridge": bridge}))
    return path


@pytest.mark.parametrize("service", SERVICES)
def test_kelvin_run_stops_within_its_deadline_on_sigterm_and_sigint(
    tmp_path: Path, silent: SilentPeer, service: str
) -> None:
    """One process per signal, side by side; one that talks to a peer is stopped while
    the silent peer holds its connection."""
    config = _config(tmp_path / "kelvin.yaml", silent.port)
    peer = CONNECTS_TO.get(service)
    procs = {}
    for sig in SIGNALS:
        data = tmp_path / sig.name
        data.mkdir()
        procs[sig] = KelvinUp(
            data,
            "--host",
            "127.0.0.1",
            config=config,
            command=("run", service),
            ports={peer: silent.port} if peer else {},
        )
    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(lambda up: up.start(timeout_s=60.0), procs.values()))
            if peer:
                silent.wait_connections(len(procs))
            codes = dict(zip(procs, pool.map(lambda s: procs[s].stop(s), procs), strict=True))
        for sig, up in procs.items():
            _assert_stopped(up, sig, codes[sig])
    finally:
        for up in procs.values():
            up.stop()
