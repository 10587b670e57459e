"""``kelvin jobs show|report``: per-job energy and cooling cost over the query API."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from services.common.cli_util import SubParsers, subgroup
from services.query_api.cli import client_of, connection

COLUMNS = (
    ("job", 8), ("user", 10), ("policy", 9), ("nodes", 5), ("start (UTC)", 19),
    ("duration s", 10), ("IT kWh", 9), ("cooling kWh", 11), ("peak inlet °C", 13),
)  # fmt: skip


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    group = subgroup(sub, groups, "jobs", "per-job energy, cooling cost and placement")
    show = group.add_parser(
        "show",
        help="one job's energy (IT, attributed cooling), duration, nodes and peak inlet",
        description="One job's accounting from the stored telemetry (GET /api/v1/jobs/ID).",
    )
    show.add_argument("job_id", metavar="JOB")
    show.add_argument("--domain", default="default", help="the job's DCDB domain (default)")
    connection(show)
    show.set_defaults(func=_show)
    report = group.add_parser(
        "report",
        help="jobs in a time range with their energy and the policy that placed each",
        description="Every job that ran in [--since, --until) with its energy, cooling cost, "
        "peak inlet and the policy that placed it (slurm: Slurm placed it itself); a running "
        "job's duration ends in '+'.",
    )
    report.add_argument("--since", default="now-1d", help="range start (default now-1d)")
    report.add_argument("--until", default="now", help="range end (default now)")
    report.add_argument("--node", help="only jobs on this node (as job records name it)")
    report.add_argument("--json", action="store_true", help="the API's JSON")
    connection(report)
    report.set_defaults(func=_report)


def _show(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        doc = client.request("GET", f"/api/v1/jobs/{args.job_id}", params={"domain": args.domain})
    json.dump(doc, sys.stdout, indent=2)
    print()
    return 0


def _report(args: argparse.Namespace) -> int:
    params = {"start": args.since, "end": args.until}
    if args.node:
        params["node"] = args.node
    with client_of(args) as client:
        doc = client.request("GET", "/api/v1/jobs", params=params)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print("  ".join(f"{name:>{w}}" for name, w in COLUMNS))
    for j in doc["jobs"]:
        print("  ".join(f"{cell:>{w}}" for cell, (_, w) in zip(_row(j), COLUMNS, strict=True)))
    if doc.get("truncated"):
        print("(more jobs in the range: narrow --since/--until)", file=sys.stderr)
    return 0


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or v != v else format(v, fmt)


def _row(j: dict[str, Any]) -> list[str]:
    start = datetime.fromtimestamp(j["start_ns"] / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return [
        str(j["job_id"]),
        str(j.get("user") or "-"),
        str(j.get("policy") or "-"),
        str(len(j["nodes"])),
        start,
        _num(j["duration_s"], ".1f") + ("+" if j.get("running") else ""),
        _num(j["it_energy_kwh"], ".4f"),
        _num(j["cooling_energy_kwh"], ".4f"),
        _num(j["peak_inlet_c"], ".2f"),
    ]
