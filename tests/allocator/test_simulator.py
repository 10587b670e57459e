"""The simulator: the published experiments, seed reproducibility, the CLI outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.allocator import experiments, simulator
from services.cli import main as kelvin
from services.common.thermal import reference_hall

SHORT = experiments.DynamicParams(seed=4, hours=1.5, warmup_hours=0.5, arrival_rate_per_h=25)


def test_static_row_places_4_5_6_3_on_row_zero_only() -> None:
    exp = experiments.static_row(reference_hall())
    runs = simulator.run_policies(exp, ["mpit", "mc1x1", "first-fit"])
    for run in runs:
        assert [r["size"] for r in run.records] == [4, 5, 6, 3]
        assert all(max(r["nodes"]) < 20 for r in run.records)
        # row 1 is absent: 18 busy x 3500 W + 2 idle x 1000 W
        assert run.records[-1]["computing_kw"] == pytest.approx(65.0)
        assert run.records[-1]["utilization"] == pytest.approx(0.9)
    mpit, mc1x1, _ = runs
    assert mpit.summary["cooling_kw"] <= mc1x1.summary["cooling_kw"]
    assert mc1x1.summary["mean_cc"] <= mpit.summary["mean_cc"]


def test_static_hall_fills_the_hall() -> None:
    run = simulator.run(experiments.static_hall(reference_hall()), "joint")
    assert sum(r["size"] for r in run.records) == 40
    assert run.records[-1]["utilization"] == 1.0
    cooling = [r["cooling_kw"] for r in run.records]
    assert cooling == sorted(cooling)


def test_dynamic_is_reproducible_from_its_seed() -> None:
    hall = reference_hall()
    a = simulator.run(experiments.dynamic(hall, SHORT), "random", seed=4)
    b = simulator.run(experiments.dynamic(hall, SHORT), "random", seed=4)
    assert a.records == b.records and a.series == b.series and a.summary == b.summary
    other = experiments.DynamicParams(seed=5, hours=1.5, warmup_hours=0.5, arrival_rate_per_h=25)
    c = simulator.run(experiments.dynamic(hall, other), "random", seed=5)
    assert c.records != a.records


def test_dynamic_accounts_energy_waits_and_stretch() -> None:
    exp = experiments.dynamic(reference_hall(), SHORT)
    run = simulator.run(exp, "mpit")
    s = run.summary
    assert s["cooling_energy_kwh"] == pytest.approx(s["avg_cooling_kw"] * 1.0)
    placed = [r for r in run.records if r["status"] == "placed"]
    assert placed and all(r["start_s"] >= r["arrival_s"] for r in placed)
    for r in placed:
        base = next(j for j in exp.jobs if j.job == r["job"]).base_runtime_s
        assert r["runtime_s"] == pytest.approx(base * (0.8 + 0.2 * r["lf"]))
    assert s["waits"] == sum(1 for r in placed if r["wait_s"] > 0 and r["start_s"] >= 1800)


def test_mttf_constraint_stalls_jobs_in_the_dynamic_run() -> None:
    exp = experiments.dynamic(reference_hall(), SHORT)
    free = simulator.run(exp, "first-fit")
    strict = simulator.run(exp, "first-fit", min_mttf_years=4.0)
    assert free.summary["stalls"] == 0
    assert strict.summary["stalls"] > 0
    assert strict.summary["avg_utilization"] < free.summary["avg_utilization"]


def test_cli_json_has_the_contract_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rc = kelvin(
        ["allocator", "simulate", "--experiment", "static-row", "--policy", "mc1x1", "--json"]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    rec = doc["records"][0]
    for key in (
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
    ):
        assert key in rec
    assert rec["nodes"] == [0, 1, 4, 5]


def test_cli_out_writes_csv_plots_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = kelvin(
        [
            "allocator",
            "simulate",
            "--experiment",
            "dynamic",
            "--policy",
            "mc1x1",
            "--seed",
            "2",
            "--hours",
            "1.5",
            "--warmup-hours",
            "0.5",
            "--arrival-rate",
            "25",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["series"]) == {"mc1x1"} and doc["summaries"][0]["policy"] == "mc1x1"
    for name in (
        "records.csv",
        "summary.csv",
        "series.csv",
        "summary.md",
        "utilization.png",
        "cooling.png",
        "cc_hist.png",
        "hall_mc1x1.png",
    ):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "utilization.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| policy |" in (tmp_path / "summary.md").read_text()


def test_cli_rejects_bad_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    rc = kelvin(["allocator", "simulate", "--experiment", "dynamic", "--sizes", "9-2"])
    assert rc == 2
    assert "--sizes 9-2" in capsys.readouterr().err


def test_a_static_job_larger_than_the_hall_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hall = tmp_path / "tiny.yaml"
    hall.write_text(f"name: tiny\nrows: 1\nracks: 1\nslots: 4\nd_matrix: {[[0.0] * 4] * 4}\n")
    argv = ["allocator", "simulate", "--experiment", "static-row", "--hall", str(hall)]
    assert kelvin(argv) == 2
    assert "static-row: its largest job has 6 nodes, hall 'tiny[rows [0]]' has 4" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(("flag", "value"), [("--arrival-rate", "inf"), ("--hours", "inf")])
def test_cli_refuses_an_endless_job_stream(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unbounded arrivals or time would draw jobs forever: refused before drawing any."""
    rc = kelvin(["allocator", "simulate", "--experiment", "dynamic", flag, value])
    assert rc == 2
    assert f"{flag} must be finite" in capsys.readouterr().err
