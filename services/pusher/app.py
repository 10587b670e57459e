"""The pusher service: its one door (built from settings, owns its clients).

``create_service(config)`` validates the whole ``pusher`` section, every
plugin section included, before anything starts (a bad file exits with code 2
and a message naming the key). ``start`` binds the HTTP port, connects to the
brokers in the background (readings buffer until one answers) and loads the
plugins; ``stop`` stops sampling, flushes what the broker will take within
``flush_timeout_s`` and disconnects.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from services.common import names
from services.common.cache import SensorCache
from services.common.errors import NotFoundError
from services.common.http import HttpService
from services.common.metrics import ServiceMetrics
from services.common.mqtt_credentials import client_tls, read_password
from services.common.settings import Config
from services.pusher.api import create_app
from services.pusher.config import plugin_sections, validate_section
from services.pusher.manager import PluginManager
from services.pusher.metrics import PusherMetrics
from services.pusher.plugins.base import PluginConfig, PluginContext
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
    "timestamps",
    "cache_s",
    "cache_max_points",
    "state_dir",
    "keep_unsent",
    "allocator_url",
)


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
        flush_timeout_s=settings.flush_timeout_s,
        username=settings.mqtt_username,
        password=read_password(
            settings.mqtt_password, settings.mqtt_password_file, "pusher.mqtt_password_file"
        ),
        tls=client_tls(
            settings.mqtt_tls,
            settings.mqtt_tls_ca,
            "pusher.mqtt_tls_ca",
            settings.mqtt_tls_server_name,
        ),
        announce=settings.announce_metadata,
        spool_path=settings.state_dir / "unsent.bin" if settings.keep_unsent else None,
    )


class PusherService(HttpService):
    """Sampling, publishing and the REST API of one node's pusher."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.settings = config.load(Settings)
        self.origin = str(config.path) if config.path else "settings"
        self.sections = plugin_sections(self.settings.plugins, config.profile)
        for name, section in self.sections.items():
            validate_section(name, section, self.origin)
        self.metrics = PusherMetrics(ServiceMetrics("pusher"))
        self.cache = SensorCache(self.settings.cache_s, self.settings.cache_max_points)
        self.publisher = MqttPublisher(mqtt_options(self.settings), self.metrics)
        self.manager = PluginManager(
            self.cache,
            self.publisher,
            self.metrics,
            self._context,
            stamp_read_time=self.settings.timestamps == "read",
        )
        super().__init__(
            "pusher", create_app(self), self.settings.host, self.settings.port, "--pusher-port"
        )

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

    async def close(self) -> None:
        self.metrics.service.up.set(0)
        await self.manager.close()
        await self.publisher.stop()

    def _reread(self) -> tuple[Config, Settings]:
        cfg = Config(self.config.path, self.config.overrides, self.config.flag_names)
        cfg.profile = self.config.profile
        return cfg, cfg.load(Settings)

    def section_for(self, name: str, body: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
        """The section to (re)load ``name`` from: the request body, else the file as it is now."""
        if body is not None:
            return body, "request body"
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
        for key in ("token", "auth_reads", "flush_timeout_s"):
            setattr(self.settings, key, getattr(settings, key))
        self.publisher.o.flush_timeout_s = settings.flush_timeout_s
        self.sections = sections
        if restart:
            log.warning("configuration reloaded; restart to apply: %s", ", ".join(restart))
        return {**changes, "restart_needed": restart}


def create_service(config: Config) -> PusherService:
    return PusherService(config)
