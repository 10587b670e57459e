"""Find plugins through the entry-point group ``kelvin.pusher.plugins``.

A site adds a plugin with ``pip install``: its package declares
``[project.entry-points."kelvin.pusher.plugins"] name = "pkg.module:PluginClass"``.
Classes are imported only when a configuration uses them, so an unused plugin's
library (pysnmp, bacpypes3, ...) costs neither start-up time nor memory.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from services.common.errors import ConfigError
from services.pusher.plugins.base import Plugin

GROUP = "kelvin.pusher.plugins"


def available() -> dict[str, EntryPoint]:
    """Installed plugins by name (not imported)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load(name: str) -> type[Plugin]:
    """Import the plugin class registered as ``name``."""
    eps = available()
    ep = eps.get(name)
    if ep is None:
        known = ", ".join(sorted(eps)) or "none (is Kelvin installed? pip install -e .)"
        raise ConfigError(f"unknown pusher plugin {name!r}; installed plugins: {known}")
    try:
        cls = ep.load()
    except ImportError as exc:
        raise ConfigError(
            f"pusher plugin {name!r} ({ep.value}) cannot be imported: {exc}; "
            "is its package (and its optional dependency) installed?"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Plugin)):
        raise ConfigError(
            f"entry point {name!r} = {ep.value!r} is not a subclass of "
            "services.pusher.plugins.base.Plugin"
        )
    return cls
