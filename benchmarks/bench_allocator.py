"""Allocator decision time per policy, and MPIT's exact search against HiGHS, greedy and the original method.

Halls: the reference hall (40 nodes) and synthetic halls of 400 (4 rows x 25
racks x 4) and 2,000 nodes (10 x 50 x 4) built by
:func:`services.common.halls.synthetic.tiled_hall`: reference pods (2 facing
rows x 5 racks x 4 nodes, the reference D) tiled along and across aisles,
10 % air leakage between neighbouring pods of an aisle, ±10 % seeded
log-normal jitter. Each case is a seeded random occupancy (0-70 % of the
nodes busy) and a job of random size (2-8, 4-40, 8-100 nodes) with C = 0.2;
hot cases are 0-40 % busy with jobs of 30-60 % of the free nodes (the job
moves the peak, so MPIT's exact solver runs). At 40 nodes a sweep adds every
job size on seeded occupancies. Decision time is ``Allocator.decide``
(policy, evaluation of the choice and three runner-ups, the reliability
check), each case timed once, wall clock; the sweep also reports the process's
CPU time, which a busy machine does not inflate. Caches a hall computes once
(CC_min table, shell matrix, sparse D) are built before timing, as the
service does at start.

References, side by side: the goals (20 ms at 40 nodes, where the original
Matlab took up to 1 s; 1 s at 2,000 nodes); for MPIT's exact answer, the
previous solver (the same shortcuts, then HiGHS's two-stage MILP on the whole
problem) with the choices compared; for its heuristics, (a) Kelvin's greedy
and (b) the original method, a continuous min-max LP followed by
discretisation (the n largest fractional x_j).

Site scale: halls of 1,000 and 10,000 nodes with a sparse D, every policy's
process CPU time (best of three per case, so that a shared machine inflates it
least) against the 100 ms goal at 10,000 nodes, and the memory the model and a
decision take.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from services.allocator import experiments, simulator
from services.allocator.calibrate import compare, fit_d, synthetic_samples
from services.allocator.engine import Allocator
from services.allocator.model import HallModel
from services.allocator.policies import REGISTRY, PolicyOptions, View
from services.allocator.policies.mpit import (
    PEAK_TOLERANCE_C,
    greedy,
    heat_problem,
    keeps_peak,
    peak_after,
    solve_exact,
)
from services.allocator.policies.mpit_milp import solve_milp
from services.allocator.policies.mpit_search import Reduced
from services.allocator.state import HallState
from services.common.halls.synthetic import tiled_hall
from services.common.thermal import Hall, reference_hall

POLICIES = ("mpit", "mc1x1", "joint", "first-fit", "random")
GOAL_S = {40: 0.020, 400: 0.200, 2000: 1.0}
"""The issue's goals at 40 and 2,000 nodes; 400 nodes interpolated (not a stated goal)."""
FORCED_LIMIT_S = 10.0
"""Time limit of the exact solvers when forced at every size (the service uses 1 s)."""


def _halls(quick: bool) -> list[tuple[Hall, tuple[int, int], int]]:
    return [
        (reference_hall(), (2, 8), 6 if quick else 30),
        (tiled_hall(4, 25, seed=1), (4, 40), 3 if quick else 12),
        (tiled_hall(10, 50, seed=1), (8, 100), 2 if quick else 6),
    ]


def _cases(
    model: HallModel, sizes: tuple[int, int], count: int, hot: bool = False
) -> list[tuple[HallState, int]]:
    """Seeded occupancies and job sizes; ``hot``: big jobs (30-60 % of the free nodes) that move the peak."""
    rng = np.random.default_rng(model.n + hot)
    cases = []
    for _ in range(count):
        state = HallState(model)
        busy = np.flatnonzero(rng.random(model.n) < rng.uniform(0.0, 0.4 if hot else 0.7))
        if busy.size:
            state.place("background", busy, model.hall.busy_power_w)
        if hot:
            size = max(1, int(state.free_count * rng.uniform(0.3, 0.6)))
        else:
            size = min(int(rng.integers(sizes[0], sizes[1] + 1)), state.free_count)
        cases.append((state, size))
    return cases


