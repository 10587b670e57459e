"""``kelvin allocator simulate|calibrate|hall``: the allocator's tool commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from services.common.cli_util import subgroup
from services.common.errors import ConfigError
from services.common.thermal import Hall, reference_hall

POLICY_CHOICES = ("mpit", "mc1x1", "joint", "first-fit", "random", "all")


def register(sub: Any, groups: dict[str, Any]) -> None:
    group = subgroup(
        sub, groups, "allocator", "thermal- and communication-aware job placement tools"
    )
    _simulate_parser(group)
    _calibrate_parser(group)
    _hall_parser(group)


def _range(kind: type) -> Any:
    def parse(text: str) -> tuple[Any, Any]:
        lo, sep, hi = text.partition("-")
        try:
            a = kind(lo)
            b = kind(hi) if sep else a
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected LOW-HIGH, e.g. 2-8") from None
        return a, b

    return parse


def _load_hall(path: Path | None) -> Hall:
    if path is None:
        return reference_hall()
    from services.common.halls.hallfile import load_hall

    return load_hall(path)


def _simulate_parser(group: Any) -> None:
    p = group.add_parser(
        "simulate",
        help="rerun the published allocation experiments",
        description="Simulate placement policies on the static-row, static-hall or dynamic "
        "experiment; print a summary, --json, or write CSV, PNG plots and Markdown with --out.",
    )
    p.add_argument("--experiment", required=True, choices=("static-row", "static-hall", "dynamic"))
    p.add_argument("--policy", default="all", choices=POLICY_CHOICES, help="default: all")
    p.add_argument("--seed", type=int, default=1, help="job stream and random policy (default 1)")
    p.add_argument("--comm-share", type=float, default=0.2, metavar="C", help="default 0.2")
    p.add_argument(
        "--arrival-rate", type=float, default=15.0, metavar="JOBS_PER_H", help="default 15"
    )
    p.add_argument(
        "--min-mttf-years",
        type=float,
        default=0.0,
        metavar="Y",
        help="reliability constraint (0 = off)",
    )
    p.add_argument(
        "--sizes", type=_range(int), default=(2, 8), metavar="LO-HI", help="job sizes (2-8)"
    )
    p.add_argument(
        "--runtime-min",
        type=_range(float),
        default=(5.0, 30.0),
        metavar="LO-HI",
        help="base runtime in minutes, uniform (5-30)",
    )
    p.add_argument("--hours", type=float, default=4.0, help="simulated time (default 4)")
    p.add_argument("--warmup-hours", type=float, default=1.0, help="not measured (default 1)")
    p.add_argument(
        "--hall", type=Path, metavar="FILE", help="hall file (default: the reference hall)"
    )
    p.add_argument("--out", type=Path, metavar="DIR", help="write CSV, PNG plots, summary.md")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")
    p.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from services.allocator import experiments, report, simulator

    if not 0 <= args.comm_share <= 1:
        raise ConfigError(f"--comm-share {args.comm_share}: expected a share between 0 and 1")
    if args.min_mttf_years < 0:
        raise ConfigError("--min-mttf-years must be >= 0")
    params = experiments.DynamicParams(
        seed=args.seed,
        arrival_rate_per_h=args.arrival_rate,
        comm_share=args.comm_share,
        sizes=args.sizes,
        runtime_min=args.runtime_min,
        hours=args.hours,
        warmup_hours=args.warmup_hours,
    )
    exp = experiments.build(args.experiment, _load_hall(args.hall), params)
    policies = list(POLICY_CHOICES[:-1]) if args.policy == "all" else [args.policy]
    runs = simulator.run_policies(exp, policies, args.seed, args.min_mttf_years)
    doc = report.document(exp, runs, {"seed": args.seed, "min_mttf_years": args.min_mttf_years})
    if args.out:
        from services.allocator import plots

        written = report.write_csv(args.out, doc)
        written += plots.write_plots(args.out, exp, runs, doc)
        md = args.out / "summary.md"
        md.write_text(report.markdown(doc), encoding="utf-8")
        written.append(md)
        if not args.json:
            print("wrote " + ", ".join(str(w) for w in written), file=sys.stderr)
    if args.json:
        print(report.to_json(doc))
    elif not args.out:
        print(report.markdown(doc))
    return 0


def _calibrate_parser(group: Any) -> None:
    p = group.add_parser(
        "calibrate",
        help="fit the hall's heat-recirculation matrix from stored telemetry",
        description="Read node power and inlet-temperature sensors through the query API, align "
        "them, fit D row by row (non-negative least squares), report the fit error; --apply makes "
        "it the live model of a running allocator.",
    )
    p.add_argument("--start", required=True, help="window start (now-2h, ISO 8601, epoch)")
    p.add_argument("--end", required=True, help="window end")
    p.add_argument("--url", help="query API base URL (default: allocator.query_api_url)")
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML configuration (allocator section)"
    )
    p.add_argument(
        "--hall",
        type=Path,
        metavar="FILE",
        help="hall file (default: allocator.hall_file or reference)",
    )
    p.add_argument(
        "--sensor-map",
        type=Path,
        metavar="FILE",
        help="YAML/JSON {power: TEMPLATE|[names], inlet_temp: TEMPLATE|[names]}; templates use "
        "{row} {rack} {slot} {index}; default /hall/row{row}/rack{rack}/node{slot}/<quantity>",
    )
    p.add_argument(
        "--step",
        help="average every sensor over windows of this length (e.g. 2m, several times the "
        "hall's thermal time constant); default: the readings' own instants",
    )
    p.add_argument(
        "--time-constant",
        default="auto",
        metavar="DURATION|auto",
        help="the hall's thermal lag: inlets follow powers lagged by this time constant, "
        "e.g. 20s; 0 = none; auto (default) = the one that fits the data best",
    )
    p.add_argument(
        "--fit-supply", action="store_true", help="fit each node's supply temperature too"
    )
    p.add_argument(
        "--local",
        metavar="RACKS[,ROWS]",
        help="fit D sparse: a node warms only nodes within RACKS racks along its row and ROWS "
        "rows across (default 1); for large halls (--out writes a sparse hall, --apply sends "
        "the sparse D)",
    )
    p.add_argument(
        "--known-d", type=Path, metavar="FILE", help="a known D to report the error against"
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the fitted hall file (YAML + D)")
    p.add_argument("--apply", action="store_true", help="PUT the fit to a running allocator")
    p.add_argument(
        "--allocator-url", help="allocator base URL for --apply (default http://127.0.0.1:<port>)"
    )
    p.add_argument(
        "--token",
        help="bearer token for the query API and the allocator (default: auth.admin_token, "
        "or the token file's admin token)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from services.allocator.closed_loop import run_calibration

    doc = run_calibration(args)
    if args.json:
        print(json.dumps(doc))
    else:
        _print_calibration(doc)
    return 0


def _print_calibration(doc: dict[str, Any]) -> None:
    print(f"hall {doc['hall']}: {doc['samples']} aligned samples from {doc['sensors']} sensors")
    print(f"fit RMSE {doc['rmse_c']:.3f} °C, worst residual {doc['max_abs_c']:.3f} °C")
    supply = f"sensor {doc['supply_sensor']}" if doc.get("supply_sensor") else "the hall's"
    print(f"thermal time constant {doc['time_constant_s']:g} s; supply temperature: {supply}")
    if "expected" in doc:
        e = doc["expected"]
        weak = f"; weakly excited nodes: {e['weak_nodes']}" if e["weak_nodes"] else ""
        print(
            f"the data determine D to ~{e['d_rel_frobenius']:.1%} and the predicted inlets to "
            f"~{e['tin_rmse_c']:.3f} °C RMS (standard errors, an upper estimate){weak}"
        )
    if "known" in doc:
        k = doc["known"]
        print(
            f"against the known D: relative error {k['d_rel_frobenius']:.2%}, predicted inlet "
            f"RMSE {k['tin_rmse_c']:.3f} °C (worst {k['tin_max_abs_c']:.3f} °C), peak inlet "
            f"error ≤ {k['max_tin_abs_c']:.3f} °C"
        )
    if doc.get("written"):
        print(f"wrote {doc['written']}")
    if doc.get("applied"):
        print(f"applied to {doc['applied']}")


def _hall_parser(group: Any) -> None:
    p = group.add_parser(
        "hall",
        help="show a hall: layout, heat recirculation, CC_min table",
        description="Validate and describe a hall file (default: the reference hall).",
    )
    p.add_argument("--hall", type=Path, metavar="FILE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_hall)


def _cmd_hall(args: argparse.Namespace) -> int:
    import numpy as np

    from services.allocator.model import HallModel

    hall = _load_hall(args.hall)
    model = HallModel(hall)
    table = model.cc_min
    all_idle = hall.powers_w(np.zeros(hall.n_nodes))
    all_busy = hall.powers_w(np.ones(hall.n_nodes))
    idle, busy = hall.inlet_c(all_idle), hall.inlet_c(all_busy)
    doc = {
        "name": hall.name,
        "rows": hall.rows,
        "racks": hall.racks,
        "slots": hall.slots,
        "nodes": int(hall.present_mask.sum()),
        "max_tin_idle_c": hall.max_inlet_c(idle),
        "max_tin_all_busy_c": hall.max_inlet_c(busy),
        "cooling_all_busy_kw": hall.cooling_power_w(all_busy) / 1e3,
        "cc_min": table.values[1:].round(4).tolist(),
        "cc_min_exact": bool(table.exact.all()),
        "cc_min_method": table.method,
    }
    if args.json:
        print(json.dumps(doc))
        return 0
    for k, v in doc.items():
        if k != "cc_min":
            print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    print("CC_min(n), n = 1..: " + " ".join(f"{v:g}" for v in doc["cc_min"]))
    return 0
