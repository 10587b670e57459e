"""Closed loop: fit the hall's D from measured node powers and inlet temperatures.

``Tin_i(t) - Tsup = Σ_j D_ij P_j(t)`` is linear in row i of D, so each row is
a non-negative least-squares fit (``scipy.optimize.nnls``) of the inlet rise
against all node powers over many operating points. Series are first aligned
onto common instants (:func:`align`). The model is steady state: where the
inlets lag the powers, average both over windows several times the hall's
thermal time constant (``step_ns``), or expect the lag as error.
:func:`standard_errors` says from the data alone how well D is determined, so
a site without a known D still learns whether it has sampled enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.optimize import nnls
from scipy.sparse.linalg import norm as sparse_norm

from services.common.errors import KelvinError
from services.common.hall_physics import lagged
from services.common.thermal import Float64Array, Hall

Int64Array = npt.NDArray[np.int64]
IntArrayT = npt.NDArray[np.intp]
Series = tuple[Int64Array, Float64Array]


class CalibrationError(KelvinError):
    """The data cannot support a fit (too few aligned samples, missing sensors)."""


@dataclass(frozen=True)
class Samples:
    """Aligned operating points: ``powers_w[t, j]`` and ``inlet_c[t, i]`` at ``times_ns[t]``."""

    times_ns: Int64Array
    powers_w: Float64Array
    inlet_c: Float64Array


@dataclass(frozen=True)
class Fit:
    d_matrix: Float64Array
    supply_c: Float64Array
    """Per node: the given supply temperature, or the fitted intercept."""
    rmse_c: float
    max_abs_c: float
    samples: int


def align(
    power: list[Series],
    inlet: list[Series],
    step_ns: int | None = None,
    max_age_ns: int | None = None,
) -> Samples:
    """Operating points: every sensor's value at the same instants.

    With ``step_ns``, each operating point is the mean of every series over one
    window of that length (every reading counts once; windows where a series
    has none are dropped): over windows longer than the hall's thermal time
    constant, mean inlets follow mean powers even where single readings lag.
    Without it, sensors read together (one pusher group, as the simulated
    hall's) share their timestamps, and when most instants are shared those
    are the samples: each reading once, none repeated or skipped. Otherwise
    the series are sampled on one grid (last value at or before each instant)
    at the median sampling interval over the time all series overlap; an
    instant is kept only when every series has a reading no older than
    ``max_age_ns`` (default 1.5 steps).
    """
    series = power + inlet
    if any(len(ts) == 0 for ts, _ in series):
        raise CalibrationError("a sensor has no readings in the window")
    start = max(int(ts[0]) for ts, _ in series)
    stop = min(int(ts[-1]) for ts, _ in series)
    if stop < start:
        raise CalibrationError("the sensors' readings do not overlap in time")
    n = len(power)
    if step_ns is not None:
        return _window_means(series, n, start, stop, step_ns)
    shared = _shared_instants(series)
    if shared is not None:
        return _take(shared, series, n)
    diffs = [np.median(np.diff(ts)) for ts, _ in series if len(ts) > 1]
    if not diffs:
        raise CalibrationError("every sensor has a single reading; need many operating points")
    step = max(1, int(np.median(diffs)))
    max_age = int(1.5 * step) if max_age_ns is None else max_age_ns
    grid = np.arange(start, stop + 1, step, dtype=np.int64)
    values = np.empty((len(series), len(grid)))
    ok = np.ones(len(grid), dtype=bool)
    for k, (ts, vs) in enumerate(series):
        idx = np.searchsorted(ts, grid, side="right") - 1
        ok &= idx >= 0
        idx = np.maximum(idx, 0)
        ok &= (grid - ts[idx]) <= max_age
        values[k] = vs[idx]
    ok &= np.isfinite(values).all(axis=0)
    return Samples(grid[ok], values[:n, ok].T.copy(), values[n:, ok].T.copy())


def _window_means(series: list[Series], n: int, start: int, stop: int, step_ns: int) -> Samples:
    """Each series' mean over the windows ``[start + k·step, start + (k+1)·step)``."""
    if step_ns <= 0:
        raise CalibrationError(f"step must be positive, got {step_ns} ns")
    windows = (stop - start) // step_ns + 1
    sums = np.zeros((len(series), windows))
    counts = np.zeros((len(series), windows))
    for k, (ts, vs) in enumerate(series):
        keep = (ts >= start) & (ts < start + windows * step_ns) & np.isfinite(vs)
        idx = (ts[keep] - start) // step_ns
        sums[k] = np.bincount(idx, weights=vs[keep], minlength=windows)
        counts[k] = np.bincount(idx, minlength=windows)
    ok = (counts > 0).all(axis=0)
    means = sums[:, ok] / counts[:, ok]
    times = start + np.flatnonzero(ok).astype(np.int64) * step_ns
    return Samples(times, means[:n].T.copy(), means[n:].T.copy())


def _shared_instants(series: list[Series]) -> Int64Array | None:
    """The instants every series has a reading at, if they are most of the readings."""
    common = series[0][0]
    for ts, _ in series[1:]:
        common = np.intersect1d(common, ts, assume_unique=False)
        if len(common) == 0:
            return None
    typical = float(np.median([len(ts) for ts, _ in series]))
    return common if len(common) >= 0.5 * typical else None


def _take(instants: Int64Array, series: list[Series], n: int) -> Samples:
    """Each series' reading at exactly ``instants`` (every series has one there)."""
    values = np.empty((len(series), len(instants)))
    for k, (ts, vs) in enumerate(series):
        idx = np.searchsorted(ts, instants, side="right") - 1  # the last of any duplicates
        values[k] = vs[idx]
    ok = np.isfinite(values).all(axis=0)
    return Samples(instants[ok], values[:n, ok].T.copy(), values[n:, ok].T.copy())


def fit_d(
    samples: Samples,
    supply_c: float,
    fit_supply: bool = False,
    support: sp.csr_matrix | None = None,
) -> Fit:
    """Row-wise NNLS of ``Tin - Tsup`` on P (or of Tin on [P, 1] with ``fit_supply``).

    ``support`` (N x N, non-zero where D may be): each row is fitted on its own
    columns only and D comes back sparse. Heat recirculation is local, so a
    neighbourhood (:func:`local_support`) makes a 10,000-node fit N small
    NNLS problems (T x k, k ~ 100) instead of N of T x N, and needs only more
    samples than the largest neighbourhood, not than the hall.
    """
    t, n = samples.powers_w.shape
    width = n if support is None else int(np.diff(support.indptr).max(initial=0))
    if t < width + 1:
        raise CalibrationError(
            f"{t} aligned samples for {width} {'nodes' if support is None else 'neighbours'}: "
            f"need more than {width} operating points (several times that for a stable fit)"
        )
    design = samples.powers_w / 1e3  # kW keeps the system well scaled
    if fit_supply:
        design = np.hstack([design, np.ones((t, 1))])
    supply = np.full(n, supply_c)
    rows: list[IntArrayT] = []
    cols: list[IntArrayT] = []
    vals: list[Float64Array] = []
    d = np.zeros((n, n)) if support is None else None
    for i in range(samples.inlet_c.shape[1]):
        target = samples.inlet_c[:, i] - (0.0 if fit_supply else supply_c)
        if support is None:
            coef, _ = nnls(design, target)
            assert d is not None
            d[i] = coef[:n] / 1e3
        else:
            own = support.indices[support.indptr[i] : support.indptr[i + 1]]
            take = np.r_[own, n] if fit_supply else own
            coef, _ = nnls(design[:, take], target)
            rows.append(np.full(len(own), i))
            cols.append(own)
            vals.append(coef[: len(own)] / 1e3)
        if fit_supply:
            supply[i] = coef[-1]
    fitted: Any = d
    if support is not None:
        fitted = sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)
        )
    pred = supply[None, :] + samples.powers_w @ fitted.T
    resid = samples.inlet_c - pred
    return Fit(fitted, supply, float(np.sqrt(np.mean(resid**2))), float(np.abs(resid).max()), t)


