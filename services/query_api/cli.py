"""``kelvin query``, ``kelvin config sensor ...`` and ``kelvin csvimport``: DCDB's tools over the query API."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import sys
from pathlib import Path
from typing import Any

from services.common.cli_util import SubParsers
from services.common.errors import ConfigError
from services.query_api.client import DEFAULT_URL, TOKEN_ENV, URL_ENV, ApiError, Client


def connection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--url", help=f"query API base URL (default ${URL_ENV} or {DEFAULT_URL})")
    g.add_argument("--token", help=f"bearer token (default ${TOKEN_ENV})")


def client_of(args: argparse.Namespace) -> Client:
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
    with client_of(args) as client:
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
    connection(q)
    q.set_defaults(func=_cmd_query)
    register_csvimport(sub)
    from services.query_api import cli_config

    cli_config.register(sub, groups)


def _cmd_csvimport(args: argparse.Namespace) -> int:
    """Send the file in chunks of ``--chunk-lines`` rows, each with the header."""
    total = 0
    first = 2  # the file line of the chunk's first row (line 1 is the header)
    stdin = str(args.file) == "-"
    with (
        client_of(args) as client,
        contextlib.nullcontext(sys.stdin)
        if stdin
        else open(args.file, encoding="utf-8-sig", newline="") as fh,
    ):
        header = fh.readline()
        if not header.strip():
            raise ConfigError(f"{args.file}: empty file; expected a CSV header line")
        while True:
            lines = list(itertools.islice(fh, args.chunk_lines))
            if not lines:
                break
            body = (header + "".join(lines)).encode()
            params = {"prefix": args.prefix} if args.prefix else {}
            try:
                out = client.request(
                    "POST",
                    "/api/v1/import",
                    content=body,
                    params=params,
                    headers={"Content-Type": "text/csv"},
                )
            except ApiError as exc:
                raise ApiError(
                    f"{args.file}: {_in_file(str(exc), first)} (the chunk from line {first} "
                    f"was not imported; {total} readings before it were)"
                ) from None
            total += int(out["imported"])
            first += len(lines)
    print(f"imported {total} readings from {args.file}", file=sys.stderr)
    return 0


def _in_file(message: str, first: int) -> str:
    """The server numbers the lines of one chunk (its header is line 1): renumber as in the file."""

    def renumber(m: re.Match[str]) -> str:
        n = int(m.group(1))
        return f"line {n if n == 1 else first + n - 2}"

    return re.sub(r"\bline (\d+)", renumber, message, count=1)


def register_csvimport(sub: SubParsers) -> None:
    c = sub.add_parser(
        "csvimport",
        help="import a CSV file into storage (DCDB's dcdbcsvimport)",
        description="Import readings from CSV: the layout `kelvin query` prints "
        "(Sensor,Time,Value) or one column per sensor (Time,<sensor>,...). "
        "A bad row rejects its chunk with the line number; earlier chunks stay imported.",
    )
    c.add_argument("file", type=Path, help="CSV file ('-': standard input)")
    c.add_argument("--prefix", help="put every sensor under this prefix, e.g. /site2")
    c.add_argument(
        "--chunk-lines", type=int, default=200_000, help="rows per request (default 200000)"
    )
    connection(c)
    c.set_defaults(func=_cmd_csvimport)
