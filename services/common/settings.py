"""Settings: defaults < YAML file < environment ``KELVIN_...`` < command-line flags.

One YAML file configures every service, one top-level section each::

    storage:        {backend: sqlite, sqlite: {path: ./data/kelvin.sqlite}}
    logging:        {level: INFO}
    collect_agent:  {mqtt_port: 1883, port: 8081}
    pusher:         {port: 8082, plugins: {...}}
    query_api:      {port: 8080}
    allocator:      {port: 8083}

Each section is one pydantic-settings model (a subclass of
:class:`SectionSettings`) whose environment prefix is ``KELVIN_<SECTION>_``
(nested keys with ``__``). Errors name the file, the key path and the expected
type, and become CLI exit code 2.
"""

from __future__ import annotations

import os
import types
import typing
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from services.common.errors import ConfigError

S = TypeVar("S", bound="SectionSettings")

_yaml_section: ContextVar[dict[str, Any] | None] = ContextVar("_yaml_section", default=None)


class _DictSource(PydanticBaseSettingsSource):
    """The YAML section, injected for the duration of one load."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _yaml_section.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_section.get() or {})


class SectionSettings(BaseSettings):
    """Base of every service's settings model: one YAML section, one env prefix."""

    section: ClassVar[str] = ""
    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _DictSource(settings_cls))

    @classmethod
    def env_prefix(cls) -> str:
        return str(cls.model_config.get("env_prefix") or f"KELVIN_{cls.section.upper()}_")


class LoggingSettings(SectionSettings):
    """How every service logs."""

    section: ClassVar[str] = "logging"
    model_config = SettingsConfigDict(env_prefix="KELVIN_LOG_")

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Root log level."""
    json_format: bool = False
    """One JSON object per line (for log shippers) instead of text."""
    access_log: bool = False
    """Log every HTTP request (costs ~30 % of HTTP throughput)."""


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
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read configuration file: {exc.strerror}") from exc
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}:{where} is not valid YAML: {exc}") from exc
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

    def load(self, cls: type[S]) -> S:
        """Build ``cls`` from defaults, the YAML section, env and overrides."""
        yaml_part = self.section(cls.section)
        token = _yaml_section.set(yaml_part)
        try:
            return cls(**self.overrides.get(cls.section, {}))
        except ValidationError as exc:
            raise ConfigError(self._explain(cls, exc, yaml_part)) from exc
        finally:
            _yaml_section.reset(token)

    def _explain(
        self, cls: type[SectionSettings], exc: ValidationError, yaml_part: dict[str, Any]
    ) -> str:
        lines = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            key = ".".join(loc)
            top = loc[0] if loc else ""
            env_name = cls.env_prefix() + "__".join(p.upper() for p in loc)
            if top in self.overrides.get(cls.section, {}):
                flag = self.flag_names.get((cls.section, top), f"--{top.replace('_', '-')}")
                origin = f"command-line flag {flag}"
            elif env_name in os.environ or (cls.env_prefix() + top.upper()) in os.environ:
                origin = f"environment variable {env_name}"
            elif self.path and _has_path(yaml_part, loc):
                origin = str(self.path)
            else:
                origin = str(self.path) if self.path else "settings"
            expected = _expected(cls, loc)
            got = err.get("input")
            if err["type"] == "extra_forbidden":
                lines.append(
                    f"{origin}: {cls.section}.{key}: unknown key; expected one of "
                    f"{', '.join(_field_names(cls, loc[:-1]))}"
                )
            elif err["type"] == "missing":
                lines.append(f"{origin}: {cls.section}.{key}: required ({expected}) but not given")
            else:
                lines.append(
                    f"{origin}: {cls.section}.{key}: expected {expected}, got {got!r} ({err['msg']})"
                )
        return "; ".join(lines)


def _has_path(data: Any, loc: list[str]) -> bool:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return False
    return True


def _field_names(cls: type[BaseModel], loc: list[str]) -> list[str]:
    model: Any = cls
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        model = model_of(fields[part].annotation)
    return sorted(getattr(model, "model_fields", {}) or [])


def model_of(ann: Any) -> Any:
    for arg in (ann, *get_args(ann)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _expected(cls: type[BaseModel], loc: list[str]) -> str:
    model: Any = cls
    ann: Any = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            break
        ann = fields[part].annotation
        model = model_of(ann)
    return describe_type(ann) if ann is not None else "a valid value"


def describe_type(ann: Any) -> str:
    origin = get_origin(ann)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(ann))
    if origin in (typing.Union, types.UnionType):
        parts = [describe_type(a) for a in get_args(ann) if a is not type(None)]
        return " or ".join(parts) + (" (or null)" if type(None) in get_args(ann) else "")
    if origin in (list, tuple, set, frozenset):
        return f"a list of {describe_type(get_args(ann)[0]) if get_args(ann) else 'values'}"
    if origin is dict:
        return "a mapping"
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "a boolean (true/false)",
        Path: "a path",
    }
    if ann in names:
        return names[ann]
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "a mapping"
    return getattr(ann, "__name__", str(ann))