def local_support(hall: Hall, racks: int, rows: int = 1) -> sp.csr_matrix:
    """Where D may be non-zero when heat travels at most ``racks`` racks along a row and
    ``rows`` rows across: node j can warm node i only if both are that close."""
    pos = hall.positions()
    by_row: dict[int, IntArrayT] = {}
    for r in range(hall.rows):
        by_row[r] = np.flatnonzero(pos[:, 0] == r)
    r_idx: list[IntArrayT] = []
    c_idx: list[IntArrayT] = []
    for i in range(hall.n_nodes):
        r, k = int(pos[i, 0]), int(pos[i, 1])
        near = np.concatenate(
            [by_row[q] for q in range(max(0, r - rows), min(hall.rows, r + rows + 1))]
        )
        near = near[np.abs(pos[near, 1] - k) <= racks]
        r_idx.append(np.full(len(near), i))
        c_idx.append(near)
    rr, cc = np.concatenate(r_idx), np.concatenate(c_idx)
    return sp.csr_matrix((np.ones(len(rr)), (rr, cc)), shape=(hall.n_nodes, hall.n_nodes))


def compare(
    d_fit: Float64Array, d_true: Float64Array, hall: Hall, seed: int = 0
) -> dict[str, float]:
    """How far a fitted D is from a known one, in matrix terms and in predicted inlet °C.

    The inlet error is taken over 1000 random occupancies (each node busy with
    probability 1/2) plus all-idle and all-busy.
    """
    rng = np.random.default_rng(seed)
    busy = rng.random((1000, hall.n_nodes)) < 0.5
    busy = np.vstack([busy, np.zeros(hall.n_nodes, bool), np.ones(hall.n_nodes, bool)])
    p = hall.powers_w(busy.astype(np.float64))
    diff = d_fit - d_true
    err = np.asarray(p @ diff.T)
    present = hall.present_mask
    err = err[:, present]
    return {
        "d_rel_frobenius": _norm(diff) / _norm(d_true),
        "d_max_abs_k_per_w": float(abs(diff).max()),
        "tin_rmse_c": float(np.sqrt(np.mean(err**2))),
        "tin_max_abs_c": float(np.abs(err).max()),
        "max_tin_abs_c": float(
            np.abs(
                np.asarray(p @ d_fit.T)[:, present].max(axis=1)
                - np.asarray(p @ d_true.T)[:, present].max(axis=1)
            ).max()
        ),
    }


