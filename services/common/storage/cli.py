"""``kelvin config db stats|truncate|retention``: storage maintenance for operators.

Each command opens the configured backend directly (``--config``, the
``storage`` section, ``KELVIN_STORAGE_*`` variables, or ``--data-dir`` as
given to ``kelvin up``), so it works while Kelvin runs (SQLite allows the
extra writer; InfluxDB does not care) and while it is stopped. A SQLite file
that does not exist yet is reported (the command then sees an empty
database: Kelvin's data is elsewhere). DCDB's ``dcdbconfig db fuzzytrunc``
is ``truncate``.

    kelvin config db stats --data-dir /var/lib/kelvin
    kelvin config db truncate --before now-90d --prefix /dc/row3 --yes
    kelvin config db retention          # apply every sensor's ttl now
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from services.common import names
from services.common.cli_util import SubParsers, subgroup
from services.common.errors import ConfigError, SensorNameError, TimeSpecError
from services.common.settings import Config
from services.common.storage import StorageBackend, open_storage
from services.common.storage.settings import StorageSettings
from services.common.times import format_iso_short, parse_time

T = TypeVar("T")
DB_FILE = "kelvin.sqlite"
"""The SQLite file under a data directory (as ``kelvin up --data-dir`` lays it out)."""


def _settings(args: argparse.Namespace) -> StorageSettings:
    """The storage of ``--config`` (and the environment), at ``--data-dir`` when given."""
    cfg = Config(args.config)
    if args.data_dir is not None:
        sqlite = {**cfg.section("storage").get("sqlite", {}), "path": str(args.data_dir / DB_FILE)}
        cfg.set("storage", "sqlite", sqlite, "--data-dir")
    return cfg.load(StorageSettings)


def _warn_if_new(settings: StorageSettings) -> None:
    """Say so before SQLite creates an empty database where the user expected theirs."""
    if settings.backend != "sqlite" or settings.sqlite.path.exists():
        return
    where = settings.sqlite.path
    print(
        f"kelvin: warning: no database at {where.resolve() if not where.is_absolute() else where}"
        "; this opens a new, empty one. Kelvin keeps its data where `kelvin up --data-dir DIR` "
        "(default ./data) or the configuration's storage.sqlite.path put it: pass the same "
        "--data-dir or --config.",
        file=sys.stderr,
    )


def _run(args: argparse.Namespace, work: Callable[[StorageBackend], Awaitable[T]]) -> T:
    settings = _settings(args)
    _warn_if_new(settings)

    async def main() -> T:
        backend = await open_storage(settings)
        try:
            return await work(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def _time(value: str, flag: str) -> int:
    try:
        return parse_time(value)
    except TimeSpecError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _prefix(value: str) -> str:
    try:
        return names.validate_prefix(value)
    except SensorNameError as exc:
        raise ConfigError(f"--prefix: {exc}") from exc


def _removed(n: int) -> str:
    return (
        "an unknown number of readings (the backend does not count)" if n < 0 else f"{n} readings"
    )


def _flatten(data: dict[str, Any], base: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        key = f"{base}{k}"
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _cmd_stats(args: argparse.Namespace) -> int:
    stats = _run(args, lambda b: b.stats())
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        rows = _flatten(stats)
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
    return 0


def _cmd_truncate(args: argparse.Namespace) -> int:
    before = _time(args.before, "--before")
    prefix = _prefix(args.prefix)
    where = "every sensor" if prefix == "/" else f"sensors under {prefix}"
    if not args.yes:
        raise ConfigError(
            f"truncate deletes the readings of {where} older than {format_iso_short(before)}; "
            "add --yes to confirm"
        )
    removed = _run(args, lambda b: b.truncate_before(before, prefix))
    print(f"deleted {_removed(removed)} of {where} older than {format_iso_short(before)}")
    return 0


def _cmd_retention(args: argparse.Namespace) -> int:
    now = _time(args.now, "--now")
    removed = _run(args, lambda b: b.apply_retention(now))
    print(f"applied sensor ttls at {format_iso_short(now)}: deleted {_removed(removed)}")
    return 0


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    """Add ``kelvin config db ...``."""
    config = subgroup(sub, groups, "config", "configure Kelvin (DCDB's dcdbconfig)")
    db = config.add_parser(
        "db",
        help="storage maintenance: stats, truncate, retention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = db.add_subparsers(dest="db_command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE", type=Path, help="YAML configuration file")
        p.add_argument(
            "--data-dir",
            metavar="DIR",
            type=Path,
            help=f"the data directory given to `kelvin up` (its {DB_FILE}); default: the "
            "configuration's storage",
        )

    p = cmds.add_parser("stats", help="sizes and counts of the configured storage")
    common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of aligned lines")
    p.set_defaults(func=_cmd_stats)

    p = cmds.add_parser(
        "truncate",
        help="delete readings older than a time (DCDB: dcdbconfig db fuzzytrunc)",
        description="Delete every reading older than --before, under --prefix (default all).",
    )
    common(p)
    p.add_argument("--before", required=True, help="now-90d, ISO 8601 or an epoch")
    p.add_argument("--prefix", default="/", help="only sensors under this hierarchy prefix")
    p.add_argument("--yes", action="store_true", help="really delete")
    p.set_defaults(func=_cmd_truncate)

    p = cmds.add_parser(
        "retention",
        help="apply every sensor's ttl now",
        description="Delete the readings of each sensor that are older than its ttl "
        "(metadata ttl_ms; set with `kelvin config sensor`). Run it from cron, or let "
        "InfluxDB retention policies do it.",
    )
    common(p)
    p.add_argument("--now", default="now", help="reference time (default now)")
    p.set_defaults(func=_cmd_retention)