def _lp_rounding(view: View, rise: np.ndarray, n: int) -> np.ndarray:
    """The original method: LP relaxation of min max Tin, then the n largest x (ties: index)."""
    free = view.free_idx
    m = len(free)
    rows = np.flatnonzero(view.model.present)
    heat = sp.csr_matrix(view.model.d_csc[:, free][rows, :] @ sp.diags(rise[free]))
    a_ub = sp.hstack([heat, -sp.csr_matrix(np.ones((rows.size, 1)))]).tocsr()
    res = milp(  # no integrality: the continuous relaxation, solved by HiGHS's LP
        np.r_[np.zeros(m), 1.0],
        constraints=[
            LinearConstraint(a_ub, -np.inf, -view.inlet_c[rows]),
            LinearConstraint(np.r_[np.ones(m), 0.0][None, :], n, n),
        ],
        bounds=Bounds(np.r_[np.zeros(m), -np.inf], np.r_[np.ones(m), np.inf]),
    )
    x = res.x[:m]
    order = np.lexsort((free, -np.round(x, 9)))
    return np.sort(free[order[:n]])


def _timed(fn, *args):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def _ms(values: list[float]) -> str:
    """p50 / p95 / max in ms."""
    p50, p95 = np.percentile(values, [50, 95])
    return f"{p50 * 1e3:.1f} / {p95 * 1e3:.1f} / {max(values) * 1e3:.1f}"


def _timed_cpu(fn, *args):  # type: ignore[no-untyped-def]
    """Wall and process CPU seconds of one call (every thread: HiGHS may use its own)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def _sweep(model: HallModel, occupancies: int) -> list[tuple[HallState, int]]:
    """Every job size on seeded occupancies (0-70 % busy), the empty hall first."""
    rng = np.random.default_rng(4040)
    cases = []
    for k in range(occupancies):
        state = HallState(model)
        busy = np.flatnonzero(rng.random(model.n) < (0.0 if k == 0 else rng.uniform(0.0, 0.7)))
        if busy.size:
            state.place("background", busy, model.hall.busy_power_w)
        cases.extend((state, n) for n in range(1, state.free_count + 1))
    return cases


def _milp_only(view: View, rise: np.ndarray, n: int, limit_s: float) -> np.ndarray:
    """The previous exact solver: the same shortcuts, then HiGHS's two stages on the whole problem."""
    quick = keeps_peak(view, rise, n)
    if quick is not None:
        return quick
    upper = greedy(view, rise, n)
    problem = heat_problem(view, rise, n, whole=True)
    whole = Reduced.nothing(problem, float(problem.base.max()))
    deadline = time.monotonic() + limit_s
    found = solve_milp(problem, whole, peak_after(view, rise, upper), PEAK_TOLERANCE_C, deadline)
    return upper if found is None else view.free_idx[found[0]]


