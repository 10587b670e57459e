"""Plugin instances at run time: a group that dies, a plugin whose build has a bug."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from services.common.sensors import SensorMetadata
from services.pusher import config
from services.pusher.cache import SensorCache
from services.pusher.manager import PluginManager
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins import registry
from services.pusher.plugins.base import Group, Plugin, PluginConfig, PluginContext
from services.pusher.publisher import Publisher
from services.pusher.sampling import Chunk


class Recorder(Publisher):
    """Keeps what the manager hands over (no broker: these tests are about the manager)."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def submit(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)

    def announce(self, metadata: Sequence[SensorMetadata]) -> None:
        pass

    def withdraw(self, names: Iterable[str]) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    @property
    def connected(self) -> bool:
        return True

    def status(self) -> dict[str, object]:
        return {}


def manager() -> PluginManager:
    def context(instance: str, cfg: PluginConfig) -> PluginContext:
        return PluginContext(instance, f"/m/{instance}", "/m", Path("/nonexistent"), "")

    return PluginManager(SensorCache(), Recorder(), PusherMetrics(), context)


async def test_starting_an_instance_whose_group_died_runs_each_group_once() -> None:
    mgr = manager()
    inst = await mgr.load("tester", {"sensors": 4, "groups": 2, "interval": 1}, "test")
    assert len(inst.tasks) == 2

    def broken(ts: int, raw: object) -> None:
        raise RuntimeError("group bug (test)")

    inst.runners[0].ingest = broken  # type: ignore[method-assign]
    with contextlib.suppress(RuntimeError):
        await inst.tasks[0]
    assert inst.state == "error" and "group bug" in (inst.error or "")
    del inst.runners[0].ingest  # fixed: the operator starts it again
    await mgr.start("tester")
    live = [t for t in inst.tasks if not t.done()]
    assert inst.state == "running" and len(live) == 2
    assert {t.get_name() for t in live} == {f"pusher:{r.name}" for r in inst.runners}
    await mgr.close()


class BuggyPlugin(Plugin):
    """A third-party plugin whose build() has a bug."""

    async def build(self) -> list[Group]:
        raise KeyError("serial")


async def test_a_plugin_whose_build_fails_unexpectedly_is_in_error_and_others_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = registry.load
    monkeypatch.setattr(
        config.registry, "load", lambda name: BuggyPlugin if name == "buggy" else real(name)
    )
    mgr = manager()
    bad = await mgr.load("buggy", {}, "test")
    assert bad.state == "error" and bad.error == "KeyError: 'serial'" and not bad.runners
    good = await mgr.load("tester", {"sensors": 1, "interval": 1}, "test")
    assert good.state == "running"
    await mgr.close()
