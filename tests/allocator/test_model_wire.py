"""The live D's wire forms: dense rows, COO triplets, base64 .npz; each refused precisely."""

from __future__ import annotations

import base64
import io
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from pydantic import ValidationError

from services.allocator import model_wire as wire
from services.common.halls.synthetic import tiled_hall


def _doc(**fields: object) -> wire.ModelIn:
    return wire.ModelIn.model_validate(fields)


def test_every_form_carries_the_same_matrix_bit_for_bit() -> None:
    d = tiled_hall(2, 10, seed=3, sparse=True).d_matrix
    for form in ("dense", "coo", "npz"):
        back = wire.decode(_doc(**wire.encode(d, form)), 80)
        assert np.array_equal(back.toarray() if sp.issparse(back) else back, d.toarray()), form
    assert not sp.issparse(wire.decode(_doc(**wire.encode(d, "dense")), 80))
    assert sp.issparse(wire.decode(_doc(**wire.encode(d, "npz")), 80))


def test_exactly_one_form() -> None:
    with pytest.raises(ValidationError, match=r"exactly one form.*got none"):
        _doc(source="x")
    with pytest.raises(ValidationError, match="got d_matrix, d_npz"):
        _doc(d_matrix=[[0.0]], d_npz="")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_matrix": [[0.0, 1.0], [0.0]]}, r"d_matrix: rows differ in length \(\[1, 2\]\)"),
        ({"d_matrix": [[0.0, 0.0]] * 3}, "d_matrix: D must be 2x2 for this hall, got 3x2"),
        (
            {"d_coo": {"shape": [10**9, 10**9], "row": [0], "col": [0], "data": [1.0]}},
            "d_coo: D must be 2x2 for this hall, got 1000000000x1000000000",
        ),
        (
            {"d_coo": {"shape": [2, 2], "row": [0, 1], "col": [0], "data": [1.0]}},
            r"d_coo: row, col and data differ in length \(2, 1, 1\)",
        ),
        (
            {"d_coo": {"shape": [2, 2], "row": [0, 2], "col": [0, 0], "data": [1.0, 1.0]}},
            r"d_coo: row\[1\] = 2 is outside 0..1",
        ),
        (
            {"d_coo": {"shape": [2, 2], "row": [0], "col": [-1], "data": [1.0]}},
            r"d_coo: col\[0\] = -1 is outside 0..1",
        ),
        (
            {"d_coo": {"shape": [2, 2], "row": [10**30], "col": [0], "data": [1.0]}},
            "d_coo: row and col must be node indices 0..1",
        ),
        ({"d_npz": "not base64!"}, "d_npz: not base64"),
        ({"d_npz": base64.b64encode(b"PK junk").decode()}, "d_npz: not a scipy.sparse .npz"),
    ],
)
def test_malformed_documents_are_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wire.decode(_doc(**fields), 2)


def _npz(**arrays: np.ndarray) -> str:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode()


def test_an_npz_that_is_not_a_sparse_d_is_refused() -> None:
    with pytest.raises(ValueError, match="does not contain a sparse"):
        wire.decode(_doc(d_npz=_npz(x=np.zeros(3))), 2)
    with pytest.raises(ValueError, match=r"not a scipy\.sparse \.npz.*pickle"):
        wire.decode(_doc(d_npz=_npz(format=np.array([object()], dtype=object))), 2)
    big = wire.npz_text(sp.random(50, 50, density=0.5, random_state=1))
    with pytest.raises(ValueError, match="D must be 2x2 for this hall, got 50x50"):
        wire.decode(_doc(d_npz=big), 2)


def test_an_npz_that_would_unpack_beyond_the_bound_is_refused_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data.npy", b"\0" * 100_000)  # a few hundred bytes packed
    monkeypatch.setattr(wire, "MAX_NPZ_BYTES", 50_000)
    with pytest.raises(ValueError, match="unpacks to 100000 bytes, more than 50000"):
        wire.decode(_doc(d_npz=base64.b64encode(buf.getvalue()).decode()), 2)
