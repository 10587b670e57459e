"""``kelvin run``/``up`` and ``kelvin config db`` when things are wrong: every taken port named at
once before anything starts, nothing left behind by a failed start, the data directory found."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.cli import main
from services.common.readings import Batch
from services.common.storage import open_storage
from services.common.storage.settings import SqliteSettings, StorageSettings
from tests.support.servers import free_port

PORT_FLAGS = (
    "--mqtt-port",
    "--collect-agent-port",
    "--pusher-port",
    "--query-api-port",
    "--allocator-port",
)


@pytest.fixture(autouse=True)
def _own_logging() -> Iterator[None]:
    """``kelvin run``/``up`` set up logging on the captured stderr: undo it for later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """Three ports held by 'another process'."""
    socks = []
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        socks.append(s)
    try:
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_every_taken_port_is_named_at_once_and_nothing_starts(
    taken: list[int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = dict(
        zip(PORT_FLAGS, [taken[0], taken[1], free_port(), taken[2], free_port()], strict=True)
    )
    args = [x for flag, port in ports.items() for x in (flag, str(port))]
    data = tmp_path / "data"
    assert main(["up", "--data-dir", str(data), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kelvin: 3 ports are not available:")
    for flag in ("--mqtt-port", "--collect-agent-port", "--query-api-port"):
        assert f"port {ports[flag]} on 127.0.0.1 is already in use" in err and flag in err
    assert "Traceback" not in err
    assert not data.exists()  # no token file, no state directory, no database


def test_a_taken_pusher_port_alone_is_named_without_a_traceback(
    taken: list[int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The report: the pusher's conflict came last and ended in "Event loop is closed".
    ports = {flag: free_port() for flag in PORT_FLAGS} | {"--pusher-port": taken[0]}
    args = [x for flag, port in ports.items() for x in (flag, str(port))]
    data = tmp_path / "data"
    assert main(["up", "--data-dir", str(data), *args]) == 1
    err = capsys.readouterr().err
    assert f"port {taken[0]} on 127.0.0.1 is already in use" in err and "--pusher-port" in err
    assert "Traceback" not in err and "Event loop is closed" not in err
    assert not data.exists()


def test_two_services_on_one_port_is_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, other = free_port(), free_port()
    args = ["--query-api-port", str(port), "--allocator-port", str(port)]
    args += ["--mqtt-port", str(other), "--collect-agent-port", str(free_port())]
    args += ["--pusher-port", str(free_port())]
    assert main(["up", "--data-dir", str(tmp_path / "d"), *args]) == 1
    err = capsys.readouterr().err
    assert f"query-api HTTP and allocator HTTP both want 127.0.0.1:{port}" in err


def test_a_failed_start_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KELVIN_ALLOCATOR_HALL_FILE", str(tmp_path / "no-such-hall.yaml"))
    data = tmp_path / "data"
    rc = main(["run", "allocator", "--data-dir", str(data), "--allocator-port", str(free_port())])
    assert rc == 2
    assert "no-such-hall.yaml: cannot read hall file" in capsys.readouterr().err
    assert not data.exists()
    # ... but a directory that was there before stays, with what it held
    data.mkdir()
    (data / "keep.txt").write_text("mine")
    assert (
        main(["run", "allocator", "--data-dir", str(data), "--allocator-port", str(free_port())])
        == 2
    )
    assert [p.name for p in data.iterdir()] == ["keep.txt"]


def _store(path: Path) -> None:
    async def write() -> None:
        backend = await open_storage(StorageSettings(sqlite=SqliteSettings(path=path)))
        ts = np.arange(3, dtype=np.int64) * 10**9 + 1_700_000_000 * 10**9
        await backend.write(Batch.single("/a/p", ts, np.ones(3)))
        await backend.close()

    asyncio.run(write())


def test_config_db_finds_the_data_directory_and_warns_about_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(tmp_path / "site" / "kelvin.sqlite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["config", "db", "stats", "--json", "--data-dir", str(tmp_path / "site")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["readings"] == 3 and not err
    # From another directory without --data-dir: a warning that names where it looked.
    assert main(["config", "db", "truncate", "--before", "now-2y", "--yes"]) == 0
    out, err = capsys.readouterr()
    assert f"no database at {elsewhere / 'data' / 'kelvin.sqlite'}" in err
    assert "--data-dir" in err and "deleted 0 readings" in out
    assert (
        main(
            [
                "config",
                "db",
                "truncate",
                "--before",
                "now-90days",
                "--yes",
                "--data-dir",
                str(tmp_path / "site"),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "deleted 3 readings" in out and "older than 20" in out and not err
