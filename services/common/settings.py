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
type, and become CLI exit code 2. :class:`Config` and the light
:class:`~services.common.config.SectionModel` (no pydantic: the pusher's and the
``logging`` section's) live in :mod:`services.common.config` and are re-exported.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from typing import Any, ClassVar, TypeVar, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from services.common.config import Config, LoggingSettings
from services.common.errors import ConfigError
from services.common.schema import describe_type

__all__ = [
    "Config",
    "LoggingSettings",
    "SectionSettings",
    "describe_type",
    "load_section",
    "model_of",
]

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


def load_section(config: Config, cls: type[S]) -> S:
    """Build the pydantic settings ``cls`` from defaults, ``config``'s YAML section, env and
    overrides (what :meth:`Config.load` does for pydantic models)."""
    yaml_part = config.section(cls.section)
    token = _yaml_section.set(yaml_part)
    try:
        return cls(**config.overrides.get(cls.section, {}))
    except ValidationError as exc:
        raise ConfigError(_explain(config, cls, exc, yaml_part)) from exc
    finally:
        _yaml_section.reset(token)


def _explain(
    config: Config, cls: type[SectionSettings], exc: ValidationError, yaml_part: dict[str, Any]
) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        top = loc[0] if loc else ""
        env_name = cls.env_prefix() + "__".join(p.upper() for p in loc)
        if top in config.overrides.get(cls.section, {}):
            flag = config.flag_names.get((cls.section, top), f"--{top.replace('_', '-')}")
            origin = f"command-line flag {flag}"
        elif env_name in os.environ or (cls.env_prefix() + top.upper()) in os.environ:
            origin = f"environment variable {env_name}"
        elif config.path and _has_path(yaml_part, loc):
            origin = str(config.path)
        else:
            origin = str(config.path) if config.path else "settings"
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
