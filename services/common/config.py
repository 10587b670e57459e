"""The configuration of a process: one YAML file, environment ``KELVIN_...`` and flags.

Precedence: defaults < YAML file < environment < command-line flags. One YAML
file configures every service, one top-level section each (see
:mod:`services.common.settings`). A section is loaded into a settings class:
a pydantic-settings model (:class:`services.common.settings.SectionSettings`,
the services' default) or a light :class:`SectionModel`
(:mod:`services.common.schema`, no pydantic: the pusher, whose process on a
compute node must stay small). Both read the same keys the same way, and an
error names its origin (file, environment variable or flag), the key path and
the expected type, and becomes CLI exit code 2.

This module imports neither pydantic nor a web framework.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

import yaml

from services.common.errors import ConfigError
from services.common.schema import (
    Model,
    ModelConfig,
    ValidationError,
    describe_type,
    explain_error,
)

__all__ = ["Config", "LoggingSettings", "SectionModel", "describe_type"]

T = TypeVar("T")


class SectionModel(Model):
    """A light settings model: one YAML section, env prefix ``KELVIN_<SECTION>_``."""

    model_config: ClassVar[ModelConfig] = ModelConfig(extra="forbid")
    section: ClassVar[str] = ""
    env_prefix_override: ClassVar[str | None] = None

    @classmethod
    def env_prefix(cls) -> str:
        return cls.env_prefix_override or f"KELVIN_{cls.section.upper()}_"


class LoggingSettings(SectionModel):
    """How every service logs."""

    section: ClassVar[str] = "logging"
    env_prefix_override: ClassVar[str | None] = "KELVIN_LOG_"

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Root log level."""
    json_format: bool = False
    """One JSON object per line (for log shippers) instead of text."""
    access_log: bool = False
    """Log every HTTP request (costs ~30 % of HTTP throughput)."""


def read_yaml(path: Path, what: str) -> Any:
    """The YAML (or JSON) document in ``path``; a file that cannot be read or parsed is a
    :class:`ConfigError` naming it (and the line and column of a syntax error)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML: {exc}") from exc


class Config:
    """A parsed configuration file plus command-line overrides, per section.

    Services call :meth:`load` with their settings class; the CLI builds one
    ``Config`` from ``--config`` and flags.
    """

    def __init__(
        self,
        path: Path | str | None = None,
        overrides: dict[str, dict[str, Any]] | None = None,
        flag_names: dict[tuple[str, str], str] | None = None,
    ) -> None:
        self.path = Path(path) if path else None
        self.overrides: dict[str, dict[str, Any]] = {
            k: dict(v) for k, v in (overrides or {}).items()
        }
        self.flag_names = dict(flag_names or {})
        """(section, key) -> the flag that set it, for error messages."""
        self.profile = "run"
        """How the process was started: ``run`` (one service), ``up`` (all in one
        process) or ``demo`` (``up --demo``). Services pick defaults from it, e.g.
        the pusher runs the tester and procfs plugins under ``up``."""
        self.data = self._read(self.path) if self.path else {}

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        doc = read_yaml(path, "configuration file")
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        for key, value in doc.items():
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
        return {str(k): v or {} for k, v in doc.items()}

    def check_sections(self, known: set[str]) -> None:
        """Reject top-level sections no service knows (typos)."""
        unknown = sorted(set(self.data) - known)
        if unknown and self.path:
            raise ConfigError(
                f"{self.path}: unknown section(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(sorted(known))}"
            )

    def set(self, section: str, key: str, value: Any, flag: str | None = None) -> None:
        self.overrides.setdefault(section, {})[key] = value
        if flag:
            self.flag_names[(section, key)] = flag

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.data.get(name, {}))

    def load(self, cls: type[T]) -> T:
        """Build ``cls`` from defaults, the YAML section, env and overrides."""
        if isinstance(cls, type) and issubclass(cls, SectionModel):
            return self._load_light(cls)  # type: ignore[return-value]
        from services.common.settings import load_section  # pydantic: only when used

        return load_section(self, cls)  # type: ignore[type-var]

    # ------------------------------------------------------------------ light models

    def _load_light(self, cls: type[SectionModel]) -> SectionModel:
        yaml_part = self.section(cls.section)
        env_part, env_names = _from_env(cls)
        flags = self.overrides.get(cls.section, {})
        merged = _deep_merge(_deep_merge(yaml_part, env_part), flags)
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            lines = []
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                top = loc[0] if loc else ""
                if top in flags:
                    flag = self.flag_names.get((cls.section, top), f"--{top.replace('_', '-')}")
                    origin = f"command-line flag {flag}"
                elif top in env_names:
                    origin = f"environment variable {env_names[top]}"
                else:
                    origin = str(self.path) if self.path else "settings"
                lines.append(explain_error(err, f"{origin}: {cls.section}"))
            raise ConfigError("; ".join(lines)) from exc


def _complex(ann: Any) -> bool:
    """Whether an env value for ``ann`` is JSON (lists, mappings, models), as pydantic-settings reads it."""
    for arg in (ann, *get_args(ann)):
        origin = get_origin(arg)
        if origin in (list, tuple, set, dict) or arg in (list, dict):
            return True
        if isinstance(arg, type) and issubclass(arg, Model):
            return True
    return False


def _from_env(cls: type[SectionModel]) -> tuple[dict[str, Any], dict[str, str]]:
    """The section's keys set in the environment (case-insensitive, ``__`` nests), and
    which variable set each top-level key."""
    prefix = cls.env_prefix().upper()
    env = {k.upper(): (k, v) for k, v in os.environ.items() if k.upper().startswith(prefix)}
    out: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, info in cls.model_fields.items():
        key = prefix + name.upper()
        if key in env:
            real, value = env[key]
            if _complex(info.annotation):
                try:
                    out[name] = json.loads(value)
                except ValueError as exc:
                    raise ConfigError(
                        f"environment variable {real}: {cls.section}.{name}: expected JSON "
                        f"({describe_type(info.annotation)}), got {value!r} ({exc})"
                    ) from exc
            else:
                out[name] = value
            names[name] = real
        nested = key + "__"
        for full, (real, value) in sorted(env.items()):
            if not full.startswith(nested):
                continue
            parts = full[len(nested) :].lower().split("__")
            base = out.get(name)
            if not isinstance(base, dict):
                base = out[name] = {}
            node = base
            for part in parts[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    break
            else:
                node[parts[-1]] = value
            names.setdefault(name, real)
    return out, names


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
