"""Plugin sections of the configuration: profile defaults and precise validation.

``pusher.plugins`` maps an instance name to its section; the plugin type is the
key itself or the section's ``plugin`` key. Each section is validated by its
plugin's pydantic model, and an error names the file, the path to the key and
what was expected, in the same form as :meth:`services.common.settings.Config.load`.
DCDB's camelCase keys (``queueSize``, ``subSampling``) and snake_case both work.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ValidationError

from services.common.errors import ConfigError
from services.common.settings import describe_type, model_of
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
        raise ConfigError(explain(exc, cls.Config, where)) from exc


def explain(exc: ValidationError, model: type[BaseModel], where: str) -> str:
    """One line per error: ``<where>.<key path>: expected ..., got ...``."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join([where, *loc]) if loc else where
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = _walk(model, loc[:-1])[0]
            fields = sorted(getattr(parent, "model_fields", {}) or [])
            lines.append(f"{path}: unknown key; expected one of {', '.join(fields)}")
        elif kind == "missing":
            lines.append(f"{path}: required ({_expected(model, loc)}) but not given")
        else:
            got = err.get("input")
            lines.append(f"{path}: expected {_expected(model, loc)}, got {got!r} ({err['msg']})")
    return "; ".join(lines)


def _field(model: Any, key: str) -> Any:
    fields = getattr(model, "model_fields", None) or {}
    if key in fields:
        return fields[key]
    for name, info in fields.items():
        aliases = {info.alias}
        va = info.validation_alias
        if isinstance(va, str):
            aliases.add(va)
        elif va is not None and hasattr(va, "choices"):
            aliases.update(c for c in va.choices if isinstance(c, str))
        if key in aliases:
            return fields[name]
    return None


def _walk(model: Any, loc: list[str]) -> tuple[Any, Any]:
    """(innermost model, annotation of the last key) along ``loc``."""
    ann: Any = None
    for part in loc:
        if part.isdigit() and ann is not None:
            continue  # list index: stay on the item model
        info = _field(model, part)
        if info is None:
            break
        ann = info.annotation
        inner = model_of(ann)
        if inner is None:
            for arg in getattr(ann, "__args__", ()):
                inner = model_of(arg)
                if inner is not None:
                    break
        if inner is not None:
            model = inner
    return model, ann


def _expected(model: type[BaseModel], loc: list[str]) -> str:
    ann = _walk(model, loc)[1]
    return describe_type(ann) if ann is not None else "a valid value"
