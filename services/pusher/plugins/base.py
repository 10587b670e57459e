"""The plugin model: a configurator builds optional entities, groups and sensors.

As in DCDB, a *plugin* (the configurator) reads its YAML section and builds
*groups* of *sensors* that are read together on one schedule; an optional
*entity* is the thing several groups share (a remote host, a BMC, a GPU) and
owns the connection to it. A group returns one float per sensor per read (NaN
= no reading this time); everything DCDB does to readings afterwards (delta,
factor, sub-sampling, queues, cache, publishing) is the pusher's job, not the
plugin's.

Writing a plugin: subclass :class:`PluginConfig` for the section (a
:class:`services.common.schema.Model`: declared like a pydantic model, with
``Field``, ``field_validator`` and ``model_validator`` from
:mod:`services.common.schema`), :class:`Group` for what is read, :class:`Plugin`
for the configurator, and register the plugin class under the entry-point
group ``kelvin.pusher.plugins``. ``kelvin plugin new NAME`` writes such a package.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from services.common import names
from services.common.errors import ConfigError
from services.common.schema import (
    AliasChoices,
    Field,
    Model,
    ModelConfig,
    ValidationInfo,
    field_validator,
)
from services.pusher.formats import SensorMetadata

log = logging.getLogger(__name__)


class Values(Protocol):
    """What a group's read returns: one float per sensor (``array('d')``, a list of floats,
    or a numpy array, as third-party plugins may return)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...


_MODEL = ModelConfig(extra="forbid", camel=True)


class MetadataConfig(Model):
    """The ``metadata`` block of a sensor (DCDB keys); what the collect agent learns."""

    model_config = _MODEL

    unit: str | None = None
    """Physical unit of the published value (after ``factor``), e.g. ``W``, ``°C``."""
    scale: float = Field(1.0, allow_inf_nan=False)
    """DCDB wire integer x scale = physical value (DCDB format only; KVB1 carries floats)."""
    integrable: bool = False
    monotonic: bool = False
    public_name: str | None = None
    ttl_ms: int | None = Field(None, validation_alias=AliasChoices("ttl_ms", "ttl", "ttlMs"))


class SensorOptions(Model):
    """Per-sensor DCDB options; a group's or plugin's values are the defaults."""

    model_config = _MODEL

    delta: bool = False
    """Send differences of a monotonic counter; the first reading is dropped."""
    delta_max: float | None = None
    """Counter wrap value: a drop from ``last`` to ``v`` counts ``v + delta_max - last``."""
    sub_sampling: int = 1
    """Send every S-th reading (all go to the cache); S <= 0 never sends."""
    skip_const_val: bool = False
    """Do not send a reading equal to the last one sent."""
    factor: float = 1.0
    """Multiply raw readings (after delta) by this."""
    publish: bool = True
    """Announce the sensor's metadata on ``/DCDB_MAP/METADATA/...`` at connect."""
    metadata: MetadataConfig | None = None


def interval_field(default_ms: int) -> Any:
    """The ``interval`` key (ms; DCDB's name, or ``interval_ms``) with a plugin's default."""
    return Field(
        default_ms, ge=1, validation_alias=AliasChoices("interval_ms", "interval", "intervalMs")
    )


class GroupOptions(SensorOptions):
    """DCDB group options: the schedule and queue of sensors read together."""

    interval_ms: int = interval_field(1000)
    """Sampling interval (ms)."""
    sync: bool = True
    """Sample at multiples of ``interval_ms`` since the epoch (identical on every node)."""
    queue_size: int = Field(1024, ge=1)
    """Readings per sensor held before the publisher takes them (oldest dropped past it)."""
    min_values: int = Field(1, ge=1)
    """Readings per sensor accumulated before they are handed to the publisher."""
    timeout_ms: int | None = Field(None, ge=1)
    """Abandon a read after this long (default: the interval)."""

    @field_validator("min_values")
    @classmethod
    def _fits_the_queue(cls, v: int, info: ValidationInfo) -> int:
        queue = info.data.get("queue_size")
        if queue is not None and v > queue:
            raise ValueError(
                f"minValues {v} exceeds queueSize {queue}: the queue would drop every reading "
                "before handing any over"
            )
        return v


