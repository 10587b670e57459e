"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import Mosquitto, free_port


@pytest.fixture
def port() -> int:
    """A free loopback TCP port."""
    return free_port()


@pytest.fixture
def mosquitto_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real mosquitto on a free loopback port, stopped after the test."""
    broker = Mosquitto(tmp_path).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests leave artefacts (screenshots, plots) for humans: test-artifacts/."""
    d = Path(__file__).resolve().parent.parent / "test-artifacts"
    d.mkdir(exist_ok=True)
    return d
