"""A real Alertmanager for the session; query APIs with rule files per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.query_api.app import create_service
from tests.collect_agent.conftest import make_agent  # noqa: F401 (a fixture, re-exported)
from tests.query_api.conftest import Api, admin_client, make_config
from tests.support.alertmanager import Alertmanager


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path_factory.mktemp("alertmanager")).start()
    try:
        yield am
    finally:
        am.stop()


RulesApi = Callable[..., Awaitable[Api]]


@pytest.fixture
async def rules_api(tmp_path: Path) -> AsyncIterator[RulesApi]:
    """Start a query API with a rule file (text) and any query_api settings."""
    started = []

    async def make(rules: str, **settings: Any) -> Api:
        f = tmp_path / f"rules{len(started)}.yml"
        f.write_text(rules)
        svc = create_service(make_config(tmp_path, rule_files=[str(f)], **settings))
        await svc.start()
        client = admin_client(svc.port, timeout=30)
        started.append((svc, client))
        return Api(svc, client)

    yield make
    for svc, client in reversed(started):
        await client.aclose()
        await svc.stop()
