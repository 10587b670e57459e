"""The pusher service: its one door (built from settings, owns its clients).

``create_service(config)`` validates the whole ``pusher`` section, every
plugin section included, before anything starts (a bad file exits with code 2
and a message naming the key). ``start`` binds the HTTP port, connects to the
brokers in the background (readings buffer until one answers) and loads the
plugins; ``stop`` stops sampling, flushes what the broker will take within
``flush_timeout_s`` and disconnects.

A pusher runs on compute nodes, so this process imports only what a node needs:
no web framework (its REST API is :mod:`services.pusher.http`), no numpy, no
pydantic, no Prometheus or MQTT client library; plugins and their libraries
load only when configured. ``tests/test_architecture.py`` keeps it so.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from services.common import names
from services.common.auth import (
    AuthError,
    BrowserPolicy,
    Credentials,
    Role,
    Tokens,
    is_loopback,
    resolve_tokens,
)
from services.common.auth_settings import AuthSettings
from services.common.config import Config
from services.common.errors import ConfigError, NotFoundError
from services.common.mqtt_credentials import read_password
from services.common.net import Listener
from services.common.service import Service
from services.pusher.api import create_router
from services.pusher.cache import SensorCache
from services.pusher.config import plugin_sections, validate_section
from services.pusher.http import Guard, HttpServer
from services.pusher.manager import REQUEST_BODY, PluginManager
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import PluginConfig, PluginContext, Restrictions
from services.pusher.prom import Registry
from services.pusher.publisher import MqttOptions, MqttPublisher
from services.pusher.settings import Settings, short_hostname

log = logging.getLogger(__name__)

# Settings a running pusher cannot change without a restart (a reload reports them).
_RESTART_KEYS = (
    "host",
    "port",
    "brokers",
    "prefix",
    "client_id",
    "mqtt_username",
    "mqtt_password",
    "mqtt_password_file",
    "mqtt_tls",
    "mqtt_tls_ca",
    "mqtt_tls_server_name",
    "mqtt_version",
    "format",
    "qos",
    "push",
    "burst_interval_ms",
    "announce_metadata",
    "buffer_readings",
    "max_inflight",
    "batch_max_bytes",
    "keepalive_s",
    "reconnect_max_s",
    "reconnect_jitter_s",
    "timestamps",
    "cache_s",
    "cache_max_points",
    "state_dir",
    "keep_unsent",
    "allocator_url",
)
_RELOADED_KEYS = ("token", "auth_reads", "flush_timeout_s", "file_roots", "rest_hosts")
"""Settings a configuration reload applies at once."""


def mqtt_options(settings: Settings) -> MqttOptions:
    return MqttOptions(
        brokers=settings.broker_list(),
        client_id=settings.client_id or f"kelvin-pusher-{short_hostname()}-{secrets.token_hex(3)}",
        format=settings.format,
        qos=settings.qos,
        bursty=settings.push == "bursty",
        burst_interval_ms=settings.burst_interval_ms,
        buffer_readings=settings.buffer_readings,
        max_inflight=settings.max_inflight,
        batch_max_bytes=settings.batch_max_bytes,
        keepalive_s=settings.keepalive_s,
        reconnect_max_s=settings.reconnect_max_s,
        reconnect_jitter_s=settings.reconnect_jitter_s,
        flush_timeout_s=settings.flush_timeout_s,
        username=settings.mqtt_username,
        password=read_password(
            settings.mqtt_password, settings.mqtt_password_file, "pusher.mqtt_password_file"
        ),
        tls=settings.mqtt_tls,
        tls_ca=settings.mqtt_tls_ca,
        tls_server_name=settings.mqtt_tls_server_name,
        mqtt_version={"auto": None, "5": 5, "3.1.1": 4}[settings.mqtt_version],
        announce=settings.announce_metadata,
        spool_path=settings.state_dir / "unsent.bin" if settings.keep_unsent else None,
    )


class _Http:
    """Where the REST API listens (what ``kelvin up`` prints); bound in ``start``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.server: HttpServer | None = None