class PluginConfig(GroupOptions):
    """Keys every plugin section accepts, besides its own."""

    plugin: str | None = None
    """Plugin type when the section name is an instance name (``rest_node: {plugin: rest}``)."""
    autostart: bool = True
    """Start sampling when loaded."""
    prefix: str | None = None
    """Sensor-name prefix of this plugin (default ``<pusher prefix>/<section name>``)."""

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        return None if v is None else names.validate_prefix(v)

    def group_defaults(self) -> dict[str, Any]:
        """The group and sensor options set at plugin level, for groups to inherit."""
        keys = set(GroupOptions.model_fields)
        return {k: v for k, v in self.model_dump().items() if k in keys}


@dataclass(slots=True)
class Sensor:
    """One resolved sensor of a group."""

    name: str
    """Full sensor name (= MQTT topic)."""
    options: SensorOptions = field(default_factory=SensorOptions)
    unit: str | None = None
    """Default unit when the configuration gives none (the plugin knows it)."""
    monotonic: bool = False
    integrable: bool = False
    scale: float = 1.0
    """Default DCDB scale when the configuration gives none."""

    def metadata(self, interval_ms: int) -> SensorMetadata:
        meta = self.options.metadata or MetadataConfig()
        return SensorMetadata(
            name=self.name,
            public_name=meta.public_name,
            unit=meta.unit or self.unit,
            scale=meta.scale if "scale" in meta.model_fields_set else self.scale,
            ttl_ms=meta.ttl_ms,
            interval_ms=interval_ms,
            integrable=meta.integrable or self.integrable,
            monotonic=(meta.monotonic or self.monotonic) and not self.options.delta,
            delta=self.options.delta,
        )


class Entity:
    """Something several groups share (a host, a BMC, a device) and its connection."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def open(self) -> None:
        """Connect; raise a KelvinError with a precise message when impossible."""

    async def close(self) -> None:
        """Release the connection. Idempotent."""


class Group:
    """Sensors read together, on one schedule.

    Override :meth:`read` (synchronous) or :meth:`read_async`. A synchronous read
    that may block (files on slow buses, subprocesses, network) sets ``blocking``
    so that it runs in the group's own worker thread under the read timeout.
    """

    blocking: bool = False

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        entity: Entity | None = None,
    ) -> None:
        self.name = name
        self.sensors = sensors
        self.options = options
        self.entity = entity

    def read(self, timestamp_ns: int) -> Values:
        """One value per sensor, in ``self.sensors`` order (NaN = no reading)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither read nor read_async")

    async def read_async(self, timestamp_ns: int) -> Values:
        """Asynchronous variant for sources with an asyncio client (HTTP, SNMP, BACnet)."""
        raise NotImplementedError

    @property
    def is_async(self) -> bool:
        return type(self).read_async is not Group.read_async

    def close(self) -> None:
        """Release what the group holds (file descriptors, ...). Idempotent."""


@dataclass(frozen=True)
class Restrictions:
    """What a plugin section that did not come from the configuration file may use.

    A section loaded over REST (``POST /api/v1/plugins/{name}/load`` with a body)
    must not turn the pusher into a file reader, a proxy or a command runner: its
    file paths must lie under ``roots`` (after resolving symbolic links), its URLs
    must name one of ``hosts``, and it may run no command but a plugin's default.
    """

    roots: tuple[str, ...] = ("/proc", "/sys")
    hosts: frozenset[str] = frozenset()


