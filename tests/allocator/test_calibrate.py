"""Closed loop: D recovered from noisy telemetry of simulated placements, over HTTP, applied live."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from services.allocator import experiments, simulator
from services.allocator.app import create_service
from services.allocator.calibrate import (
    CalibrationError,
    align,
    compare,
    fit_d,
    local_support,
    standard_errors,
    synthetic_samples,
)
from services.allocator.closed_loop import sensor_names
from services.cli import main as kelvin
from services.common.auth import Role
from services.common.halls.synthetic import tiled_hall
from services.common.readings import Batch
from services.common.settings import Config
from services.common.thermal import Float64Array, reference_hall
from services.query_api.app import QueryApiService
from services.query_api.app import create_service as create_query_api
from tests.support.auth import TOKENS, with_auth
from tests.support.servers import free_port

STEP_S = 30.0


def _placements(hours: float, seed: int = 3) -> tuple[Float64Array, Float64Array]:
    """Node powers every 30 s from a dynamic simulation (random policy: varied occupancy)."""
    params = experiments.DynamicParams(
        seed=seed, hours=hours, warmup_hours=0.0, arrival_rate_per_h=25
    )
    run = simulator.run(
        experiments.dynamic(reference_hall(), params), "random", seed, record_powers=True
    )
    return run.power_trace(STEP_S)


def test_fit_recovers_the_reference_d_from_simulated_placements() -> None:
    hall = reference_hall()
    _, powers = _placements(12.0)
    assert len(powers) >= 1400
    samples = synthetic_samples(hall, powers[:1440], seed=1, power_noise_w=20.0, temp_noise_c=0.2)
    fit = fit_d(samples, hall.supply_c)
    err = compare(fit.d_matrix, hall.d_matrix, hall)
    # the residual is the sensor noise (0.2 °C Gaussian + 0.1 °C rounding), not model error
    assert fit.rmse_c == pytest.approx(np.sqrt(0.2**2 + 0.1**2 / 12), rel=0.1)
    assert err["d_rel_frobenius"] < 0.10
    assert err["tin_rmse_c"] < 0.15
    assert err["max_tin_abs_c"] < 0.6
    assert (fit.d_matrix >= 0).all()


def test_fit_with_free_supply_finds_the_supply_temperature() -> None:
    hall = reference_hall().replace(supply_c=18.0)
    _, powers = _placements(12.0)
    samples = synthetic_samples(hall, powers, seed=2, power_noise_w=5.0, temp_noise_c=0.05)
    fit = fit_d(samples, 15.0, fit_supply=True)
    assert np.median(fit.supply_c) == pytest.approx(18.0, abs=0.3)


def test_too_few_samples_are_refused() -> None:
    hall = reference_hall()
    samples = synthetic_samples(hall, hall.powers_w(np.zeros((10, 40))), seed=0)
    with pytest.raises(CalibrationError, match="10 aligned samples for 40 nodes"):
        fit_d(samples, 15.0)


def test_align_samples_each_series_on_one_grid() -> None:
    s = 1_000_000_000
    fast = (np.arange(0, 100 * s, 10 * s, dtype=np.int64), np.arange(10, dtype=np.float64))
    jittered = (np.arange(10, dtype=np.int64) * 10 * s + 2 * s, np.arange(10, dtype=np.float64) * 2)
    gap = (np.array([0, 10 * s, 20 * s, 80 * s, 90 * s], dtype=np.int64), np.ones(5))
    out = align([fast], [jittered, gap])
    # grid from 2 s (all started) to 90 s (all ended), 10 s steps; readings may be 15 s old,
    # so the gap in the third series drops 42..72 s
    assert out.times_ns.tolist() == [2 * s, 12 * s, 22 * s, 32 * s, 82 * s]
    np.testing.assert_array_equal(out.powers_w[:, 0], [0.0, 1.0, 2.0, 3.0, 8.0])
    np.testing.assert_array_equal(out.inlet_c[:, 0], [0.0, 2.0, 4.0, 6.0, 16.0])
    with pytest.raises(CalibrationError, match="no readings"):
        align([fast], [(np.empty(0, np.int64), np.empty(0))])


def test_align_takes_shared_instants_once_each() -> None:
    """Sensors read together share their timestamps: those are the samples, none repeated."""
    ms = 1_000_000
    ts = np.arange(0, 5000 * ms, 250 * ms, dtype=np.int64)
    late = np.delete(ts, [3, 4, 11])  # reads the pusher skipped
    power = [(late, np.arange(len(late), dtype=np.float64))]
    inlet = [(late, np.arange(len(late), dtype=np.float64) * 2), (ts, np.ones(len(ts)))]
    out = align(power, inlet)
    assert out.times_ns.tolist() == late.tolist()
    np.testing.assert_array_equal(out.powers_w[:, 0], np.arange(len(late)))
    # With a step, every series' mean over each window: 0-1 s holds readings 0-2 (the
    # pusher skipped 750 and 1000 ms), 1-2 s readings 3-5, 2-3 s 6-8 (2750 ms skipped), ...
    means = align(power, inlet, step_ns=1000 * ms)
    assert means.times_ns.tolist() == [0, 1000 * ms, 2000 * ms, 3000 * ms, 4000 * ms]
    np.testing.assert_allclose(means.powers_w[:, 0], [1.0, 4.0, 7.0, 10.5, 14.5])
    np.testing.assert_allclose(means.inlet_c[:, 0], 2 * means.powers_w[:, 0])
    np.testing.assert_array_equal(means.inlet_c[:, 1], 1.0)


def test_standard_errors_estimate_the_error_without_the_true_d() -> None:
    """From the data alone: an upper estimate of the error, of the right size, and weak nodes."""
    hall = reference_hall()
    rng = np.random.default_rng(4)
    busy = rng.random((600, hall.n_nodes)) < 0.5
    busy[:, [7, 23]] = False  # two nodes never run anything
    powers = hall.powers_w(busy.astype(np.float64)) + rng.normal(0.0, 100.0, busy.shape)
    samples = synthetic_samples(hall, powers, seed=4, temp_noise_c=0.1, temp_resolution_c=0)
    fit = fit_d(samples, hall.supply_c)
    known = compare(fit.d_matrix, hall.d_matrix, hall)
    expected = standard_errors(samples, fit, hall)
    assert known["d_rel_frobenius"] < expected["d_rel_frobenius"] < 3 * known["d_rel_frobenius"]
    assert known["tin_rmse_c"] < expected["tin_rmse_c"] < 3 * known["tin_rmse_c"]
    assert expected["weak_nodes"] == [7, 23]


async def _query_api_with(tmp_path: Path, series: dict[str, tuple[Any, Any]]) -> QueryApiService:
    """A real query API over a fresh SQLite file holding ``series`` (name -> (ns, values))."""
    cfg = Config(
        overrides=with_auth(
            {
                "query_api": {"host": "127.0.0.1", "port": 0},
                "storage": {"sqlite": {"path": str(tmp_path / "kelvin.sqlite")}},
            }
        )
    )
    svc = create_query_api(cfg)
    await svc.start()
    assert svc.storage is not None
    for name, (ts, vs) in series.items():
        await svc.storage.write(Batch.single(name, ts, vs))
    return svc


async def test_calibrate_over_http_and_apply_to_a_running_allocator(tmp_path: Path) -> None:
    hall = reference_hall()
    _, powers = _placements(12.0)
    samples = synthetic_samples(hall, powers[:1200], seed=5)
    t0 = 1_790_000_000 * 1_000_000_000
    ts = t0 + np.arange(len(powers[:1200]), dtype=np.int64) * int(STEP_S * 1e9)
    names = sensor_names(hall)
    series = {n: (ts, samples.powers_w[:, i]) for i, n in enumerate(names["power"])}
    series |= {n: (ts, samples.inlet_c[:, i]) for i, n in enumerate(names["inlet_temp"])}
    query = await _query_api_with(tmp_path, series)
    cfg = Config(overrides=with_auth({}))
    for key, value in {
        "host": "127.0.0.1",
        "port": 0,
        "state_dir": str(tmp_path / "s"),
        "brokers": [f"127.0.0.1:{free_port()}"],
    }.items():
        cfg.set("allocator", key, value)
    allocator = create_service(cfg)
    await allocator.start()
    try:
        np.savetxt(tmp_path / "true.D.txt", hall.d_matrix)
        argv = [
            "allocator",
            "calibrate",
            "--start",
            str(t0),
            "--end",
            str(int(ts[-1]) + 1),
            "--url",
            f"http://127.0.0.1:{query.port}",
            "--known-d",
            str(tmp_path / "true.D.txt"),
            "--out",
            str(tmp_path / "fitted.yaml"),
            "--apply",
            "--allocator-url",
            f"http://127.0.0.1:{allocator.port}",
            "--json",
            "--token",
            TOKENS[Role.ADMIN],
        ]
        out = tmp_path / "report.json"

        def run_cli() -> int:
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = kelvin(argv)
            out.write_text(buf.getvalue())
            return rc

        assert await asyncio.to_thread(run_cli) == 0
        report = json.loads(out.read_text())
        assert report["samples"] == 1200 and report["sensors"] == 80
        assert report["known"]["d_rel_frobenius"] < 0.15
        live = allocator.core.book.model.hall.d_matrix
        written = np.loadtxt(tmp_path / "fitted.D.txt")  # the --out hall file's D
        np.testing.assert_allclose(live, written, rtol=1e-6, atol=1e-12)
        assert allocator.core.model_meta["source"] == "kelvin allocator calibrate"
        assert not np.allclose(live, hall.d_matrix)
        # the same fit sparse, each row on its neighbourhood: a sparse hall file, and applied
        argv[argv.index("--out") + 1] = str(tmp_path / "local.yaml")
        argv[-3:-3] = ["--local", "4,1"]
        assert await asyncio.to_thread(run_cli) == 0
        local = json.loads(out.read_text())
        assert local["known"]["d_rel_frobenius"] < 0.15 and "expected" not in local
        written_sparse = sp.load_npz(tmp_path / "local.D.npz")
        live_sparse = allocator.core.book.model.hall.d_matrix
        assert sp.issparse(live_sparse) and (live_sparse != written_sparse).nnz == 0
        assert (tmp_path / "s" / "model.D.npz").exists()
        assert not (tmp_path / "s" / "model.D.npy").exists()  # the dense fit it replaced
    finally:
        await allocator.stop()
    restarted = create_service(cfg)  # the sparse D is what a restart makes live again
    await restarted.start()
    try:
        again = restarted.core.book.model.hall.d_matrix
        assert sp.issparse(again) and (again != written_sparse).nnz == 0
        assert restarted.core.model_meta["fit"]["samples"] == local["samples"]
    finally:
        await restarted.stop()
        await query.stop()


def test_calibrate_names_an_unreachable_query_api(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    rc = kelvin(["allocator", "calibrate", "--start", "now-1h", "--end", "now", "--url", url])
    assert rc == 1
    assert f"cannot reach the query API at {url}" in capsys.readouterr().err


def test_calibrate_checks_the_known_d_against_the_hall_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --known-d of the wrong size is named before any reading is fetched (none could be)."""
    small = tmp_path / "small.D.txt"
    np.savetxt(small, np.zeros((20, 20)))
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["allocator", "calibrate", "--start", "now-1h", "--end", "now", "--url", url]
    rc = kelvin([*argv, "--known-d", str(small)])
    assert rc == 2
    assert f"--known-d {small}: matrix is 20x20, expected 40x40" in capsys.readouterr().err


