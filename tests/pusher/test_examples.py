"""Every example configuration in examples/pusher validates, plugin sections included."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from services.common.settings import Config
from services.pusher.config import plugin_sections, validate_section
from services.pusher.plugins import registry
from services.pusher.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "pusher").glob("*.yaml"))
OWN_PLUGINS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"][
        "kelvin.pusher.plugins"
    ]
)
"""Kelvin's own plugins, by name: a site's plugin installed next to Kelvin (``kelvin plugin
new``, ``pip install -e``) is no business of this repository's examples."""


def test_there_is_an_example_per_plugin() -> None:
    used: set[str] = set()
    for path in EXAMPLES:
        settings = Config(path).load(Settings)
        for name, section in (settings.plugins or {}).items():
            used.add((section or {}).get("plugin", name))
    assert set(registry.available()) >= OWN_PLUGINS  # installed, as pyproject.toml declares
    assert used >= OWN_PLUGINS


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    settings = Config(path).load(Settings)
    sections = plugin_sections(settings.plugins, "run")
    assert sections
    for name, section in sections.items():
        validate_section(name, section, str(path))
