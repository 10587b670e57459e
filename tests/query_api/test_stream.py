"""Streamed plain answers: a real query API over SQLite on loopback, a real HTTP client."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from services.common.readings import Batch
from services.query_api.app import create_service
from tests.query_api.conftest import T0, make_config
from tests.support.chunks import count_decodes

MS = 10**6


@pytest.mark.parametrize("fmt", ["json", "csv"])
async def test_a_streamed_answer_decodes_each_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """600k readings in ~74 sealed chunks, streamed in 8 slices: each chunk is decoded
    once (the probe and the slices begin where chunks do), and the answer is the one
    read in a single slice, byte for byte."""
    n = 600_000
    ts = T0 + np.arange(n, dtype=np.int64) * MS
    values = np.round(np.random.default_rng(3).normal(250, 40, n), 3)
    bodies = {}
    for pieces in (1, 8):
        svc = create_service(make_config(tmp_path / str(pieces), stream_pieces=pieces))
        await svc.start()
        try:
            assert svc.storage is not None
            await svc.storage.write(Batch.single("/big", ts, values))
            await svc.storage.compact()  # type: ignore[attr-defined]
            con = sqlite3.connect(tmp_path / str(pieces) / "kelvin.sqlite")
            stored = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
            con.close()
            assert stored > 70
            decoded = count_decodes(monkeypatch)
            params = {"sensor": "/big", "start": str(T0), "end": str(T0 + n * MS), "format": fmt}
            async with httpx.AsyncClient(timeout=60) as client:
                r = await client.get(f"http://127.0.0.1:{svc.port}/api/v1/readings", params=params)
            monkeypatch.undo()
            assert r.status_code == 200, r.text
            bodies[pieces] = r.content
            assert len(decoded) == stored, (pieces, len(decoded), stored)
        finally:
            await svc.stop()
    assert bodies[1] == bodies[8]
