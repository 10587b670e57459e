"""``bacnet``: properties of BACnet/IP devices (CRAC units, chillers, meters), via bacpypes3.

The plugin is one BACnet/IP device of its own (``address``, ``instance``) and
reads, per configured remote device (an entity and a group each), the
``present-value`` (or another property) of the listed objects with
ReadProperty requests on the event loop. Reals, integers, unsigned and
enumerations (binary values: 0/1) become floats; an object or property the
device does not have is no reading; a device that does not answer makes the
read time out (counted), never the plugin fail.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

from services.common.errors import ConfigError
from services.common.schema import Field, field_validator
from services.pusher.plugins.base import (
    Entity,
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
    SensorOptions,
    Values,
    interval_field,
)

log = logging.getLogger(__name__)


class ObjectConfig(SensorOptions):
    name: str
    """Sensor name relative to the device (``supply_temp``)."""
    object: str
    """Object identifier: ``analog-input,1``, ``analog-value,3``, ``binary-value,7``."""
    property: str = "present-value"
    unit: str | None = None

    @field_validator("object")
    @classmethod
    def _objid(cls, v: str) -> str:
        kind, sep, inst = v.partition(",")
        if not sep or not inst.strip().isdigit() or not kind.strip():
            raise ValueError("expected '<object type>,<instance>', e.g. analog-input,1")
        return f"{kind.strip()},{int(inst)}"


class DeviceConfig(GroupOptions):
    name: str
    address: str
    """The device's BACnet/IP address, ``10.0.0.40`` or ``10.0.0.40:47808``."""
    objects: list[ObjectConfig] = Field(min_length=1)


class BacnetConfig(PluginConfig):
    address: str = "host"
    """This pusher's BACnet/IP address (``host`` = the host's address, or ``ip/prefix:port``)."""
    instance: int = Field(599, ge=0, le=4194302)
    """This pusher's BACnet device instance."""
    device_name: str = "kelvin-pusher"
    interval_ms: int = interval_field(10_000)
    devices: list[DeviceConfig] = Field(min_length=1)


def to_float(value: Any) -> float:
    for conv in (float, int):
        try:
            return float(conv(value))
        except (TypeError, ValueError):
            continue
    return float("nan")


class Device(Entity):
    def __init__(self, cfg: DeviceConfig) -> None:
        super().__init__(cfg.name)
        self.cfg = cfg


class DeviceGroup(Group):
    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        device: Device,
        app: Any,
    ) -> None:
        super().__init__(name, sensors, options, device)
        self.device = device
        self.app = app

    async def read_async(self, timestamp_ns: int) -> Values:
        from bacpypes3.apdu import ErrorRejectAbortNack
        from bacpypes3.pdu import Address

        address = Address(self.device.cfg.address)
        out = array("d", [float("nan")]) * len(self.device.cfg.objects)
        for i, obj in enumerate(self.device.cfg.objects):
            try:
                value = await self.app.read_property(address, obj.object, obj.property)
            except ErrorRejectAbortNack:  # a BaseException in bacpypes3: unknown object etc.
                continue
            out[i] = to_float(value)
        return out


class BacnetPlugin(Plugin):
    """BACnet/IP devices."""

    Config = BacnetConfig
    description = "BACnet/IP ReadProperty of device objects (bacpypes3)"

    async def build(self) -> list[Group]:
        try:
            from bacpypes3.app import Application
            from bacpypes3.argparse import SimpleArgumentParser
        except ImportError as exc:
            raise ConfigError(
                "the bacnet plugin needs bacpypes3: pip install 'kelvin[plugins]'"
            ) from exc
        cfg = self.config
        assert isinstance(cfg, BacnetConfig)
        args = SimpleArgumentParser().parse_args(
            ["--address", cfg.address, "--instance", str(cfg.instance), "--name", cfg.device_name]
        )
        try:
            self.app = Application.from_args(args)
        except OSError as exc:
            raise ConfigError(
                f"bacnet plugin {self.context.instance!r}: cannot bind BACnet/IP address "
                f"{cfg.address!r}: {exc.strerror or exc}"
            ) from exc
        groups: list[Group] = []
        for d in cfg.devices:
            opts = self.options_of(d)
            device = Device(d)
            self.entities.append(device)
            sensors = [
                self.configured_sensor(f"{d.name}/{o.name}", opts, o, o.unit) for o in d.objects
            ]
            groups.append(DeviceGroup(d.name, sensors, opts, device, self.app))
        return groups

    async def close(self) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.close()
            self.app = None
        await super().close()
