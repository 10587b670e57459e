"""Run ``kelvin allocator ...`` through the allocator's own ``register`` (as ``services.cli`` does).

Builds the parser from this package alone, so these tests do not depend on
other packages' tool commands being importable; exit codes follow
``services.cli.main`` (2 for configuration errors, 1 for other Kelvin errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from services.allocator import cli as allocator_cli
from services.common.errors import ConfigError, KelvinError


def kelvin(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kelvin")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}
    allocator_cli.register(sub, groups)
    args = parser.parse_args(list(argv))
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"kelvin: configuration error: {exc}", file=sys.stderr)
        return 2
    except KelvinError as exc:
        print(f"kelvin: {exc}", file=sys.stderr)
        return 1
