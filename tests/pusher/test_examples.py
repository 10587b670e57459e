"""Every example configuration in examples/pusher validates, plugin sections included."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.settings import Config
from services.pusher.config import plugin_sections, validate_section
from services.pusher.plugins import registry
from services.pusher.settings import Settings

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "pusher").glob("*.yaml"))


def test_there_is_an_example_per_plugin() -> None:
    used: set[str] = set()
    for path in EXAMPLES:
        settings = Config(path).load(Settings)
        for name, section in (settings.plugins or {}).items():
            used.add((section or {}).get("plugin", name))
    assert set(registry.available()) <= used


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    settings = Config(path).load(Settings)
    sections = plugin_sections(settings.plugins, "run")
    assert sections
    for name, section in sections.items():
        validate_section(name, section, str(path))
