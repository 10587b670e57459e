"""Fixtures for the collect agent: a real agent on free loopback ports with SQLite in tmp."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.collect_agent.app import CollectAgent, create_service
from services.common.settings import Config
from tests.support.auth import with_auth
from tests.support.influxdb import InfluxDB

AgentFactory = Callable[..., Awaitable[CollectAgent]]


def agent_config(
    tmp_path: Path,
    storage: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    **settings: Any,
) -> Config:
    """An agent's Config: ``settings`` its section, ``auth`` keys over the test tokens."""
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "mqtt_port": 0,
        "spool_dir": str(tmp_path / "spool"),
        "connect_timeout_s": 2.0,
    }
    base.update(settings)
    return Config(
        overrides=with_auth(
            {
                "collect_agent": base,
                "storage": storage or {"sqlite": {"path": str(tmp_path / "kelvin.sqlite")}},
            },
            **(auth or {}),
        )
    )


@pytest.fixture
async def make_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """Start agents (stopped after the test); keyword arguments are collect_agent settings,
    ``storage`` the storage section, ``auth`` keys of the auth section."""
    started: list[CollectAgent] = []

    async def make(
        storage: dict[str, Any] | None = None, auth: dict[str, Any] | None = None, **settings: Any
    ) -> CollectAgent:
        agent = create_service(agent_config(tmp_path, storage, auth, **settings))
        await agent.start()
        started.append(agent)
        return agent

    yield make
    for agent in reversed(started):
        await agent.stop()


@pytest.fixture
async def agent(make_agent: AgentFactory) -> CollectAgent:
    return await make_agent()


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    """One real influxd for the agent tests that stop and start it (each its own database;
    a test that stops it starts it again)."""
    server = InfluxDB(tmp_path_factory.mktemp("influxd")).start()
    try:
        yield server
    finally:
        server.stop()
