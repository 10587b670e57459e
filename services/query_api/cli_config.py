"""``kelvin config sensor ...``: DCDB's ``dcdbconfig sensor`` over the query API.

Metadata: ``list``, ``show``, ``unit``, ``scale``, ``ttl``, ``interval``,
``operations``, ``property``; virtual sensors: ``virtual define|show|list|delete``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.common import times
from services.common.cli_util import SubParsers, subgroup
from services.common.errors import ConfigError, TimeSpecError
from services.query_api.cli import client_of, connection
from services.query_api.client import ApiError


def _ms(spec: str, what: str) -> int:
    try:
        return round(times.parse_duration_ns(spec) / 1_000_000)
    except TimeSpecError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _put(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    with client_of(args) as c:
        meta = c.request("PUT", "/api/v1/metadata", json={"name": args.name, **fields})
    _print_meta(meta)
    return 0


def _print_meta(meta: dict[str, Any]) -> None:
    rows = [
        ("Sensor", meta.get("name")),
        ("Public name", meta.get("public_name") or ""),
        ("Unit", meta.get("unit") or ""),
        ("Scaling factor", meta.get("scale")),
        ("Interval", f"{meta['interval_ms']} ms" if meta.get("interval_ms") else ""),
        ("TTL", f"{meta['ttl_ms']} ms" if meta.get("ttl_ms") else "forever"),
        ("Operations", ",".join(meta.get("operations") or [])),
        (
            "Properties",
            ",".join(p for p in ("integrable", "monotonic", "delta") if meta.get(p)),
        ),
        ("Virtual", "yes" if meta.get("is_virtual") else "no"),
    ]
    latest = meta.get("latest")
    if latest:
        rows.append(("Newest reading", f"{latest['value']} at {latest['time']}"))
    virtual = meta.get("virtual")
    if virtual:
        rows.append(("Expression", virtual.get("expression")))
    for key, value in rows:
        print(f"{key + ':':<16}{value}")


def _cmd_list(args: argparse.Namespace) -> int:
    params = {"prefix": args.prefix}
    if args.match:
        params["match"] = args.match
    with client_of(args) as c:
        for name in c.request("GET", "/api/v1/sensor-names", params=params)["sensors"]:
            print(name)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        _print_meta(c.request("GET", "/api/v1/metadata", params={"sensor": args.name}))
    return 0


def _cmd_property(args: argparse.Namespace) -> int:
    return _put(args, {args.property: args.state == "on"})


def _cmd_vdefine(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"expression": args.expression, "description": args.description}
    if args.unit:
        body["unit"] = args.unit
    if args.interval:
        body["interval_ms"] = _ms(args.interval, "--interval")
    if args.max_gap:
        body["max_gap_ms"] = _ms(args.max_gap, "--max-gap")
    # Redefining drops the stored results: only with --force (the server checks, atomically).
    headers = {} if args.force or args.dry_run else {"If-None-Match": "*"}
    with client_of(args) as c:
        try:
            defn = c.request(
                "PUT",
                f"/api/v1/virtual/{args.name.lstrip('/')}",
                json=body,
                params={"dry_run": "true"} if args.dry_run else {},
                headers=headers,
            )
        except ApiError as exc:
            if exc.status != 412:
                raise
            detail = str(exc).split(": HTTP 412: ", 1)[-1]
            raise ApiError(f"{detail}; pass --force to redefine it", 412) from None
    _print_virtual(defn)
    return 0


def _print_virtual(d: dict[str, Any]) -> None:
    print(f"{'Virtual sensor:':<16}{d['name']}")
    print(f"{'Expression:':<16}{d['expression']}")
    print(f"{'Unit:':<16}{d.get('unit') or '(dimensionless)'}")
    print(f"{'Interval:':<16}{d['interval_ms']} ms ({d.get('interval_source', '')})")
    gap = d.get("max_gap_ms")
    print(f"{'Max gap:':<16}{f'{gap} ms' if gap else 'gap factor x input interval'}")
    print(f"{'Inputs:':<16}{', '.join(d.get('inputs', []))}")
    if d.get("dependents"):
        print(f"{'Used by:':<16}{', '.join(d['dependents'])}")
    for w in d.get("warnings", []):
        print(f"warning: {w}")


def _cmd_vshow(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        d = c.request("GET", f"/api/v1/virtual/{args.name.lstrip('/')}")
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        _print_virtual(d)
    return 0


def _cmd_vlist(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        for d in c.request("GET", "/api/v1/virtual")["virtual"]:
            unit = f" [{d['unit']}]" if d.get("unit") else ""
            print(f"{d['name']}{unit} = {d['expression']}")
    return 0


def _cmd_vdelete(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        c.request("DELETE", f"/api/v1/virtual/{args.name.lstrip('/')}")
    print(f"deleted {args.name}")
    return 0


def register(sub: SubParsers, groups: dict[str, Any]) -> None:
    config = subgroup(sub, groups, "config", "configure Kelvin (DCDB's dcdbconfig)")
    sensor = config.add_parser(
        "sensor", help="sensor metadata and virtual sensors", description=__doc__
    )
    cmds = sensor.add_subparsers(dest="sensor_command", metavar="ACTION", required=True)

    def add(name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help, description=help, **kw)
        connection(p)
        return p

    p = add("list", "list sensor names (stored and virtual)")
    p.add_argument("prefix", nargs="?", default="/", help="hierarchy prefix (default /)")
    p.add_argument("--match", help="wildcard pattern, e.g. '/hall/*/*/*/power'")
    p.set_defaults(func=_cmd_list)

    p = add("show", "show a sensor's metadata and newest reading")
    p.add_argument("name")
    p.set_defaults(func=_cmd_show)

    setters: list[tuple[str, str, str, type]] = [
        ("unit", "set the unit (e.g. W, kW, degC)", "unit", str),
        ("scale", "set the scaling factor", "factor", float),
        ("ttl", "set how long readings are kept (e.g. 30d; 0 keeps them)", "duration", str),
        ("interval", "set the sampling interval (e.g. 1s)", "duration", str),
    ]
    for name, help_, metavar, kind in setters:
        p = add(name, help_, aliases=["scaling"] if name == "scale" else [])
        p.add_argument("name")
        p.add_argument("value", metavar=metavar.upper(), type=kind)
        p.set_defaults(func=_setter(name))

    p = add("operations", "set the operations a sensor offers (comma list)")
    p.add_argument("name")
    p.add_argument("operations", help="e.g. avg,max")
    p.set_defaults(
        func=lambda a: _put(a, {"operations": [x for x in a.operations.split(",") if x]})
    )

    p = add("property", "switch a property on or off (DCDB's sensorproperty)")
    p.add_argument("name")
    p.add_argument("property", choices=["integrable", "monotonic", "delta"])
    p.add_argument("state", choices=["on", "off"])
    p.set_defaults(func=_cmd_property)

    virtual = cmds.add_parser("virtual", help="define, show, list, delete virtual sensors")
    vcmds = virtual.add_subparsers(dest="virtual_command", metavar="ACTION", required=True)
    p = vcmds.add_parser(
        "define",
        help="define or redefine a virtual sensor",
        description='e.g. kelvin config sensor virtual define /hall/pue \'("/hall/it_power" + '
        '"/hall/cooling_power") / "/hall/it_power"\'',
    )
    p.add_argument("name")
    p.add_argument("expression")
    p.add_argument("--unit", help="unit of the results (default inferred)")
    p.add_argument("--interval", help="grid interval, e.g. 10s (default the finest input's)")
    p.add_argument("--max-gap", help="interpolate across input gaps up to this long, e.g. 30s")
    p.add_argument("--description", default="")
    p.add_argument("--dry-run", action="store_true", help="only check the definition")
    p.add_argument(
        "--force",
        action="store_true",
        help="redefine an existing virtual sensor (its stored results are dropped)",
    )
    connection(p)
    p.set_defaults(func=_cmd_vdefine)
    for name, help_, fn in (
        ("show", "show a definition", _cmd_vshow),
        ("delete", "delete a virtual sensor and its stored results", _cmd_vdelete),
    ):
        p = vcmds.add_parser(name, help=help_, description=help_)
        p.add_argument("name")
        if name == "show":
            p.add_argument(
                "--json", action="store_true", help="print the stored definition as JSON"
            )
        connection(p)
        p.set_defaults(func=fn)
    p = vcmds.add_parser("list", help="list virtual sensors")
    connection(p)
    p.set_defaults(func=_cmd_vlist)


def _setter(field: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        if field == "unit":
            return _put(args, {"unit": args.value})
        if field == "scale":
            return _put(args, {"scale": args.value})
        key = "ttl_ms" if field == "ttl" else "interval_ms"
        return _put(args, {key: _ms(args.value, field)})

    return run
