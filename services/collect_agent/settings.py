"""Settings of the collect agent (YAML section ``collect_agent``, env prefix ``KELVIN_COLLECT_AGENT_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class Settings(SectionSettings):
    """collect agent settings."""

    section: ClassVar[str] = "collect_agent"
    model_config = SettingsConfigDict(env_prefix="KELVIN_COLLECT_AGENT_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8081, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    mqtt_host: str | None = None
    """MQTT bind address (None = same as host)."""
    mqtt_port: int = Field(1883, ge=0, le=65535)
    """Built-in MQTT endpoint port."""
    spool_dir: Path = Path("data/spool")
    """Write-ahead spool directory."""
