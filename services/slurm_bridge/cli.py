"""``kelvin slurm files``: write the Slurm controller's Kelvin files (job_submit.lua, prolog/epilog)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.common.cli_util import subgroup
from services.common.errors import ConfigError


def register(sub: Any, groups: dict[str, Any]) -> None:
    group = subgroup(sub, groups, "slurm", "the Slurm bridge's files for the controller")
    p = group.add_parser(
        "files",
        help="write job_submit.lua, kelvin-notify.sh and its .conf for slurmctld",
        description="Write the files slurmctld runs for Kelvin into DIR (next to slurm.conf) "
        "and print the slurm.conf lines to add (docs/slurm.md).",
    )
    p.add_argument("--dir", type=Path, required=True, help="where slurm.conf lives")
    p.add_argument("--bridge-url", required=True, help="the bridge's URL, e.g. http://host:8084")
    p.add_argument(
        "--partitions", default="", help="comma-separated partitions Kelvin places (default: all)"
    )
    p.add_argument(
        "--default-partition", default="", help="the partition of jobs submitted without -p"
    )
    p.add_argument(
        "--operators",
        default="0",
        help="comma-separated uids that may hold/release/re-target Kelvin's jobs (default 0)",
    )
    p.add_argument("--token-file", type=Path, help="file holding the bridge's notify_token")
    p.add_argument(
        "--wake",
        metavar="IP:PORT",
        help="the bridge's UDP wake-up address (its wake_port): placed at once after submit",
    )
    p.set_defaults(func=_files)


def _files(args: argparse.Namespace) -> int:
    from services.slurm_bridge.install import SLURM_CONF_LINES, write_files

    try:
        operators = [int(u) for u in args.operators.split(",") if u.strip()]
    except ValueError:
        raise ConfigError(
            f"--operators {args.operators!r}: expected comma-separated uids"
        ) from None
    wake = None
    if args.wake:
        host, _, port = args.wake.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--wake {args.wake!r}: expected IP:PORT")
        wake = (host.strip("[]"), int(port))
    written = write_files(
        args.dir,
        args.bridge_url,
        [p for p in args.partitions.split(",") if p.strip()],
        args.default_partition,
        operators,
        args.token_file,
        wake,
    )
    for path in written:
        print(f"wrote {path}")
    print("\nAdd to slurm.conf (then restart slurmctld):")
    for line in SLURM_CONF_LINES:
        print("  " + line.format(dir=args.dir))
    return 0
