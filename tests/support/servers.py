"""Start real third-party servers (mosquitto, ...) on free loopback ports.

A missing binary fails the test when ``CI=true`` (CI installs everything via
``make test``) and skips it with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binary(name: str, package: str) -> str:
    """Path of ``name``; fail in CI, skip elsewhere when it is missing."""
    path = shutil.which(name) or next(
        (
            p
            for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}", f"/usr/local/bin/{name}")
            if os.path.exists(p)
        ),
        None,
    )
    if path:
        return path
    msg = f"{name} not installed (Debian package {package}; `make test` installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


def wait_port(
    port: int,
    host: str = "127.0.0.1",
    timeout: float = 10.0,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``port`` (a server started now could bind it). With
    SO_REUSEADDR, as every server here binds: connections the server closed first wait
    in TIME_WAIT on its port for a minute, and do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Mosquitto:
    """A real mosquitto broker on a free loopback port (MQTT v3.1.1 and v5)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.binary = require_binary("mosquitto", "mosquitto")
        self.port = port or free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Mosquitto:
        conf = self.workdir / f"mosquitto-{self.port}.conf"
        # Stock mosquitto drops QoS 1 under load (max_queued_messages 1000) and
        # batches with Nagle; both would make tests flaky (see measured-here.md).
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
            "max_queued_messages 0\nmax_inflight_messages 0\npersistence false\n"
        )
        self.log = open(self.workdir / f"mosquitto-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(conf)], stdout=self.log, stderr=subprocess.STDOUT
        )
        wait_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def mosquitto(workdir: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(workdir).start()
    try:
        yield broker
    finally:
        broker.stop()
