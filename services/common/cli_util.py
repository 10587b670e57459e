"""Helpers for service modules that add commands to the ``kelvin`` CLI."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable
from pathlib import Path
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


def mark_leaves(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)parser be found from the namespace it fills (``args._parser``)."""
    parser.set_defaults(_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases: once each
                mark_leaves(sub)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported by the subcommand it was given to, with
    that subcommand's usage and the flags it has that are closest ("did you mean")."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        leaf: argparse.ArgumentParser = getattr(args, "_parser", parser)
        leaf.error(unrecognised(leaf, extra))
    return args


def unrecognised(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """``unrecognized arguments: --bogus (did you mean --before?)``."""
    import difflib

    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for arg in extra:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=2, cutoff=0.6)
            if close:
                hints.append(f"{arg}: did you mean {' or '.join(close)}?")
    text = f"unrecognized arguments: {' '.join(extra)}"
    return f"{text} ({'; '.join(hints)})" if hints else text


def quiet_stdout() -> None:
    """After EPIPE (the reader went away, e.g. ``| head``): send whatever is still buffered
    to /dev/null so the interpreter's last flush does not fail again, as Unix tools do."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a file
        pass
    finally:
        os.close(devnull)


class FreshPaths:
    """Paths a start may create, remembered before it so a failed start can take them back.

    Only what cannot hold anyone's data goes: a file the start generated (its
    token file) and the directories it created that are empty after that. A
    directory with anything in it (a spool, a database) stays.
    """

    def __init__(self, paths: Iterable[Path]) -> None:
        missing: dict[Path, None] = {}
        for path in paths:
            p = path.absolute()
            while not p.exists() and p != p.parent:
                missing[p] = None
                p = p.parent
        self.missing = sorted(missing, key=lambda p: len(p.parts), reverse=True)

    def remove(self, generated: Path | None = None) -> list[Path]:
        """Undo: the generated file, then every created directory left empty (deepest first)."""
        removed = []
        if generated is not None and generated.absolute() in self.missing:
            with contextlib.suppress(FileNotFoundError):
                generated.unlink()
                removed.append(generated)
        for p in self.missing:
            if p.is_dir() and not any(p.iterdir()):
                with contextlib.suppress(OSError):
                    p.rmdir()
                    removed.append(p)
        return removed
