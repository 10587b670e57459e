"""Helpers for service modules that add commands to the ``kelvin`` CLI."""

from __future__ import annotations

import argparse
from typing import Any, TypeAlias

# A string: argparse._SubParsersAction is not subscriptable at runtime on Python 3.11.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def subgroup(sub: SubParsers, groups: dict[str, Any], name: str, help: str) -> SubParsers:
    """A command group shared by several modules (e.g. ``kelvin config db|sensor``)."""
    if name not in groups:
        parser = sub.add_parser(name, help=help, description=help)
        groups[name] = parser.add_subparsers(
            dest=f"{name}_command", metavar="SUBCOMMAND", required=True
        )
    return groups[name]  # type: ignore[no-any-return]
