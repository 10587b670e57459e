"""Fixtures for the pusher tests: a decoding MQTT subscriber and a pusher factory."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
import yaml

from services.common import codec
from services.common.auth import Role
from services.common.sensors import SensorMetadata
from services.common.settings import Config
from services.pusher.app import PusherService, create_service
from services.pusher.config import plugin_type, validate_section
from services.pusher.plugins import registry
from services.pusher.plugins.base import Group, Plugin, PluginContext
from tests.support.auth import MQTT_USER, TOKENS
from tests.support.servers import Mosquitto

if TYPE_CHECKING:
    from services.collect_agent.app import CollectAgent

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pusher"
AGENT_LOGIN: dict[str, str] = {"mqtt_username": MQTT_USER, "mqtt_password": TOKENS[Role.WRITE]}
"""Pusher settings logging in to a test collect agent: the write token as the MQTT
password (what ``kelvin up`` gives its pusher)."""


class Collector:
    """Subscribes to ``#`` on a real broker and decodes every PUBLISH as the agent would."""

    def __init__(self, port: int, client_id: str | None = None, clean: bool = True) -> None:
        self.port = port
        self.client_id = client_id
        self.clean = clean
        self.readings: dict[str, list[tuple[int, float]]] = {}
        self.raw: dict[str, list[tuple[int, float]]] = {}
        self.metadata: dict[str, SensorMetadata] = {}
        self.topics: list[str] = []
        self.errors: list[str] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self) -> Collector:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._subscribed.wait(), 10)
        return self

    async def _run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1", self.port, identifier=self.client_id, clean_session=self.clean
                ) as client:
                    await client.subscribe("#", qos=1)
                    self._subscribed.set()
                    async for msg in client.messages:
                        self._handle(str(msg.topic), bytes(msg.payload))  # type: ignore[arg-type]
            except aiomqtt.MqttError:
                self._subscribed.clear()
                await asyncio.sleep(0.05)  # broker down: poll until it is back

    def _handle(self, topic: str, payload: bytes) -> None:
        self.topics.append(topic)
        try:
            d = codec.decode_publish(topic, payload, time.time_ns())
        except Exception as exc:
            self.errors.append(f"{topic}: {exc}")
            return
        if d.metadata is not None:
            self.metadata[d.metadata.name] = d.metadata
        if d.batch is not None:
            for s in d.batch:
                scale = 1.0
                if d.raw_integers and s.sensor in self.metadata:
                    scale = self.metadata[s.sensor].scale
                pairs = list(
                    zip(s.timestamps_ns.tolist(), (s.values * scale).tolist(), strict=True)
                )
                self.readings.setdefault(s.sensor, []).extend(pairs)
        self._changed.set()

    async def wait_for(self, cond: Callable[[], bool], within_s: float = 15.0) -> None:
        """Wait until ``cond()`` holds after some message arrived (no polling sleeps)."""
        async with asyncio.timeout(within_s):
            while not cond():
                self._changed.clear()
                await self._changed.wait()

    async def wait_connected(self, within_s: float = 15.0) -> None:
        await asyncio.wait_for(self._subscribed.wait(), within_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[list[CollectAgent]]:
    """Collect agents started by a test (stopped after it), all on one SQLite database."""
    started: list[CollectAgent] = []
    yield started
    for a in reversed(started):
        await a.stop()


async def start_agent(tmp_path: Path, name: str, **settings: Any) -> CollectAgent:
    """A real collect agent (MQTT 5 endpoint) on SQLite in ``tmp_path``; add it to ``agents``."""
    from services.collect_agent.app import create_service as create_agent
    from tests.collect_agent.conftest import agent_config

    cfg = agent_config(
        tmp_path,
        {"sqlite": {"path": str(tmp_path / "kelvin.sqlite")}},
        spool_dir=str(tmp_path / f"spool-{name}"),
        **settings,
    )
    agent = create_agent(cfg)
    await agent.start()
    return agent


@pytest.fixture
async def collector(mosquitto_broker: Mosquitto) -> AsyncIterator[Collector]:
    c = await Collector(mosquitto_broker.port).start()
    try:
        yield c
    finally:
        await c.stop()


def make_config(
    tmp_path: Path,
    pusher: dict[str, Any],
    profile: str = "run",
    broker_port: int | None = None,
) -> Config:
    """A Config from a real YAML file (so that errors name it), HTTP on a free port."""
    section = {"host": "127.0.0.1", "port": 0, "state_dir": str(tmp_path / "state"), **pusher}
    if broker_port is not None:
        section.setdefault("brokers", [f"127.0.0.1:{broker_port}"])
    path = tmp_path / "kelvin.yaml"
    path.write_text(yaml.safe_dump({"pusher": section}))
    cfg = Config(path)
    cfg.profile = profile
    return cfg


@contextlib.asynccontextmanager
async def running(cfg: Config) -> AsyncIterator[PusherService]:
    svc = create_service(cfg)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


async def build_plugin(
    instance: str, section: dict[str, Any], prefix: str = "/t", config_dir: Path | None = None
) -> tuple[Plugin, list[Group]]:
    """Validate ``section`` as the real pusher does and build the plugin's groups."""
    _, cfg = validate_section(instance, section, "test")
    cls = registry.load(plugin_type(instance, section))
    ctx = PluginContext(
        instance=instance,
        prefix=cfg.prefix or f"{prefix}/{instance}",
        host_prefix=prefix,
        state_dir=Path("/nonexistent"),
        allocator_url="http://127.0.0.1:9",
        config_dir=config_dir,
    )
    plugin = cls(cfg, ctx)
    return plugin, await plugin.build()


def by_name(group: Group, values: Any) -> dict[str, float]:
    return {s.name: float(v) for s, v in zip(group.sensors, values, strict=True)}


class JsonServer:
    """A real HTTP server on a free loopback port answering GET with ``doc`` as JSON.

    ``path`` limits the answers to one path (404 elsewhere); ``status`` and ``doc``
    may be changed while it runs. Stands in for the allocator or a JSON device API.
    """

    def __init__(self, path: str | None = None) -> None:
        owner = self
        self.doc: Any = {}
        self.status = 200
        self.path = path

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = owner.path is None or self.path == owner.path
                body = json.dumps(owner.doc).encode()
                self.send_response(owner.status if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