def _norm(m: Any) -> float:
    """Frobenius norm of a dense or sparse matrix."""
    return float(sparse_norm(m) if sp.issparse(m) else np.linalg.norm(m))


def standard_errors(
    samples: Samples, fit: Fit, hall: Hall, fit_supply: bool = False, seed: int = 0
) -> dict[str, Any]:
    """How well the data determine D: least-squares standard errors, no true D needed.

    Each row of D has covariance ``s² (PᵀP)⁻¹`` (``s``: the fit RMSE) when fitted
    without the non-negativity bound; the bound only removes error, so these
    are upper estimates (1.3-1.5x the error measured against a known D on
    the simulated hall). Reported like :func:`compare`: the expected relative
    Frobenius error of D, the expected RMS error of predicted inlets over the
    same random occupancies, and the nodes whose power varied too little to
    pin their column down (standard error above twice the median).
    """
    p = samples.powers_w / 1e3
    n = p.shape[1]
    if fit_supply:
        p = np.hstack([p, np.ones((p.shape[0], 1))])
    cov = np.linalg.pinv(p.T @ p)[:n, :n] * fit.rmse_c**2 / 1e6  # (K/W)² per row entry
    var = np.clip(np.diag(cov), 0.0, None)
    norm = float(np.linalg.norm(fit.d_matrix))
    rng = np.random.default_rng(seed)
    busy = rng.random((1000, hall.n_nodes)) < 0.5
    occ = hall.powers_w(busy.astype(np.float64))[:, hall.present_mask]
    tin_var = np.einsum("tj,jk,tk->t", occ, cov, occ)
    col = np.sqrt(var)
    present = np.flatnonzero(hall.present_mask)
    weak = present[col > 2 * np.median(col)]
    return {
        "d_rel_frobenius": float(np.sqrt(len(var) * var.sum()) / norm) if norm else float("inf"),
        "tin_rmse_c": float(np.sqrt(np.clip(tin_var, 0.0, None).mean())),
        "weak_nodes": [int(i) for i in weak],
    }