def test_sensor_map_templates_and_lists() -> None:
    hall = reference_hall()
    names = sensor_names(hall, {"power": "/dc/r{row}/k{rack}/n{slot}/watts"})
    assert names["power"][34] == "/dc/r1/k3/n2/watts"
    assert names["inlet_temp"][0] == "/hall/row0/rack0/node0/inlet_temp"
    from services.common.errors import ConfigError

    with pytest.raises(ConfigError, match="list of 40 names"):
        sensor_names(hall, {"power": ["/a"]})


def test_compare_reports_zero_for_the_truth() -> None:
    hall = reference_hall()
    err = compare(hall.d_matrix, hall.d_matrix, hall)
    assert err["d_rel_frobenius"] == 0.0 and err["tin_max_abs_c"] == 0.0


def test_a_local_fit_recovers_a_sparse_hall_from_few_samples() -> None:
    """200 nodes, neighbours within 9 racks (the pods' reach): fewer samples than nodes suffice."""
    hall = tiled_hall(2, 25, seed=3, sparse=True)
    support = local_support(hall, racks=9, rows=1)
    true_pattern = hall.d_matrix.copy()
    true_pattern.data[:] = 1.0
    assert (true_pattern - true_pattern.multiply(support)).nnz == 0  # the truth lies inside
    rng = np.random.default_rng(3)
    powers = hall.powers_w((rng.random((190, hall.n_nodes)) < 0.5).astype(float))
    samples = synthetic_samples(hall, powers, seed=1, power_noise_w=5.0, temp_noise_c=0.02,
                                temp_resolution_c=0.0)  # fmt: skip
    fit = fit_d(samples, hall.supply_c, support=support)
    assert sp.issparse(fit.d_matrix) and fit.d_matrix.nnz <= support.nnz
    err = compare(fit.d_matrix, hall.d_matrix, hall)
    assert err["d_rel_frobenius"] < 0.1 and err["tin_rmse_c"] < 0.05, err
    with pytest.raises(CalibrationError, match="neighbours"):
        fit_d(synthetic_samples(hall, powers[:100]), hall.supply_c, support=support)
