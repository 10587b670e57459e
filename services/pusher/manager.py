"""Plugin instances at run time: load, start, stop, unload, reload, apply a new config.

Every operation is one coroutine that leaves the instance in a known state;
the REST API and a configuration reload call them under one lock, so two
concurrent requests never interleave. A configuration error (bad key, unknown
plugin, unreadable path) raises :class:`ConfigError`; a source that fails while
building (device unreachable) leaves the instance in state ``error`` with the
reason, so one broken device does not keep the node's other sensors down.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from services.common import names
from services.common.errors import ConfigError, KelvinError, NotFoundError, SensorNameError
from services.common.tasks import bounded, stop_task, wait_for
from services.pusher.config import plugin_type, validate_section
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import Group, Plugin, PluginConfig, PluginContext, Restrictions
from services.pusher.publisher import Publisher
from services.pusher.sampling import Cache, GroupRunner, Ticker

log = logging.getLogger(__name__)

State = Literal["running", "stopped", "error"]
BUILD_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0
"""How long a plugin's close may take (a stop must reach the publisher's flush)."""
REQUEST_BODY = "request body"
"""The origin of a section that came over REST: it gets the :class:`Restrictions`."""


@dataclass
class Instance:
    """One loaded plugin instance."""

    name: str
    kind: str
    section: dict[str, Any]
    config: PluginConfig
    plugin: Plugin | None = None
    runners: list[GroupRunner] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    state: State = "stopped"
    error: str | None = None
    origin: str = ""
    """Where the section came from (the file, or ``request body``)."""

    @property
    def sensor_names(self) -> list[str]:
        return [n for r in self.runners for n in r.route.names]

    def status(self, detail: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "plugin": self.kind,
            "state": self.state,
            "error": self.error,
            "groups": len(self.runners),
            "sensors": sum(r.route.n for r in self.runners),
            "notes": list(self.plugin.notes) if self.plugin is not None else [],
        }
        if detail:
            out["group_status"] = [r.status() for r in self.runners]
        return out


class PluginManager:
    """Owns the plugin instances of one pusher."""

    def __init__(
        self,
        cache: Cache,
        publisher: Publisher,
        metrics: PusherMetrics,
        context: Callable[[str, PluginConfig], PluginContext],
        stamp_read_time: bool = False,
        restrictions: Callable[[], Restrictions] | None = None,
    ) -> None:
        self.cache = cache
        self.publisher = publisher
        self.metrics = metrics
        self.context = context
        self.stamp_read_time = stamp_read_time
        self.restrictions = restrictions or Restrictions
        """What a section from a request body may use (files, hosts, commands)."""
        self.instances: dict[str, Instance] = {}
        self.lock = asyncio.Lock()
        self.ticker = Ticker()
        """One timer per sampling instant for every group of this pusher."""

    def get(self, name: str) -> Instance:
        inst = self.instances.get(name)
        if inst is None:
            known = ", ".join(sorted(self.instances)) or "none"
            raise NotFoundError(f"no plugin instance {name!r} is loaded; loaded: {known}")
        return inst

    def owner_of(self) -> dict[str, str]:
        return {n: i.name for i in self.instances.values() for n in i.sensor_names}

    # ------------------------------------------------------------------ operations

    async def load(self, name: str, section: dict[str, Any], origin: str) -> Instance:
        if name in self.instances:
            raise ConfigError(f"plugin instance {name!r} is already loaded; unload or reload it")
        _, cfg = validate_section(name, section, origin)
        inst = Instance(name, plugin_type(name, section), section, cfg, origin=origin)
        await self._build(inst, origin)
        self.instances[name] = inst
        self._gauges()
        if cfg.autostart and inst.state != "error":
            self._start(inst)
        return inst

    async def _build(self, inst: Instance, origin: str) -> None:
        cls, cfg = validate_section(inst.name, inst.section, origin)
        ctx = self.context(inst.name, cfg)
        if origin == REQUEST_BODY:
            ctx.restrictions = self.restrictions()
        plugin = cls(cfg, ctx)
        inst.plugin, inst.config = plugin, cfg
        try:
            groups = await wait_for(plugin.build(), BUILD_TIMEOUT_S)
        except ConfigError:
            await plugin.close()
            raise
        except Exception as exc:  # a device library's own error or a plugin's bug
            await plugin.close()
            inst.state = "error"
            inst.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.error("plugin %s could not start: %s", inst.name, inst.error)
            return
        taken = self.owner_of()
        seen: set[str] = set()
        for g in groups:
            for s in g.sensors:
                try:
                    names.validate(s.name)
                except SensorNameError as exc:
                    await _discard(plugin, groups)
                    raise ConfigError(f"{origin}: pusher.plugins.{inst.name}: {exc}") from exc
                other = taken.get(s.name)
                if s.name in seen or (other is not None and other != inst.name):
                    await _discard(plugin, groups)
                    by = f"plugin {other!r}" if other and other != inst.name else "itself"
                    raise ConfigError(
                        f"{origin}: pusher.plugins.{inst.name}: sensor {s.name} is already "
                        f"published by {by}; set a different 'prefix'"
                    )
                seen.add(s.name)
        inst.runners = [
            GroupRunner(
                inst.name,
                g,
                self.cache,
                self.publisher.submit,
                self.metrics,
                self.stamp_read_time,
                ticker=self.ticker,
            )
            for g in groups
            if g.sensors
        ]
        announce = [
            s.metadata(r.opts.interval_ms)
            for r in inst.runners
            for s in r.group.sensors
            if s.options.publish
        ]
        self.publisher.announce(announce)
        inst.state, inst.error = "stopped", None

    def _start(self, inst: Instance) -> None:
        for r in inst.runners:
            task = asyncio.create_task(r.run(), name=f"pusher:{r.name}")
            task.add_done_callback(functools.partial(self._runner_done, inst))
            inst.tasks.append(task)
        inst.state = "running"
        self._gauges()

    def _runner_done(self, inst: Instance, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        inst.state = "error"
        inst.error = f"sampling stopped: {task.exception()!r}"
        log.error("plugin %s: %s", inst.name, inst.error, exc_info=task.exception())

    async def start(self, name: str) -> Instance:
        inst = self.get(name)
        if inst.state == "running":
            return inst
        if inst.state == "error" and not inst.runners:
            raise KelvinError(f"plugin {name!r} is in error ({inst.error}); reload it instead")
        if inst.tasks:  # one group died, the others still sample: restart them all once
            await self.stop(name)
        self._start(inst)
        return inst

    async def stop(self, name: str) -> Instance:
        inst = self.get(name)
        for t in inst.tasks:
            t.cancel()
        for t in inst.tasks:
            # Bounded: a group stuck in its read must not keep the publisher from flushing.
            await stop_task(t, what=f"sampling task {t.get_name()}")
        inst.tasks.clear()
        for r in inst.runners:
            if r.queue:  # hand over what min_values held back
                self.publisher.submit(r.take())
        if inst.state == "running":
            inst.state = "stopped"
        self._gauges()
        return inst

    async def unload(self, name: str) -> None:
        inst = self.get(name)
        await self.stop(name)
        self._release(inst)
        if inst.plugin is not None:
            await bounded(inst.plugin.close(), CLOSE_TIMEOUT_S, f"closing plugin {name}")
        del self.instances[name]
        self._gauges()

    def _release(self, inst: Instance) -> None:
        self.publisher.withdraw(inst.sensor_names)
        for r in inst.runners:
            r.close()
            r.drop_cache()
        inst.runners = []

    async def reload(self, name: str, section: dict[str, Any], origin: str) -> Instance:
        """Unload and load again with ``section`` (validated first: a bad one changes nothing)."""
        validate_section(name, section, origin)
        was = self.get(name)
        await self.unload(name)
        try:
            return await self.load(name, section, origin)
        except ConfigError:
            # e.g. a sensor clash found only while building: keep the old one running.
            await self.load(name, was.section, was.origin or origin)
            raise

    async def apply(self, sections: dict[str, dict[str, Any]], origin: str) -> dict[str, list[str]]:
        """Make the loaded instances match ``sections``; returns what changed."""
        for name, section in sections.items():
            validate_section(name, section, origin)
        changes: dict[str, list[str]] = {"loaded": [], "unloaded": [], "reloaded": []}
        for name in list(self.instances):
            if name not in sections:
                await self.unload(name)
                changes["unloaded"].append(name)
        for name, section in sections.items():
            inst = self.instances.get(name)
            if inst is None:
                await self.load(name, section, origin)
                changes["loaded"].append(name)
            elif inst.section != section or inst.state == "error":
                await self.reload(name, section, origin)
                changes["reloaded"].append(name)
        return changes

    async def close(self) -> None:
        for name in list(self.instances):
            try:
                await self.unload(name)
            except Exception:
                log.exception("unloading %s failed", name)

    def _gauges(self) -> None:
        running = [i for i in self.instances.values() if i.state == "running"]
        self.metrics.plugins.set(len(running))
        self.metrics.sensors.set(sum(len(i.sensor_names) for i in self.instances.values()))


async def _discard(plugin: Plugin, groups: list[Group]) -> None:
    """Release a plugin whose groups will never run (its file descriptors, connections)."""
    for g in groups:
        try:
            g.close()
        except Exception:
            log.exception("closing group %s failed", g.name)
    await plugin.close()
