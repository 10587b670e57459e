"""Settings of the pusher (YAML section ``pusher``, env prefix ``KELVIN_PUSHER_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class Settings(SectionSettings):
    """pusher settings."""

    section: ClassVar[str] = "pusher"
    model_config = SettingsConfigDict(env_prefix="KELVIN_PUSHER_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8082, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    brokers: list[str] = ["127.0.0.1:1883"]
    """MQTT endpoints (host:port), tried in order (failover)."""
    allocator_url: str = "http://127.0.0.1:8083"
    """Allocator API for the simulated-hall plugin."""
    state_dir: Path = Path("data/pusher")
