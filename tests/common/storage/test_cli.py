"""``kelvin config db ...`` through the real CLI entry point, on a SQLite file."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from services.cli import main
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage

S = 10**9


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config file pointing at a SQLite file with three sensors of 100 s of readings."""
    db = tmp_path / "k.sqlite"
    now = time.time_ns()

    async def fill() -> None:
        st = SqliteStorage(SqliteSettings(path=db))
        await st.open()
        ts = now - np.arange(100)[::-1] * S
        for name in ("/a/x", "/a/y", "/b/z"):
            await st.write(Batch.single(name, ts, np.ones(100)))
        await st.put_metadata(SensorMetadata(name="/b/z", ttl_ms=10_000))
        await st.close()

    asyncio.run(fill())
    path = tmp_path / "kelvin.yaml"
    path.write_text(f"storage:\n  backend: sqlite\n  sqlite:\n    path: {db}\n")
    return path


def read_counts(config: Path) -> dict[str, int]:
    db = config.parent / "k.sqlite"

    async def go() -> dict[str, int]:
        st = SqliteStorage(SqliteSettings(path=db))
        await st.open()
        got = await st.read_many(["/a/x", "/a/y", "/b/z"], 0, 2**62)
        await st.close()
        return {k: len(v) for k, v in got.items()}

    return asyncio.run(go())


def test_stats_json_and_text(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "db", "stats", "--config", str(config), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["backend"] == "sqlite" and stats["sensors"] == 3 and stats["readings"] == 300
    assert main(["config", "db", "stats", "--config", str(config)]) == 0
    assert "readings" in capsys.readouterr().out


def test_truncate_needs_yes_then_deletes_under_prefix(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["config", "db", "truncate", "--config", str(config), "--before", "now-50s"]
    assert main([*args, "--prefix", "/a"]) == 2
    assert "add --yes" in capsys.readouterr().err
    assert read_counts(config) == {"/a/x": 100, "/a/y": 100, "/b/z": 100}
    assert main([*args, "--prefix", "/a", "--yes"]) == 0
    assert "deleted" in capsys.readouterr().out
    counts = read_counts(config)
    assert counts["/b/z"] == 100 and 49 <= counts["/a/x"] <= 51 and counts["/a/x"] == counts["/a/y"]


def test_retention_applies_ttl(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "db", "retention", "--config", str(config)]) == 0
    assert "deleted" in capsys.readouterr().out
    counts = read_counts(config)
    assert counts["/a/x"] == 100 and 9 <= counts["/b/z"] <= 11


def test_bad_arguments_exit_2_with_the_flag(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["config", "db", "truncate", "--config", str(config), "--yes"]
    assert main([*base, "--before", "yesterday-ish"]) == 2
    assert "--before" in capsys.readouterr().err
    assert main([*base, "--before", "now", "--prefix", "a+b"]) == 2
    assert "--prefix" in capsys.readouterr().err
    bad = config.parent / "bad.yaml"
    bad.write_text("storage:\n  backend: cassandra\n")
    assert main(["config", "db", "stats", "--config", str(bad)]) == 2
    assert "storage.backend" in capsys.readouterr().err
