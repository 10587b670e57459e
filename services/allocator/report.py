"""Simulation results as JSON, CSV and Markdown."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from services.allocator.experiments import Experiment
from services.allocator.simulator import SERIES_FIELDS, PolicyRun

RECORD_FIELDS = (
    "policy",
    "job",
    "size",
    "nodes",
    "utilization",
    "cc",
    "max_tin_c",
    "supply_c",
    "cop",
    "computing_kw",
    "cooling_kw",
)
"""The fields every record starts with (the issue's contract); extras follow."""
EXTRA_FIELDS = (
    "status",
    "lf",
    "node_power_w",
    "min_mttf_years",
    "arrival_s",
    "start_s",
    "wait_s",
    "runtime_s",
    "end_s",
)


def _record(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in (*RECORD_FIELDS, *EXTRA_FIELDS)}


def document(exp: Experiment, runs: list[PolicyRun], meta: dict[str, Any]) -> dict[str, Any]:
    """The whole result as one JSON-ready document."""
    doc: dict[str, Any] = {
        "experiment": exp.name,
        "hall": exp.model.hall.name,
        **meta,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in exp.params.items()},
        "records": [_record(r) for run in runs for r in sorted(run.records, key=_job_key)],
        "summaries": [run.summary for run in runs],
    }
    if exp.duration_s is not None:
        doc["series"] = {
            run.policy: {f: [row[i] for row in run.series] for i, f in enumerate(SERIES_FIELDS)}
            for run in runs
        }
    return doc


def _job_key(r: dict[str, Any]) -> int:
    return int(r["job"])


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=None, separators=(",", ":"), allow_nan=False)


def write_csv(out: Path, doc: dict[str, Any]) -> list[Path]:
    """records.csv, summary.csv and (dynamic) series.csv under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "records.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[*RECORD_FIELDS, *EXTRA_FIELDS])
        w.writeheader()
        for r in doc["records"]:
            w.writerow({**r, "nodes": " ".join(str(n) for n in r["nodes"])})
    written.append(path)
    path = out / "summary.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(doc["summaries"][0]))
        w.writeheader()
        w.writerows(doc["summaries"])
    written.append(path)
    if "series" in doc:
        path = out / "series.csv"
        with path.open("w", newline="", encoding="utf-8") as f:
            cw = csv.writer(f)
            cw.writerow(["policy", *SERIES_FIELDS])
            for policy, cols in doc["series"].items():
                for row in zip(*(cols[k] for k in SERIES_FIELDS), strict=True):
                    cw.writerow([policy, *row])
        written.append(path)
    return written


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, list):
        return " ".join(map(str, v)) or "-"
    return "-" if v is None else str(v)


def table(rows: list[dict[str, Any]], fields: list[str]) -> str:
    """A Markdown table of ``fields`` of ``rows``."""
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(_fmt(r.get(f)) for f in fields) + " |" for r in rows]
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    """Summary and per-job tables, as ``summary.md`` and the CLI's text output."""
    head = (
        f"# Allocator simulation: {doc['experiment']} on {doc['hall']}\n\n"
        f"seed {doc.get('seed')}, policies {', '.join(s['policy'] for s in doc['summaries'])}, "
        f"MTTF constraint {doc.get('min_mttf_years') or 'off'}"
        + (" years" if doc.get("min_mttf_years") else "")
        + f"; parameters {json.dumps(doc['params'])}\n\n## Per policy\n\n"
    )
    summary = table(doc["summaries"], list(doc["summaries"][0]))
    per_job = table(doc["records"], ["status", *RECORD_FIELDS])
    if doc["experiment"] == "dynamic":
        per_job = f"{len(doc['records'])} job records: see records.csv or --json."
    return f"{head}{summary}\n\n## Per job\n\n{per_job}\n"
