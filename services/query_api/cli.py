"""``kelvin query``, ``kelvin config sensor ...`` and ``kelvin csvimport``: DCDB's tools over the query API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from services.common.cli_util import SubParsers
from services.query_api.client import DEFAULT_URL, TOKEN_ENV, URL_ENV, Client


def _connection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--url", help=f"query API base URL (default ${URL_ENV} or {DEFAULT_URL})")
    g.add_argument("--token", help=f"bearer token (default ${TOKEN_ENV})")


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.token)


def _cmd_query(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {
        "sensor": args.sensors,
        "start": args.start,
        "end": args.end,
        "format": "csv",
        "time_format": "ns" if args.raw else "iso",
    }
    if args.interval:
        params["interval"] = args.interval
        params["agg"] = args.agg
    out = sys.stdout.buffer
    with _client(args) as client:
        for chunk in client.stream("/api/v1/readings", params):
            out.write(chunk)
    out.flush()
    return 0


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    """Add the query API's tool commands to ``kelvin``."""
    q = sub.add_parser(
        "query",
        help="print readings of sensors as CSV (DCDB's dcdbquery)",
        description="Print readings as CSV `Sensor,Time,Value`. A sensor may carry a unit "
        "(/a/power@kW), a factor (/a/power@0.001) and operations: delta, delta_t, derivative, "
        "integral, rate, min, max, avg, sum, count, e.g. 'integral(/a/power)@kWh'. Wildcards: "
        "'/hall/row0/*/power'.",
    )
    q.add_argument("sensors", nargs="+", metavar="SENSOR", help="sensor specification(s)")
    q.add_argument(
        "--start", default="now-1h", help="range start: now-5m, ISO 8601, epoch (default now-1h)"
    )
    q.add_argument("--end", default="now", help="range end (default now)")
    q.add_argument("--raw", action="store_true", help="times as ns since the epoch (dcdbquery -r)")
    q.add_argument("--interval", help="resample into buckets, e.g. 10s, 5m")
    q.add_argument(
        "--agg",
        default="avg",
        choices=["avg", "min", "max", "sum", "count", "first", "last"],
        help="how --interval buckets are reduced (default avg)",
    )
    _connection(q)
    q.set_defaults(func=_cmd_query)
