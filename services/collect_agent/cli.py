"""``kelvin spool drain DIR``: write a spool directory that outlived its agent to storage;
``kelvin spool orphans``: create a drain Job for each spool claim a scale-down left behind.

For a spool volume no agent mounts any more (a StatefulSet ordinal removed by a
scale-down keeps its claim): the chart's drain Job runs this on it. It takes the
directory's lock (so never while an agent runs on it), writes every record to the
configured storage in order, retrying while storage fails, and exits 0 once the
spool is empty, or at once if an agent holds it (that agent replays it itself).

    kelvin spool drain /var/lib/kelvin/spool --config /etc/kelvin/kelvin.yaml
    kelvin spool orphans --statefulset kelvin-collect-agent --job-template drain-job.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from services.collect_agent.janitor import Janitor
from services.collect_agent.kube_api import KubeApi
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.orphans import drain_dir
from services.common.cli_util import SubParsers
from services.common.config import read_yaml
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
    orphans = cmds.add_parser(
        "orphans",
        help="create a drain Job for each spool claim of a removed StatefulSet ordinal",
        description="Find the spool claims of StatefulSet ordinals at or above its live "
        "replicas that no running pod mounts, and create the chart's drain Job for each "
        "(the chart's CronJob runs this in the cluster).",
    )
    orphans.add_argument("--statefulset", required=True, help="the collect agents' StatefulSet")
    orphans.add_argument(
        "--job-template",
        type=Path,
        required=True,
        help="the drain Job as the chart renders it (JSON or YAML); its spool claim is filled in",
    )
    orphans.add_argument(
        "--claim-template", default="spool", help="the StatefulSet's volumeClaimTemplate name"
    )
    orphans.add_argument("--namespace", help="default: the pod's namespace")
    orphans.add_argument(
        "--api-server", help="default: the pod's cluster (KUBERNETES_SERVICE_HOST/PORT)"
    )
    orphans.add_argument("--token-file", type=Path, help="a bearer token file (with --api-server)")
    orphans.add_argument("--ca-file", type=Path, help="the API server's CA (with --api-server)")
    orphans.add_argument("--dry-run", action="store_true", help="say what would be created")
    orphans.set_defaults(func=_cmd_orphans)


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
            print(f"{directory} is held by another process (its agent or a drain): it writes it")
            return 0
        written, left = result
        print(f"{directory}: {written} readings written, {left} left")
        return 0 if not left else 1

    return asyncio.run(main())


def _cmd_orphans(args: argparse.Namespace) -> int:
    template = read_yaml(args.job_template, "the drain Job template")
    if not isinstance(template, dict) or template.get("kind") != "Job":
        raise ConfigError(f"{args.job_template}: not a Job manifest")
    if args.api_server:
        if not args.namespace:
            raise ConfigError("--api-server needs --namespace")
        api = KubeApi(args.api_server, args.namespace, args.token_file, args.ca_file)
    else:
        api = KubeApi.in_cluster(args.namespace)
    try:
        actions = Janitor(api, args.statefulset, template, args.claim_template).run(args.dry_run)
    finally:
        api.close()
    for a in actions:
        print(
            json.dumps({"claim": a.claim, "ordinal": a.ordinal, "outcome": a.outcome, "job": a.job})
        )
    if not actions:
        print(f"{args.statefulset}: no spool claim of a removed ordinal waits")
    return 0
