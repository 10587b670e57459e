"""Plugin sections of the configuration: profile defaults and precise validation.

``pusher.plugins`` maps an instance name to its section; the plugin type is the
key itself or the section's ``plugin`` key. Each section is validated by its
plugin's model (:class:`services.common.schema.Model`), and an error names the
file, the path to the key and what was expected, in the same form as
:meth:`services.common.config.Config.load`. DCDB's camelCase keys
(``queueSize``, ``subSampling``) and snake_case both work.
"""

from __future__ import annotations

import copy
from typing import Any

from services.common.errors import ConfigError
from services.common.schema import ValidationError
from services.pusher.plugins import registry
from services.pusher.plugins.base import Plugin, PluginConfig

PROFILE_PLUGINS: dict[str, dict[str, dict[str, Any]]] = {
    "run": {"procfs": {}},
    "up": {"tester": {}, "procfs": {}},
    "demo": {"datacenter": {}, "procfs": {}},
}
"""Plugins that run when the configuration names none, per ``Config.profile``."""


def plugin_sections(
    configured: dict[str, dict[str, Any] | None] | None, profile: str
) -> dict[str, dict[str, Any]]:
    """The plugin sections to load: the configured ones, else the profile's defaults."""
    if configured:
        return {str(k): dict(v or {}) for k, v in configured.items()}
    return copy.deepcopy(PROFILE_PLUGINS.get(profile, PROFILE_PLUGINS["run"]))


def plugin_type(instance: str, section: dict[str, Any]) -> str:
    kind = section.get("plugin", instance)
    return kind if isinstance(kind, str) else instance


def validate_section(
    instance: str, section: dict[str, Any], origin: str
) -> tuple[type[Plugin], PluginConfig]:
    """Resolve and validate one plugin section; ConfigError names file, key path, expectation."""
    where = f"{origin}: pusher.plugins.{instance}"
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(section).__name__}")
    kind = section.get("plugin", instance)
    if not isinstance(kind, str):
        raise ConfigError(f"{where}.plugin: expected a string, got {kind!r}")
    try:
        cls = registry.load(kind)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    try:
        return cls, cls.Config.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(exc.explain(where)) from exc
