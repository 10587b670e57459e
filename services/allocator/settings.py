"""Settings of the allocator (YAML section ``allocator``, env prefix ``KELVIN_ALLOCATOR_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class Settings(SectionSettings):
    """allocator settings."""

    section: ClassVar[str] = "allocator"
    model_config = SettingsConfigDict(env_prefix="KELVIN_ALLOCATOR_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8083, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    state_dir: Path = Path("data/allocator")
    """Where placements persist across restarts."""
    brokers: list[str] = ["127.0.0.1:1883"]
    """MQTT endpoints to publish decisions as sensors."""
    query_api_url: str = "http://127.0.0.1:8080"
    """Query API, read by calibration."""
    policy: str = "joint"
    """Placement policy."""
    demo_seed: int = 1
    """Seed of the demo job stream."""