@dataclass
class PluginContext:
    """What the pusher gives a plugin."""

    instance: str
    """Section name of this plugin instance."""
    prefix: str
    """Sensor-name prefix for this instance, e.g. ``/node17/procfs``."""
    host_prefix: str
    """The pusher's own prefix, e.g. ``/node17``."""
    state_dir: Path
    allocator_url: str
    config_dir: Path | None = None
    """Directory of the configuration file, for relative paths in plugin sections."""
    count_error: Callable[[str], None] = field(default=lambda reason: None)
    """Count a problem the plugin absorbs itself (``kelvin_pusher_plugin_errors_total``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    restrictions: Restrictions | None = None
    """None: the section is the configuration file's (anything goes); else what it may use."""

    def path(self, p: str | Path) -> Path:
        """A path from the section, resolved against the configuration's directory, and
        allowed by the restrictions (ConfigError otherwise)."""
        path = Path(p)
        if not path.is_absolute() and self.config_dir is not None:
            path = self.config_dir / path
        self.check_path(path)
        return path

    def check_path(self, path: Path) -> None:
        """ConfigError unless ``path`` (symbolic links resolved) lies under an allowed root."""
        r = self.restrictions
        if r is None:
            return
        real = os.path.realpath(path)
        for root in r.roots:
            base = os.path.realpath(root)
            if real == base or real.startswith(base.rstrip("/") + "/"):
                return
        raise ConfigError(
            f"pusher.plugins.{self.instance}: {path} is outside the directories a plugin loaded "
            f"over REST may read ({', '.join(r.roots)}; setting pusher.file_roots)"
        )

    def command(self, argv: list[str], default: list[str] | None) -> list[str]:
        """The command to run: a section from REST may only run the plugin's default."""
        if self.restrictions is not None and argv != default:
            raise ConfigError(
                f"pusher.plugins.{self.instance}: a plugin loaded over REST runs no command but "
                f"its default ({' '.join(default) if default else 'none'}); put "
                f"{' '.join(argv)!r} in the configuration file instead"
            )
        return argv

    def check_url(self, url: str) -> None:
        """ConfigError unless a section from REST may fetch ``url`` (its host is allowed)."""
        r = self.restrictions
        if r is None:
            return
        host = (urlsplit(url).hostname or "").lower()
        if host not in r.hosts:
            allowed = ", ".join(sorted(r.hosts)) or "none"
            raise ConfigError(
                f"pusher.plugins.{self.instance}: host {host!r} is not one a plugin loaded over "
                f"REST may fetch from (allowed: {allowed}; setting pusher.rest_hosts)"
            )


class Plugin(ABC):
    """The configurator: turns a validated section into entities and groups."""

    Config: ClassVar[type[PluginConfig]] = PluginConfig
    description: ClassVar[str] = ""

    def __init__(self, config: PluginConfig, context: PluginContext) -> None:
        self.config = config
        self.context = context
        self.entities: list[Entity] = []
        self.notes: list[str] = []
        """What an operator should know (skipped hosts, unsupported events, no GPU)."""
        self._sensor_opts: dict[int, tuple[GroupOptions, SensorOptions]] = {}

    def group_options(self, **overrides: Any) -> GroupOptions:
        """Group options: plugin-level values, then ``overrides`` (group section keys)."""
        merged = {**self.config.group_defaults(), **overrides}
        return GroupOptions.model_validate(merged)

    def sensor_options(self, group: GroupOptions, **overrides: Any) -> SensorOptions:
        """Sensor options inherited from the group, then ``overrides``."""
        base = {k: getattr(group, k) for k in SensorOptions.model_fields}
        return SensorOptions.model_validate({**base, **overrides})

    def options_of(self, section: GroupOptions) -> GroupOptions:
        """Options of a group or entity sub-section: the plugin's, then the keys it sets."""
        keys = set(GroupOptions.model_fields)
        return self.group_options(**section.model_dump(exclude_unset=True, include=keys))

    def configured_sensor(
        self, rel: str, group: GroupOptions, section: SensorOptions, unit: str | None = None
    ) -> Sensor:
        """A sensor whose own sub-section may set DCDB options (delta, factor, metadata, ...)."""
        keys = set(SensorOptions.model_fields)
        return self.sensor(rel, group, unit, **section.model_dump(exclude_unset=True, include=keys))

    def sensor(
        self,
        rel: str,
        group: GroupOptions,
        unit: str | None = None,
        *,
        monotonic: bool = False,
        integrable: bool = False,
        scale: float = 1.0,
        **overrides: Any,
    ) -> Sensor:
        """A sensor ``<plugin prefix>/<rel>`` with options inherited from ``group``."""
        opts = self.sensor_options(group, **overrides) if overrides else self._inherited(group)
        return Sensor(
            names.join(self.context.prefix, rel),
            opts,
            unit=unit,
            monotonic=monotonic,
            integrable=integrable,
            scale=scale,
        )

    def _inherited(self, group: GroupOptions) -> SensorOptions:
        # Thousands of sensors share one group's options: build them once per group.
        cached = self._sensor_opts.get(id(group))
        if cached is None or cached[0] is not group:
            cached = (group, self.sensor_options(group))
            self._sensor_opts[id(group)] = cached
        return cached[1]

    @abstractmethod
    async def build(self) -> list[Group]:
        """Create entities (in ``self.entities``) and groups; may probe the source."""

    async def close(self) -> None:
        for entity in self.entities:
            try:
                await entity.close()
            except Exception:  # one entity's failure must not keep others open
                log.exception("%s: closing %s failed", self.context.instance, entity.name)