def synthetic_samples(
    hall: Hall,
    powers_w: Float64Array,
    seed: int = 0,
    power_noise_w: float = 20.0,
    temp_noise_c: float = 0.2,
    temp_resolution_c: float = 0.1,
) -> Samples:
    """Measured-looking samples from true powers: Tin = Tsup + D P, plus sensor noise.

    Power meters read the true power plus Gaussian noise; inlet sensors add
    Gaussian noise and round to their resolution.
    """
    rng = np.random.default_rng(seed)
    t = powers_w.shape[0]
    tin = hall.supply_c + powers_w @ hall.d_matrix.T
    tin = tin + rng.normal(0.0, temp_noise_c, tin.shape)
    if temp_resolution_c > 0:
        tin = np.round(tin / temp_resolution_c) * temp_resolution_c
    measured = powers_w + rng.normal(0.0, power_noise_w, powers_w.shape)
    return Samples(np.arange(t, dtype=np.int64) * 1_000_000_000, measured, tin)


TIME_CONSTANTS_S = (0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0)
"""Where :func:`fit_lagged` looks for the hall's time constant before refining (s)."""


def lag_samples(samples: Samples, time_constant_s: float) -> Samples:
    """The samples with every node's power through the thermal lag of ``time_constant_s``."""
    lag = lagged(samples.times_ns, samples.powers_w, time_constant_s)
    return Samples(samples.times_ns, lag, samples.inlet_c)


def fit_lagged(
    samples: Samples,
    supply_c: float,
    time_constant_s: float | None = None,
    fit_supply: bool = False,
) -> tuple[Fit, float, Samples]:
    """Fit D through the hall's thermal lag: ``Tin - Tsup = D·Q``, ``Q`` the powers lagged by τ.

    A node's heat reaches the air with its thermal mass's delay, first order
    (:func:`services.common.hall_physics.lagged`, the simulated hall's own
    physics). ``time_constant_s`` None: the τ of :data:`TIME_CONSTANTS_S`
    with the smallest residual, refined between its neighbours. Returns the
    fit, τ and the samples with the lagged powers (for :func:`standard_errors`).
    """
    from scipy.optimize import minimize_scalar

    def at(tau: float) -> tuple[Fit, Samples]:
        lag = lag_samples(samples, tau)
        return fit_d(lag, supply_c, fit_supply), lag

    if time_constant_s is not None:
        fit, lag = at(time_constant_s)
        return fit, time_constant_s, lag
    grid = list(TIME_CONSTANTS_S)
    rmse = [at(tau)[0].rmse_c for tau in grid]
    k = int(np.argmin(rmse))
    tau = grid[k]
    if 0 < k < len(grid) - 1:
        best = minimize_scalar(
            lambda t: at(float(t))[0].rmse_c,
            bounds=(grid[k - 1], grid[k + 1]),
            method="bounded",
            options={"xatol": 0.25},
        )
        if float(best.fun) < rmse[k]:
            tau = round(float(best.x), 2)
    fit, lag = at(tau)
    return fit, tau, lag
