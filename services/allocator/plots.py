"""PNG plots of a simulation (matplotlib, Agg backend: no display needed).

``utilization.png`` and ``cooling.png`` (traces per policy; per job for the
static experiments), ``cc_hist.png`` (CC histogram per policy; per-job CC for
static ones) and ``hall_<policy>.png`` (the final hall: inlet temperature as a
heatmap, one panel per row, each busy node labelled with its job).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from services.allocator.experiments import Experiment
from services.allocator.simulator import PolicyRun


def write_plots(
    out: Path, exp: Experiment, runs: list[PolicyRun], doc: dict[str, Any]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _trace(out, exp, doc, "utilization", "utilisation"),
        _trace(out, exp, doc, "cooling_kw", "cooling power (kW)"),
        _cc(out, exp, doc),
    ]
    written += [_hall(out, exp, run) for run in runs]
    return written


def _trace(out: Path, exp: Experiment, doc: dict[str, Any], key: str, label: str) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    if exp.duration_s is not None:
        for policy, cols in doc["series"].items():
            ax.step(np.array(cols["t_s"]) / 3600.0, cols[key], where="post", label=policy)
        ax.axvline(exp.measure_from_s / 3600.0, color="grey", linestyle=":", label="measure from")
        ax.set_xlabel("time (h)")
    else:
        for policy in _policies(doc):
            recs = [r for r in doc["records"] if r["policy"] == policy and r["status"] == "placed"]
            ax.plot([r["job"] for r in recs], [r[key] for r in recs], marker="o", label=policy)
        ax.set_xlabel("job (arrival order)")
    ax.set_ylabel(label)
    ax.set_title(f"{exp.name}: {label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / f"{key.removesuffix('_kw')}.png")


def _cc(out: Path, exp: Experiment, doc: dict[str, Any]) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    policies = _policies(doc)
    if exp.duration_s is not None:
        data = [
            [
                r["cc"]
                for r in doc["records"]
                if r["policy"] == p and r["cc"] is not None and r["size"] > 1
            ]
            for p in policies
        ]
        ax.hist(data, bins=15, label=policies)
        ax.set_xlabel("job CC")
        ax.set_ylabel("jobs")
    else:
        width = 0.8 / max(len(policies), 1)
        for k, p in enumerate(policies):
            recs = [r for r in doc["records"] if r["policy"] == p and r["status"] == "placed"]
            ax.bar(
                np.array([r["job"] for r in recs]) + k * width,
                [r["cc"] for r in recs],
                width,
                label=p,
            )
        ax.set_xlabel("job (arrival order)")
        ax.set_ylabel("CC")
    ax.set_title(f"{exp.name}: communication cost")
    ax.legend(fontsize=8)
    return _save(fig, out / "cc_hist.png")


def _hall(out: Path, exp: Experiment, run: PolicyRun) -> Path:
    hall = exp.model.hall
    tin = np.array(run.final_inlet_c)
    present = exp.model.present
    rows = sorted({int(r) for r in exp.model.pos[present, 0]})
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows) + 1, 4), squeeze=False)
    vmin, vmax = float(tin[present].min()), float(tin[present].max())
    image = None
    for ax, row in zip(axes[0], rows, strict=True):
        grid = np.full((hall.slots, hall.racks), np.nan)
        for i in np.flatnonzero(present & (exp.model.pos[:, 0] == row)):
            _, rack, slot = hall.position(int(i))
            grid[slot, rack] = tin[i]
            owner = run.final_owner[i]
            if owner is not None:
                ax.text(
                    rack,
                    slot,
                    f"J{owner}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                    bbox={"boxstyle": "round", "facecolor": _colour(owner), "alpha": 0.8},
                )
        image = ax.imshow(grid, origin="lower", cmap="inferno", vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_title(f"row {row}")
        ax.set_xlabel("rack")
        ax.set_ylabel("slot (0 = bottom)")
        ax.set_xticks(range(hall.racks))
        ax.set_yticks(range(hall.slots))
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="inlet °C")
    fig.suptitle(f"{exp.name}, {run.policy}: final hall")
    return _save(fig, out / f"hall_{run.policy}.png")


def _colour(owner: str) -> Any:
    return plt.get_cmap("tab20")(zlib.crc32(owner.encode()) % 20)


def _policies(doc: dict[str, Any]) -> list[str]:
    return [s["policy"] for s in doc["summaries"]]


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
