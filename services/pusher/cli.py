"""``kelvin plugin ...``: list the installed pusher plugins, write a new one.

``kelvin plugin new NAME`` writes a package ``kelvin-plugin-NAME/`` that works
as written: a plugin with a config model, a group and a configurator, its
entry point under ``kelvin.pusher.plugins``, a README and a test. ``pip install
-e kelvin-plugin-NAME`` makes ``NAME`` usable in the ``pusher.plugins`` section.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from services.common.cli_util import SubParsers, subgroup
from services.common.errors import ConfigError
from services.pusher.plugins import registry
from services.pusher.skeleton import render

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    plugin = subgroup(
        sub, groups, "plugin", "pusher plugins: list the installed ones, write a new one"
    )
    new = plugin.add_parser(
        "new",
        help="write a working skeleton plugin package with its test",
        description="Write kelvin-plugin-NAME/: plugin module, entry point, README, test.",
    )
    new.add_argument("name", help="plugin name (lower case, e.g. 'pdu' or 'my_sensor')")
    new.add_argument("--dir", type=Path, default=Path("."), help="where to create it (default .)")
    new.add_argument("--force", action="store_true", help="overwrite an existing directory")
    new.set_defaults(func=_cmd_new)
    ls = plugin.add_parser("list", help="installed plugin types", description="Installed plugins.")
    ls.set_defaults(func=_cmd_list)


def _cmd_new(args: argparse.Namespace) -> int:
    name = args.name
    if not _NAME.match(name):
        raise ConfigError(
            f"plugin name {name!r}: expected lower case letters, digits and '_', "
            "starting with a letter (at most 40 characters)"
        )
    if name in registry.available():
        raise ConfigError(f"a plugin named {name!r} is already installed; choose another name")
    root = Path(args.dir) / f"kelvin-plugin-{name.replace('_', '-')}"
    if root.exists() and not args.force:
        raise ConfigError(f"{root} already exists; use --force to overwrite it")
    for rel, text in render(name).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"wrote {root}/")
    python = _interpreter()  # this Kelvin's, whether or not its venv is activated
    print(f"  next: {python} -m pip install -e '{root}[test]'  &&  {python} -m pytest {root}")
    print(f"  then: pusher.plugins.{name}: {{interval: 1000}} in your Kelvin configuration")
    return 0


def _interpreter() -> str:
    """The running Python, as short as it can be said from here (``.venv/bin/python``)."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def _cmd_list(args: argparse.Namespace) -> int:
    for name, ep in sorted(registry.available().items()):
        try:
            desc = registry.load(name).description
        except ConfigError as exc:
            desc = f"(cannot be imported: {exc})"
        print(f"{name:<12} {ep.value:<52} {desc}")
    return 0
