"""The files ``kelvin plugin new NAME`` writes: a plugin package that works as written."""

from __future__ import annotations

PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "kelvin-plugin-{dash}"
version = "0.1.0"
description = "Kelvin pusher plugin: {name}"
requires-python = ">=3.11"
dependencies = ["kelvin"]

[project.optional-dependencies]
test = ["pytest>=7"]

# This line is what makes the pusher find the plugin after `pip install`.
[project.entry-points."kelvin.pusher.plugins"]
{name} = "kelvin_plugin_{name}.plugin:{cls}Plugin"

[tool.setuptools.packages.find]
include = ["kelvin_plugin_{name}*"]

# The plugin's own test settings, also when pytest runs it from elsewhere (e.g. Kelvin's tree).
[tool.pytest.ini_options]
testpaths = ["tests"]
"""

README = """\
# kelvin-plugin-{dash}

A pusher plugin for Kelvin. Install it next to Kelvin and name it in the
configuration:

```bash
pip install -e '.[test]'     # with pytest, for the plugin's own test
pytest                       # the plugin's own test
kelvin plugin list           # '{name}' is listed
```

```yaml
pusher:
  plugins:
    {name}:
      interval: 1000         # ms; every DCDB group/sensor option works here
      sensors: 2
```

Sensors are published as `<pusher prefix>/{name}/value0`, `.../value1`.
Edit `kelvin_plugin_{name}/plugin.py`: the config model (`{cls}Config`), what a
read returns (`{cls}Group.read`, one float per sensor, NaN = no reading; set
`blocking = True` if it may block, or implement `read_async`), and how the
configurator builds groups and sensors (`{cls}Plugin.build`).
"""

INIT = '''\
"""Kelvin pusher plugin {name!r}."""
'''

PLUGIN = '''\
"""``{name}``: a Kelvin pusher plugin (written by ``kelvin plugin new {name}``).

Replace the synthetic reading with your source. The pusher does the rest:
schedule (wall-clock aligned), timeouts, delta/factor/sub-sampling, cache and
publishing.
"""

from __future__ import annotations

from array import array

from services.common.schema import Field
from services.pusher.plugins.base import Group, GroupOptions, Plugin, PluginConfig, Sensor, Values


class {cls}Config(PluginConfig):
    """The plugin's YAML section (besides interval, delta, factor, ... which every plugin has).

    Declared like a pydantic model (annotations, ``Field`` bounds, ``field_validator``
    from ``services.common.schema``), validated without pydantic: a pusher on a compute
    node stays small.
    """

    sensors: int = Field(2, ge=1, le=1000)
    """How many sensors (replace with what your source needs: a host, a path, ...)."""
    offset: float = 0.0


class {cls}Group(Group):
    """Sensors read together."""

    # blocking = True  # uncomment if read() may block: it then runs in its own thread

    def __init__(
        self, name: str, sensors: list[Sensor], options: GroupOptions, offset: float
    ) -> None:
        super().__init__(name, sensors, options)
        self.offset = offset

    def read(self, timestamp_ns: int) -> Values:
        """One value per sensor, in ``self.sensors`` order (NaN = no reading): an
        ``array('d')``, a list of floats or a numpy array."""
        return array("d", [self.offset + i for i in range(len(self.sensors))])


class {cls}Plugin(Plugin):
    """The configurator: turns the section into groups of sensors."""

    Config = {cls}Config
    description = "{name} (skeleton: synthetic values)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, {cls}Config)
        opts = self.group_options()
        sensors = [self.sensor(f"value{{i}}", opts, unit=None) for i in range(cfg.sensors)]
        return [{cls}Group("main", sensors, opts, cfg.offset)]
'''

TEST = '''\
"""Tests of the {name!r} plugin, run with ``pytest`` from the package directory."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import pytest

from kelvin_plugin_{name}.plugin import {cls}Plugin
from services.common.schema import ValidationError
from services.pusher.plugins.base import PluginContext

ROOT = Path(__file__).resolve().parent.parent


def build(section: dict[str, object]) -> list:  # type: ignore[type-arg]
    cfg = {cls}Plugin.Config.model_validate(section)
    ctx = PluginContext(
        instance="{name}",
        prefix="/node0/{name}",
        host_prefix="/node0",
        state_dir=ROOT / "state",
        allocator_url="http://127.0.0.1:8083",
    )
    return asyncio.run({cls}Plugin(cfg, ctx).build())


def test_builds_sensors_and_reads_one_value_each() -> None:
    (group,) = build({{"sensors": 3, "offset": 10, "interval": 500}})
    assert [s.name for s in group.sensors] == [f"/node0/{name}/value{{i}}" for i in range(3)]
    assert group.options.interval_ms == 500
    assert list(group.read(0)) == [10.0, 11.0, 12.0]


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValidationError):
        build({{"sensors": 0}})


def test_the_entry_point_registers_the_plugin() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = doc["project"]["entry-points"]["kelvin.pusher.plugins"]
    assert eps["{name}"] == "kelvin_plugin_{name}.plugin:{cls}Plugin"
'''

CONFTEST = '''\
"""Make the package importable without installing it (pytest from this directory)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
'''


def render(name: str) -> dict[str, str]:
    """Relative path -> text of every file of the skeleton package for plugin ``name``."""
    cls = "".join(part.capitalize() for part in name.split("_"))
    fields = {"name": name, "dash": name.replace("_", "-"), "cls": cls}
    return {
        "pyproject.toml": PYPROJECT.format(**fields),
        "README.md": README.format(**fields),
        "conftest.py": CONFTEST,
        f"kelvin_plugin_{name}/__init__.py": INIT.format(**fields),
        f"kelvin_plugin_{name}/plugin.py": PLUGIN.format(**fields),
        "tests/test_plugin.py": TEST.format(**fields),
    }
