"""The shared thermal model and hall files, against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.common.halls.hallfile import hall_from_doc, load_hall, save_hall
from services.common.halls.synthetic import tiled_hall
from services.common.thermal import (
    K_DEFAULT_W_K,
    Hall,
    HallError,
    a_from_d,
    d_from_a,
    node_sensor,
    reference_hall,
)


def test_k_is_rho_flow_cp() -> None:
    k = float(K_DEFAULT_W_K)
    assert k == pytest.approx(1.19 * 0.2454 * 1005.0)
    assert k == pytest.approx(293.49, abs=0.01)


def test_d_from_small_a_by_hand() -> None:
    # a_10 = 0.2: a fifth of node 1's outlet heat reaches node 0; a_01 = 0.5.
    # With K = 100 W/K: D = ((I - Aᵀ)^-1 - I) / 100, (I - Aᵀ)^-1 = [[1, .2], [.5, 1]] / 0.9
    a = np.array([[0.0, 0.5], [0.2, 0.0]])
    d = d_from_a(a, 100.0)
    expected = np.array([[1 / 9, 2 / 9], [5 / 9, 1 / 9]]) / 100.0
    np.testing.assert_allclose(d, expected, rtol=1e-12)


def test_d_from_a_per_node_k_and_round_trip() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 0.1, (6, 6))
    k = rng.uniform(200, 400, 6)
    d = d_from_a(a, k)
    # definition: (K - AᵀK)(D + K^-1) = I
    kmat = np.diag(k)
    np.testing.assert_allclose((kmat - a.T @ kmat) @ (d + np.diag(1 / k)), np.eye(6), atol=1e-12)
    np.testing.assert_allclose(a_from_d(d, k), a, atol=1e-12)


def test_reference_d_implies_physical_a() -> None:
    a = a_from_d(reference_hall().d_matrix)
    assert a.min() > -1e-6  # only rounding of the ten-decimal source
    exit_coefficient = 1.0 - a.sum(axis=1)
    assert exit_coefficient.min() > 0.0


def test_cop_and_cooling_power_by_hand() -> None:
    hall = Hall(1, 1, 2, np.array([[0.001, 0.002], [0.0, 0.001]]))
    assert hall.cop(25.0) == pytest.approx(0.0068 * 625 + 0.0008 * 25 + 0.458)
    p = np.array([1000.0, 3500.0])
    # Tin = 15 + [1 + 7, 3.5] = [23, 18.5]; Tsup' = 15 + 30 - 23 = 22; CoP(22) = 3.7668
    np.testing.assert_allclose(hall.inlet_c(p), [23.0, 18.5])
    assert hall.raised_supply_c(hall.inlet_c(p)) == pytest.approx(22.0)
    assert hall.cooling_power_w(p) == pytest.approx(4500.0 / 3.7668)


def test_reference_hall_layout_and_provenance_facts() -> None:
    hall = reference_hall()
    assert (hall.rows, hall.racks, hall.slots, hall.n_nodes) == (2, 5, 4, 40)
    assert hall.index(1, 3, 2) == 20 + 12 + 2
    assert hall.position(34) == (1, 3, 2)
    rows = hall.d_matrix.sum(axis=1)
    assert int(np.argmax(rows)) == 39
    assert rows[39] == pytest.approx(0.0087344775, abs=1e-10)
    assert np.flatnonzero(rows == 0).tolist() == [8, 9, 28, 29]
    assert np.flatnonzero(hall.d_matrix.sum(axis=0) == 0).tolist() == [3, 7, 23, 27]
    # slot 0 at the bottom: inlets get hotter going up, bottom exhausts pollute most
    by_slot_rise = [rows[hall.positions()[:, 2] == s].sum() for s in range(4)]
    assert by_slot_rise == sorted(by_slot_rise)
    assert node_sensor(hall, 34, "inlet_temp") == "/hall/row1/rack3/node2/inlet_temp"


def test_subset_rows_makes_other_rows_absent() -> None:
    hall = reference_hall().subset_rows([0])
    p = hall.powers_w(np.ones(40))
    assert p[:20].tolist() == [3500.0] * 20 and p[20:].tolist() == [0.0] * 20
    tin = hall.inlet_c(p)
    assert hall.max_inlet_c(tin) == pytest.approx(tin[:20].max())


def test_hall_file_round_trip(tmp_path: Path) -> None:
    hall = reference_hall().replace(supply_c=18.0, name="copy")
    path = save_hall(hall, tmp_path / "copy.yaml")
    back = load_hall(path)
    assert back.name == "copy" and back.supply_c == 18.0
    np.testing.assert_allclose(back.d_matrix, hall.d_matrix, rtol=1e-9)


def test_hall_file_with_a_matrix_and_k(tmp_path: Path) -> None:
    a = np.array([[0.0, 0.5], [0.2, 0.0]])
    np.savetxt(tmp_path / "a.txt", a)
    (tmp_path / "h.yaml").write_text(
        "rows: 1\nracks: 1\nslots: 2\na_matrix: a.txt\nk_w_per_k: 100\nabsent: [1]\n"
    )
    hall = load_hall(tmp_path / "h.yaml")
    np.testing.assert_allclose(hall.d_matrix, d_from_a(a, 100.0))
    assert hall.present_mask.tolist() == [True, False]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"rows": 1, "racks": 1, "slots": 2, "d_matrix": [[0, 0], [0, 0]], "colour": 1},
            "unknown key",
        ),
        ({"racks": 1, "slots": 1, "d_matrix": [[0]]}, "rows: required"),
        (
            {"rows": 0, "racks": 1, "slots": 1, "d_matrix": [[0]]},
            "rows: expected a positive integer",
        ),
        ({"rows": 1, "racks": 1, "slots": 2, "d_matrix": [[0]]}, "D must be 2x2"),
        ({"rows": 1, "racks": 1, "slots": 1, "d_matrix": [[-1]]}, "non-negative"),
        ({"rows": 1, "racks": 1, "slots": 1}, "exactly one of d_matrix and a_matrix"),
        ({"rows": 1, "racks": 1, "slots": 1, "d_matrix": [[0]], "supply_c": 40}, "redline_c"),
        ({"rows": 1, "racks": 1, "slots": 1, "d_matrix": "missing.txt"}, "cannot read matrix"),
        (
            {"rows": 1, "racks": 1, "slots": 1, "d_matrix": [[0]], "cop_coeffs": [0, 0.1, 0.5]},
            r"cop_coeffs \[0.0, 0.1, 0.5\]: CoP\(T\) = aT² \+ bT \+ c must be positive",
        ),
        (
            {"rows": 1, "racks": 1, "slots": 1, "d_matrix": [[0]], "cop_coeffs": [0, 0, 0]},
            "must be positive at every T",
        ),
        (
            {"rows": 1, "racks": 1, "slots": 1, "d_matrix": [[0]], "busy_power_w": float("inf")},
            "busy_power_w must be finite, got inf",
        ),
    ],
)
def test_bad_hall_files_are_named_precisely(tmp_path: Path, doc: dict, message: str) -> None:
    with pytest.raises(HallError, match=message) as info:
        hall_from_doc(doc, tmp_path, "site.yaml")
    assert "site.yaml" in str(info.value) or "missing.txt" in str(info.value)


def test_synthetic_hall_tiles_reference_pods() -> None:
    hall = tiled_hall(4, 10, seed=3, coupling=0.1, jitter=0.0)
    assert hall.n_nodes == 160
    ref = reference_hall().d_matrix
    pod = [r * 40 + c * 4 + s for r in range(2) for c in range(5) for s in range(4)]
    np.testing.assert_allclose(hall.d_matrix[np.ix_(pod, pod)], ref / 1.2)
    other_aisle = [i + 80 for i in pod]
    assert not hall.d_matrix[np.ix_(pod, other_aisle)].any()
    with pytest.raises(HallError, match="multiple of 5"):
        tiled_hall(2, 7)
