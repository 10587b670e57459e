"""Fixtures: a real query API service on a free loopback port over a temporary SQLite file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from services.common.auth import Role
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.common.settings import Config
from services.common.storage.base import StorageBackend
from services.query_api.app import QueryApiService, create_service
from tests.support.auth import TOKENS, headers, with_auth

T0 = 1_780_000_000 * 10**9
"""A round epoch (2026-05-28T20:26:40Z) the tests place readings at."""
S = 10**9


@dataclass
class Api:
    service: QueryApiService
    client: httpx.AsyncClient

    @property
    def storage(self) -> StorageBackend:
        assert self.service.storage is not None
        return self.service.storage

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    async def write(
        self,
        sensor: str,
        ts_s: list[float] | np.ndarray,
        values: list[float] | np.ndarray,
        unit: str | None = None,
    ) -> None:
        """Store readings at ``T0 + ts_s`` seconds (and the unit, if given)."""
        ts = T0 + np.round(np.asarray(ts_s, dtype=np.float64) * S).astype(np.int64)
        await self.storage.write(Batch.single(sensor, ts, values))
        if unit is not None:
            await self.storage.put_metadata(SensorMetadata(name=sensor, unit=unit))

    async def values(self, sensor: str, start_s: float = 0, end_s: float = 11) -> list[Any]:
        """``GET /api/v1/readings`` of ``[T0 + start_s, T0 + end_s)``: the JSON values."""
        r = await self.client.get(
            "/api/v1/readings",
            params={
                "sensor": sensor,
                "start": str(T0 + int(start_s * S)),
                "end": str(T0 + int(end_s * S)),
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["values"]  # type: ignore[no-any-return]


PUE = '("/a/power" + "/b/power") / "/it/power"'
"""The issue's example: inputs 1 s and 2 s apart, in W and kW (see :func:`mixed_inputs`)."""


async def mixed_inputs(api: Api) -> None:
    """/a/power in W every 1 s; /b/power in kW every 2 s; /it/power in kW every 1 s."""
    await api.write("/a/power", np.arange(11), 100 + 10 * np.arange(11.0), unit="W")
    await api.write("/b/power", np.arange(0, 11, 2), [0.2, 0.4, 0.1, 0.3, 0.3, 0.5], unit="kW")
    await api.write("/it/power", np.arange(11), np.full(11, 0.1), unit="kW")


def make_config(tmp_path: Path, auth: dict[str, Any] | None = None, **query_api: object) -> Config:
    """A query API on a free loopback port with the test credentials (plus ``auth`` keys)."""
    return Config(
        overrides=with_auth(
            {
                "query_api": {"host": "127.0.0.1", "port": 0, "virtual_settle_s": 0, **query_api},
                "storage": {"sqlite": {"path": str(tmp_path / "kelvin.sqlite")}},
            },
            **(auth or {}),
        )
    )


def admin_client(port: int | None, **kw: Any) -> httpx.AsyncClient:
    """A client of the query API on ``port`` holding the admin token."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers(), **kw)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    svc = create_service(make_config(tmp_path))
    await svc.start()
    try:
        async with admin_client(svc.port, timeout=30) as c:
            yield Api(svc, c)
    finally:
        await svc.stop()


@pytest.fixture
def kelvin(api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run ``kelvin ARGS`` in a thread against ``api``; returns (exit code, stdout, stderr).
    A usage error (argparse's SystemExit) is its exit code; a traceback fails the test."""
    monkeypatch.setenv("KELVIN_QUERY_API_URL", api.url)
    monkeypatch.setenv("KELVIN_QUERY_API_TOKEN", TOKENS[Role.ADMIN])

    async def run(*args: str) -> tuple[int, str, str]:
        from services.cli import main

        capsys.readouterr()
        try:
            rc = await asyncio.to_thread(main, list(args))
        except SystemExit as exc:
            rc = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return rc, out, err

    return run