def _calibration(quick: bool) -> list[str]:
    """D recovered from simulated telemetry: joint placements, 30 s samples, sensor noise."""
    hall = reference_hall()
    hours = 12.0 if quick else 36.0
    params = experiments.DynamicParams(seed=1, hours=hours, warmup_hours=0.0, arrival_rate_per_h=25)
    run = simulator.run(experiments.dynamic(hall, params), "joint", 1, record_powers=True)
    _, powers = run.power_trace(30.0)
    rows = []
    for noise_c in (0.2, 0.5):
        for t in (500, 1000, 2000, 4000):
            if t > len(powers):
                continue
            samples = synthetic_samples(
                hall, powers[:t], seed=t, power_noise_w=20.0, temp_noise_c=noise_c
            )
            fit, elapsed = _timed(fit_d, samples, hall.supply_c)
            err = compare(fit.d_matrix, hall.d_matrix, hall)
            rows.append(
                f"| {noise_c} | {t} ({t * 30 / 3600:.1f} h) | {fit.rmse_c:.3f} | "
                f"{err['d_rel_frobenius']:.1%} | {err['tin_rmse_c']:.3f} | {err['tin_max_abs_c']:.2f} | "
                f"{err['max_tin_abs_c']:.2f} | {elapsed * 1e3:.0f} |"
            )
    return [
        "Closed loop on the simulated hall: node powers from `joint` placements (dynamic, 25 "
        "jobs/h) sampled every 30 s with 20 W meter noise; inlets = Tsup + D·P + Gaussian noise, "
        "rounded to 0.1 °C; D fitted by row-wise NNLS and compared with the reference D (inlet "
        "errors over 1,000 random occupancies plus all-idle and all-busy):",
        "",
        "| inlet noise °C | samples | fit RMSE °C | D error (rel. Frobenius) | inlet RMSE °C | "
        "worst inlet °C | worst peak-inlet °C | fit ms |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def _decision_rows(model: HallModel, cases: list, hot: list) -> list[str]:  # type: ignore[type-arg]
    goal = GOAL_S[model.n]
    rows = []
    for name in POLICIES:
        allocator = Allocator(name, PolicyOptions(seed=1))
        times = [_timed(allocator.decide, s, n, 0.2)[1] for s, n in cases]
        hot_times = [_timed(allocator.decide, s, n, 0.2)[1] for s, n in hot]
        worst = max(times + hot_times)
        rows.append(
            f"| {model.n} | {name} | {_ms(times)} | {_ms(hot_times)} | {goal * 1e3:.0f} | "
            f"{worst / goal:.2f} | {'yes' if worst <= goal else 'NO'} |"
        )
    return rows


def _sweep_rows(model: HallModel, occupancies: int) -> list[str]:
    cases = _sweep(model, occupancies)
    goal = GOAL_S[model.n]
    rows = []
    for name in POLICIES:
        allocator = Allocator(name, PolicyOptions(seed=1))
        wall, cpu = zip(*(_timed_cpu(allocator.decide, s, n, 0.2) for s, n in cases), strict=True)
        rows.append(
            f"| {name} | {len(cases)} | {_ms(list(wall))} | {_ms(list(cpu))} | "
            f"{'yes' if max(wall) <= goal else 'NO'} |"
        )
    return rows


def _mpit_rows(model: HallModel, hot: list) -> tuple[str, str]:  # type: ignore[type-arg]
    """(exact against the previous MILP solver, heuristics against exact) for the hot cases."""
    exact_t, milp_t, greedy_t, lp_t, greedy_gap, lp_gap = [], [], [], [], [], []
    proven = same = 0
    for state, n in hot:
        view = View(model, state.free.copy(), state.powers_w.copy())
        rise = view.rise_per_node(model.power.busy_w(0.2))
        (exact_nodes, ok), te = _timed(solve_exact, view, rise, n, FORCED_LIMIT_S)
        proven += int(ok)
        reference, tm = _timed(_milp_only, view, rise, n, FORCED_LIMIT_S)
        same += int(np.array_equal(reference, exact_nodes))
        g, tg = _timed(greedy, view, rise, n)
        lp, tl = _timed(_lp_rounding, view, rise, n)
        best = peak_after(view, rise, exact_nodes)
        exact_t.append(te)
        milp_t.append(tm)
        greedy_t.append(tg)
        lp_t.append(tl)
        # peaks within the tie tolerance are equal: smaller "gains" are zero
        greedy_gap.append(max(0.0, peak_after(view, rise, g) - best))
        lp_gap.append(max(0.0, peak_after(view, rise, lp) - best))
    exact_row = (
        f"| {model.n} | {len(hot)} ({proven} proven) | {_ms(exact_t)} | {_ms(milp_t)} | "
        f"{statistics.median(milp_t) / statistics.median(exact_t):.1f} | "
        f"{max(milp_t) / max(exact_t):.1f} | {same} / {len(hot)} |"
    )
    heuristic_row = (
        f"| {model.n} | {_ms(greedy_t)} | "
        f"{statistics.median(greedy_t) / statistics.median(exact_t):.3f} | "
        f"{np.mean(greedy_gap):.4f} / {max(greedy_gap):.4f} | {_ms(lp_t)} | "
        f"{np.mean(lp_gap):.4f} / {max(lp_gap):.4f} |"
    )
    return exact_row, heuristic_row


SCALE_GOAL_S = 0.100
"""Issue 14: every policy <= 100 ms per decision at 10,000 nodes."""


def _scale_cases(model: HallModel, count: int) -> list[tuple[HallState, int, bool]]:
    """Typical (0-70 % busy, 8-500 nodes) and hot (0-40 % busy, 30-60 % of the free) cases."""
    rng = np.random.default_rng(10_000)
    out = []
    for hot in (False, True):
        for _ in range(count):
            state = HallState(model)
            busy = np.flatnonzero(rng.random(model.n) < rng.uniform(0.0, 0.4 if hot else 0.7))
            state.place("background", busy, model.hall.busy_power_w)
            free = state.free_count
            size = int(free * rng.uniform(0.3, 0.6)) if hot else int(rng.integers(8, 501))
            out.append((state, max(1, min(size, free)), hot))
    return out


def _scale_hall(rows: int, racks: int, count: int) -> tuple[str, list[str]]:
    """One sparse hall: its setup and memory in a sentence, a table row per policy."""
    import resource
    import tracemalloc

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (hall, t_build) = _timed(tiled_hall, rows, racks, 1, 0.1, 0.1, True)
    model = HallModel(hall)
    t0 = time.perf_counter()
    _ = model.d_csc, model.d_csr
    t_sparse = time.perf_counter() - t0
    _, t_ccmin = _timed(lambda: model.cc_min)
    d = hall.d_matrix
    sparse_mb = (d.data.nbytes + d.indices.nbytes + d.indptr.nbytes) / 1e6
    held_mb = sum(
        (m.data.nbytes + m.indices.nbytes + m.indptr.nbytes) / 1e6
        for m in (model.d_csc, model.d_csr)
    )
    lent_mb = 2 * 8 * model.d_csc.nnz / 1e6  # MPIT's per-entry arrays, kept by the model
    dense_mb = model.n * model.n * 8 / 1e6
    cases = _scale_cases(model, count)
    goal = f"{SCALE_GOAL_S * 1e3:.0f}" if model.n >= 10_000 else "-"
    table = []
    for name in POLICIES:
        allocator = Allocator(name, PolicyOptions(seed=1))
        typical, hot, peaks = [], [], []
        for state, n, is_hot in cases:
            # best of three: the least disturbed of the runs on a shared machine
            runs = [_timed_cpu(allocator.decide, state, n, 0.2) for _ in range(3)]
            (hot if is_hot else typical).append((min(w for w, _ in runs), min(c for _, c in runs)))
            # memory in a second pass: tracemalloc slows allocation-heavy code several-fold
            tracemalloc.start()
            allocator.decide(state, n, 0.2)
            peaks.append(tracemalloc.get_traced_memory()[1] / 1e6)
            tracemalloc.stop()
        worst_cpu = max(c for _, c in typical + hot)
        table.append(
            f"| {model.n} | {name} | {_ms([w for w, _ in typical])} | {_ms([c for _, c in typical])} "
            f"| {_ms([w for w, _ in hot])} | {_ms([c for _, c in hot])} | {max(peaks):.0f} | "
            f"{goal} | {'yes' if worst_cpu <= SCALE_GOAL_S else 'NO'} |"
        )
    rss_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    return (
        f"{rows} x {racks} x 4 ({model.n:,} nodes): D {d.nnz:,} non-zeros "
        f"({d.nnz / model.n**2:.2%}); setup: build {t_build:.2f} s, sparse copies "
        f"{t_sparse:.2f} s, CC_min table {t_ccmin:.2f} s; memory: D {sparse_mb:.0f} MB, the "
        f"model's CSR + CSC copies {held_mb:.0f} MB and MPIT's per-entry arrays {lent_mb:.0f} "
        f"MB, process peak RSS growth {rss_mb:.0f} MB (a dense D alone: {dense_mb:.0f} MB).",
        table,
    )


def _scale(quick: bool) -> list[str]:
    """1,000 and 10,000 nodes with a sparse D: setup, memory and decision time per policy."""
    # cases per kind: 20 at 1,000 nodes (cheap, and where MPIT is still exact), 8 at 10,000
    halls = ((10, 10, 3), (10, 50, 3)) if quick else ((10, 25, 20), (10, 250, 8))
    done = [_scale_hall(rows, racks, count) for rows, racks, count in halls]
    small = halls[0][0] * halls[0][1] * 4
    return [
        "Site scale: halls of reference pods with a sparse D. "
        + " ".join(line for line, _ in done)
        + f" Cases ({halls[0][2]} of each kind at {small:,} nodes, "
        f"{halls[1][2]} at {halls[1][0] * halls[1][1] * 4:,}): typical 0-70 % busy with jobs of 8-500 "
        "nodes, hot 0-40 % busy with jobs of "
        "30-60 % of the free nodes; each case decided three times, the best wall and process CPU "
        "time kept; ms p50 / p95 / max over the cases; peak memory a decision allocates "
        f"(tracemalloc, a separate run, MB); the goal (10,000 nodes; none is stated at {small:,}) is "
        "judged on CPU time:",
        "",
        "| nodes | policy | typical wall | typical CPU | hot wall | hot CPU | peak MB | goal ms "
        "| CPU within 100 ms |",
        "|---|---|---|---|---|---|---|---|---|",
        *(row for _, table in done for row in table),
        "",
        *_local_calibration(quick),
    ]


def _local_calibration(quick: bool) -> list[str]:
    """A sparse D fitted within each node's neighbourhood (``--local``), against the true one."""
    from services.allocator.calibrate import local_support

    hall = tiled_hall(2 if quick else 4, 25 if quick else 50, seed=3, sparse=True)
    support = local_support(hall, racks=9, rows=1)
    width = int(np.diff(support.indptr).max())
    rng = np.random.default_rng(3)
    rows = []
    for t in (width + 40, 2 * width):
        powers = hall.powers_w((rng.random((t, hall.n_nodes)) < 0.5).astype(float))
        samples = synthetic_samples(hall, powers, seed=t, power_noise_w=20.0, temp_noise_c=0.2)
        fit, elapsed = _timed(fit_d, samples, hall.supply_c, False, support)
        err = compare(fit.d_matrix, hall.d_matrix, hall)
        rows.append(
            f"| {hall.n_nodes} | {width} | {t} | {fit.rmse_c:.3f} | {err['d_rel_frobenius']:.1%} | "
            f"{err['tin_rmse_c']:.3f} | {elapsed:.1f} | {elapsed / hall.n_nodes * 1e3:.1f} |"
        )
    return [
        "Local calibration (`kelvin allocator calibrate --local 9,1`): each row of D fitted on its "
        "neighbourhood only (nodes within 9 racks and 1 row: the synthetic pods' reach), random "
        "occupancies, 20 W and 0.2 °C sensor noise, 0.1 °C resolution; fewer samples than nodes "
        "suffice, and the cost is per row (10,000 nodes: 10,000 x the per-row time):",
        "",
        "| nodes | neighbours (max) | samples | fit RMSE °C | D error | inlet RMSE °C | fit s | "
        "ms per row |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def main(quick: bool) -> str:
    decision_rows, sweep_rows, exact_rows, heuristic_rows = [], [], [], []
    for hall, sizes, count in _halls(quick):
        model = HallModel(hall)
        _ = model.cc_min, model.d_csc, model.d_csr
        hot = _cases(model, sizes, count, hot=True)
        decision_rows += _decision_rows(model, _cases(model, sizes, count), hot)
        if model.n == 40:
            sweep_rows = _sweep_rows(model, 3 if quick else 12)
        exact_row, heuristic_row = _mpit_rows(model, hot)
        exact_rows.append(exact_row)
        heuristic_rows.append(heuristic_row)
    limit = PolicyOptions().mpit_exact_max_free
    return "\n".join(
        [
            "Decision time per policy (`Allocator.decide`, C = 0.2, ms p50 / p95 / max, each case "
            "timed once; typical cases: 0-70 % busy, jobs of 2-8 / 4-40 / 8-100 nodes; hot cases: "
            "0-40 % busy, jobs of 30-60 % of the free nodes; MPIT exact up to "
            f"{limit} free nodes, shortcut + greedy above):",
            "",
            "| nodes | policy | typical ms p50 / p95 / max | hot ms p50 / p95 / max | goal ms "
            "| worst / goal | meets goal |",
            "|---|---|---|---|---|---|---|",
            *decision_rows,
            "",
            "Sweep of the reference hall (40 nodes): every job size on 12 seeded occupancies "
            "(the empty hall and 0-70 % busy), C = 0.2; wall and process CPU time per decision:",
            "",
            "| policy | decisions | wall ms p50 / p95 / max | CPU ms p50 / p95 / max | "
            "wall max <= 20 ms |",
            "|---|---|---|---|---|",
            *sweep_rows,
            "",
            "MPIT's exact solver on the hot cases (forced at every size, limit "
            f"{FORCED_LIMIT_S:.0f} s) against the previous one (the same shortcuts, then HiGHS's "
            "two-stage MILP on the whole problem); same = identical node sets:",
            "",
            "| nodes | cases | exact ms p50 / p95 / max | HiGHS MILP ms p50 / p95 / max | "
            "MILP / exact p50 | MILP / exact max | same choice |",
            "|---|---|---|---|---|---|---|",
            *exact_rows,
            "",
            "Heuristics on the same cases against the exact optimum: Kelvin's greedy and the "
            "original LP + discretisation; gap = peak inlet above the exact optimum (K):",
            "",
            "| nodes | greedy ms p50 / p95 / max | greedy / exact time p50 | greedy gap K mean / max "
            "| LP+round ms p50 / p95 / max | LP+round gap K mean / max |",
            "|---|---|---|---|---|---|",
            *heuristic_rows,
            "",
            f"Policies: {', '.join(sorted(REGISTRY))}. Goal at 400 nodes interpolated, not stated.",
            "",
            *_calibration(quick),
            "",
            *_scale(quick),
        ]
    )


if __name__ == "__main__":
    print(main(quick=False))
