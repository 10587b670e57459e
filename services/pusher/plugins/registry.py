"""Find plugins: Kelvin's own by name, a site's through the entry-point group ``kelvin.pusher.plugins``.

A site adds a plugin with ``pip install``: its package declares
``[project.entry-points."kelvin.pusher.plugins"] name = "pkg.module:PluginClass"``.
Classes are imported only when a configuration uses them, so an unused plugin's
library (pysnmp, bacpypes3, ...) costs neither start-up time nor memory. Kelvin's
own plugins are found without scanning the installed packages' metadata (which
would import ``importlib.metadata`` and read every distribution on a node).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from services.common.errors import ConfigError
from services.pusher.plugins.base import Plugin

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "kelvin.pusher.plugins"

BUILTIN: dict[str, str] = {
    "tester": "services.pusher.plugins.tester:TesterPlugin",
    "procfs": "services.pusher.plugins.procfs:ProcfsPlugin",
    "sysfs": "services.pusher.plugins.sysfs:SysfsPlugin",
    "perfevent": "services.pusher.plugins.perfevent:PerfeventPlugin",
    "ipmi": "services.pusher.plugins.ipmi:IpmiPlugin",
    "snmp": "services.pusher.plugins.snmp:SnmpPlugin",
    "rest": "services.pusher.plugins.rest:RestPlugin",
    "bacnet": "services.pusher.plugins.bacnet:BacnetPlugin",
    "nvml": "services.pusher.plugins.nvml:NvmlPlugin",
    "gpfs": "services.pusher.plugins.gpfs:GpfsPlugin",
    "opa": "services.pusher.plugins.opa:OpaPlugin",
    "datacenter": "services.pusher.plugins.datacenter:DatacenterPlugin",
}
"""Kelvin's own plugins (also declared as entry points in pyproject.toml)."""


def available() -> dict[str, EntryPoint]:
    """Installed plugins by name (not imported), from the entry points."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available_values() -> dict[str, str]:
    """Every plugin by name -> ``module:Class``: Kelvin's own and the installed ones."""
    return {**BUILTIN, **{name: ep.value for name, ep in available().items()}}


def load(name: str) -> type[Plugin]:
    """Import the plugin class registered as ``name``."""
    value = BUILTIN.get(name)
    if value is None:
        eps = available()
        ep = eps.get(name)
        if ep is None:
            known = ", ".join(sorted({*BUILTIN, *eps}))
            raise ConfigError(f"unknown pusher plugin {name!r}; installed plugins: {known}")
        value = ep.value
    module, _, attr = value.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ConfigError(
            f"pusher plugin {name!r} ({value}) cannot be imported: {exc}; "
            "is its package (and its optional dependency) installed?"
        ) from exc
    except AttributeError as exc:
        raise ConfigError(f"pusher plugin {name!r}: {value} does not exist") from exc
    if not (isinstance(cls, type) and issubclass(cls, Plugin)):
        raise ConfigError(
            f"entry point {name!r} = {value!r} is not a subclass of "
            "services.pusher.plugins.base.Plugin"
        )
    return cls
