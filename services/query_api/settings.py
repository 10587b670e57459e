"""Settings of the query API (YAML section ``query_api``, env prefix ``KELVIN_QUERY_API_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class Settings(SectionSettings):
    """query API settings."""

    section: ClassVar[str] = "query_api"
    model_config = SettingsConfigDict(env_prefix="KELVIN_QUERY_API_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8080, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    allocator_url: str = "http://127.0.0.1:8083"
    """Allocator API (hall view of the console)."""
    collect_agent_url: str = "http://127.0.0.1:8081"
    """Collect agent API (ingest health in the console)."""
