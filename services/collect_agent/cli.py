"""``kelvin spool drain DIR``: write a spool directory that outlived its agent to storage.

For a spool volume no agent mounts any more (a StatefulSet ordinal removed by a
scale-down keeps its claim): the chart's drain Job runs this on it. It takes the
directory's lock (so never while an agent runs on it), writes every record to the
configured storage in order, retrying while storage fails, and exits 0 once the
spool is empty, or at once if an agent holds it (that agent replays it itself).

    kelvin spool drain /var/lib/kelvin/spool --config /etc/kelvin/kelvin.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.orphans import drain_dir
from services.common.cli_util import SubParsers
from services.common.errors import ConfigError
from services.common.settings import Config
from services.common.storage import StorageSettings, create_storage


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    spool = sub.add_parser("spool", help="collect-agent spools: drain one that outlived its agent")
    cmds = spool.add_subparsers(dest="spool_command", metavar="SUBCOMMAND", required=True)
    drain = cmds.add_parser(
        "drain",
        help="write a spool directory no agent runs on to storage, then exit",
        description="Write a spool directory no agent runs on to the configured storage.",
    )
    drain.add_argument("directory", type=Path, help="the spool directory (an agent's spool_dir)")
    drain.add_argument("--config", type=Path, help="YAML configuration (its storage section)")
    drain.add_argument(
        "--timeout-s",
        type=float,
        default=0.0,
        help="give up after this long (0: retry a failing storage until done)",
    )
    drain.set_defaults(func=_cmd_drain)


def _cmd_drain(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory")
    settings = Config(args.config).load(StorageSettings)
    deadline = time.monotonic() + args.timeout_s if args.timeout_s > 0 else None

    def give_up() -> bool:
        return deadline is not None and time.monotonic() > deadline

    async def main() -> int:
        storage = create_storage(settings)
        delay = 0.1
        while True:
            try:
                await storage.open()
                break
            except Exception as exc:
                if give_up():
                    print(f"storage not reachable ({exc}); {directory} left as it is")
                    return 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        try:
            result = await drain_dir(directory, storage, AgentMetrics(), give_up=give_up)
        finally:
            await storage.close()
        if result is None:
            print(f"{directory} is held by a running collect agent: it replays it itself")
            return 0
        written, left = result
        print(f"{directory}: {written} readings written, {left} left")
        return 0 if not left else 1

    return asyncio.run(main())