class PusherService(Service):
    """Sampling, publishing and the REST API of one node's pusher."""

    name = "pusher"

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.settings = config.load(Settings)
        self.auth = config.load(AuthSettings).to_config()
        self.origin = str(config.path) if config.path else "settings"
        self.sections = plugin_sections(self.settings.plugins, config.profile)
        for name, section in self.sections.items():
            validate_section(name, section, self.origin)
        self.tokens = self._tokens()
        self.metrics = PusherMetrics(Registry("pusher"))
        self.cache = SensorCache(self.settings.cache_s, self.settings.cache_max_points)
        self.publisher = MqttPublisher(mqtt_options(self.settings), self.metrics)
        self.manager = PluginManager(
            self.cache,
            self.publisher,
            self.metrics,
            self._context,
            stamp_read_time=self.settings.timestamps == "read",
            restrictions=self.restrictions,
        )
        self.router = create_router(self)
        self.http = _Http(self.settings.host)
        self._stopped = False

    # ------------------------------------------------------------------ auth

    def _tokens(self) -> Tokens | None:
        if self.auth.insecure:
            log.warning(
                "pusher: auth.mode is 'none': anyone who can reach %s:%s may control its "
                "plugins (started with --insecure or auth.mode: none)",
                self.settings.host,
                self.settings.port,
            )
            return None
        try:
            # Next to the state directory: data/auth/tokens.json for the default data/pusher,
            # <data dir>/auth/tokens.json under --data-dir (DEFAULT_TOKEN_FILE's meaning).
            default = self.settings.state_dir.parent / "auth" / "tokens.json"
            return resolve_tokens(self.auth, default)
        except AuthError as exc:
            raise ConfigError(str(exc)) from None

    def credentials(self) -> Credentials:
        """Who may call which role now (``pusher.token`` and ``auth_reads`` reload live)."""
        if self.tokens is None:
            return Credentials({}, frozenset(Role))
        by_role: dict[Role, list[str | None]] = {r: [t] for r, t in self.tokens.by_role.items()}
        by_role[Role.ADMIN].append(self.settings.token)
        reads = self.auth.open_reads
        if reads is None:
            reads = is_loopback(self.settings.host)
        open_roles = [Role.READ] if reads and not self.settings.auth_reads else []
        return Credentials.from_roles(by_role, open_roles)

    def browser(self) -> BrowserPolicy:
        return BrowserPolicy.for_bind(self.auth, self.settings.host)

    def restrictions(self) -> Restrictions:
        """What a plugin section loaded over REST may use (see :class:`Restrictions`)."""
        s = self.settings
        roots = s.file_roots
        if roots is None:
            configured = [
                str(self.config_path(sec["root"]))
                for sec in self.sections.values()
                if isinstance(sec.get("root"), str)
            ]
            roots = ["/proc", "/sys", *configured]
        hosts = s.rest_hosts
        if hosts is None:
            from urllib.parse import urlsplit

            hosts = [
                urlsplit(str(e.get("url", ""))).hostname or ""
                for sec in self.sections.values()
                for e in (sec.get("endpoints") or [])
                if isinstance(e, dict)
            ]
        return Restrictions(tuple(roots), frozenset(h.lower() for h in hosts if h))

    def config_path(self, p: str) -> str:
        from pathlib import Path

        path = Path(p)
        if not path.is_absolute() and self.config.path is not None:
            path = self.config.path.parent / path
        return str(path)

    # ------------------------------------------------------------------ plugins

    def _context(self, instance: str, cfg: PluginConfig) -> PluginContext:
        node = self.settings.node_prefix
        prefix = names.validate_prefix(cfg.prefix) if cfg.prefix else names.join(node, instance)
        return PluginContext(
            instance=instance,
            prefix=prefix,
            host_prefix=node,
            state_dir=self.settings.state_dir,
            allocator_url=self.settings.allocator_url,
            config_dir=self.config.path.parent if self.config.path else None,
            count_error=lambda reason: self.metrics.plugin_errors.labels(instance, reason).inc(),
        )

    def readiness(self) -> tuple[bool, str]:
        if self.publisher.connected:
            return True, "ready"
        return False, (
            f"no MQTT broker reachable ({', '.join(self.settings.brokers)}); "
            f"buffering {self.publisher.status()['buffered_readings']} readings"
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int | None:
        return self.http.server.port if self.http.server else None

    async def start(self) -> None:
        await self.open()
        server = HttpServer(
            self.router,
            Guard(
                self.credentials,
                self.browser,
                lambda reason: self.metrics.http_refused.labels(reason).inc(),
            ),
            self.settings.host,
            self.settings.port,
            "pusher HTTP",
            "--pusher-port",
        )
        try:
            await server.start()
        except BaseException:
            await self.close()
            raise
        self.http.server = server

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.http.server is not None:
                await self.http.server.stop()
        finally:
            await self.close()

    async def open(self) -> None:
        await self.publisher.start()
        self.metrics.service.up.set(1)
        try:
            async with self.manager.lock:
                for name, section in self.sections.items():
                    await self.manager.load(name, section, self.origin)
        except BaseException:
            await self.close()
            raise
        log.info(
            "pusher: %d plugin instance(s), %d sensors under %s, publishing %s to %s",
            len(self.manager.instances),
            sum(len(i.sensor_names) for i in self.manager.instances.values()),
            self.settings.node_prefix,
            self.settings.format.upper(),
            ", ".join(self.settings.brokers),
        )
        if self.tokens is not None and self.tokens.generated and self.tokens.file is not None:
            log.warning("pusher: generated API tokens into %s (mode 0600)", self.tokens.file)

    async def close(self) -> None:
        self.metrics.service.up.set(0)
        try:
            await self.manager.close()
        finally:  # what sampling handed over is flushed or kept in unsent.bin, always
            await self.publisher.stop()

    # ------------------------------------------------------------------ reload

    def _reread(self) -> tuple[Config, Settings]:
        cfg = Config(self.config.path, self.config.overrides, self.config.flag_names)
        cfg.profile = self.config.profile
        return cfg, cfg.load(Settings)

    def section_for(self, name: str, body: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
        """The section to (re)load ``name`` from: the request body, else the file as it is now."""
        if body is not None:
            return body, REQUEST_BODY
        cfg, settings = self._reread()
        sections = plugin_sections(settings.plugins, cfg.profile)
        if name not in sections:
            where = str(cfg.path) if cfg.path else "the configuration"
            raise NotFoundError(f"{where} has no section pusher.plugins.{name}")
        return sections[name], self.origin

    async def reload_config(self) -> dict[str, list[str]]:
        """Re-read the file: plugin sections apply now; what needs a restart is reported."""
        cfg, settings = self._reread()
        sections = plugin_sections(settings.plugins, cfg.profile)
        restart = [k for k in _RESTART_KEYS if getattr(settings, k) != getattr(self.settings, k)]
        changes = await self.manager.apply(sections, self.origin)
        for key in _RELOADED_KEYS:
            setattr(self.settings, key, getattr(settings, key))
        self.publisher.o.flush_timeout_s = settings.flush_timeout_s
        self.sections = sections
        if restart:
            log.warning("configuration reloaded; restart to apply: %s", ", ".join(restart))
        return {**changes, "restart_needed": restart}


def create_service(config: Config) -> PusherService:
    return PusherService(config)


def listeners(config: Config) -> list[Listener]:
    """The ports ``kelvin run``/``up`` checks before anything starts."""
    s = config.load(Settings)
    return [Listener(s.host, s.port, "pusher HTTP", "--pusher-port")]
