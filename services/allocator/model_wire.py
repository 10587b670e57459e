"""A heat-recirculation matrix D on the wire (``/api/v1/hall/model``) and on disk.

Three JSON forms, exactly one per document:

- ``d_matrix``: rows of numbers (dense; small halls);
- ``d_coo``: ``{"shape": [n, n], "row": [...], "col": [...], "data": [...]}``, the
  non-zeros as triplets (repeated positions add up, as in ``scipy.sparse``);
- ``d_npz``: base64 of the ``.npz`` file ``scipy.sparse.save_npz`` writes, the
  form sparse hall files use (``kelvin allocator calibrate --local ... --apply``
  sends it: 1.2M non-zeros are ~19 MB, against ~40 MB as triplets).

Decoding checks the form; :class:`~services.common.thermal.Hall` then checks
the shape against the layout, finiteness and signs, for every form alike.
"""

from __future__ import annotations

import base64
import binascii
import io
import zipfile
import zlib
from typing import Any, Literal, TypeAlias

import numpy as np
import scipy.sparse as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.thermal import Float64Array

MAX_BODY_BYTES = 128 << 20
"""Largest model document accepted (the 10,000-node benchmark hall's D: ~19 MB as d_npz)."""
MAX_NPZ_BYTES = 4 * MAX_BODY_BYTES
"""Largest an ``.npz`` may unpack to (its arrays are compressed: a small file can claim more)."""

UNREADABLE = (
    ValueError,
    TypeError,
    KeyError,
    OSError,
    EOFError,
    NotImplementedError,
    zipfile.BadZipFile,
    zlib.error,
)
"""What reading a damaged or foreign .npz raises (np.load, zipfile, zlib, the constructors)."""

Form = Literal["dense", "coo", "npz"]
Matrix: TypeAlias = Float64Array | sp.csr_matrix


class CooIn(BaseModel):
    """The non-zeros of a sparse D as triplets."""

    model_config = ConfigDict(extra="forbid")
    shape: tuple[int, int]
    row: list[int]
    col: list[int]
    data: list[float]


class ModelIn(BaseModel):
    """A heat-recirculation matrix to make live (K/W, node order of the hall)."""

    model_config = ConfigDict(extra="forbid")
    d_matrix: list[list[float]] | None = None
    d_coo: CooIn | None = None
    d_npz: str | None = Field(None, description="base64 of a scipy.sparse.save_npz file")
    source: str = Field("api", max_length=200)
    fit: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ModelIn:
        given = [k for k in ("d_matrix", "d_coo", "d_npz") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give D in exactly one form: d_matrix (rows), d_coo (shape, row, col, data) "
                f"or d_npz (base64 of a scipy.sparse .npz); got {', '.join(given) or 'none'}"
            )
        return self


def decode(doc: ModelIn, n: int) -> Matrix:
    """The matrix a document carries for a hall of ``n`` nodes (ValueError naming the form
    and what is wrong; the shape is checked before anything of that size is built)."""
    if doc.d_matrix is not None:
        lengths = {len(r) for r in doc.d_matrix}
        if len(lengths) > 1:
            raise ValueError(f"d_matrix: rows differ in length ({sorted(lengths)})")
        _check_shape("d_matrix", (len(doc.d_matrix), lengths.pop() if lengths else 0), n)
        return np.asarray(doc.d_matrix, dtype=np.float64)
    if doc.d_coo is not None:
        c = doc.d_coo
        _check_shape("d_coo", c.shape, n)
        if not len(c.row) == len(c.col) == len(c.data):
            raise ValueError(
                f"d_coo: row, col and data differ in length ({len(c.row)}, {len(c.col)}, "
                f"{len(c.data)})"
            )
        try:
            row, col = np.asarray(c.row, dtype=np.int64), np.asarray(c.col, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"d_coo: row and col must be node indices 0..{n - 1}") from None
        for axis, idx in (("row", row), ("col", col)):
            bad = np.flatnonzero((idx < 0) | (idx >= n))
            if bad.size:
                raise ValueError(
                    f"d_coo: {axis}[{int(bad[0])}] = {int(idx[bad[0]])} is outside 0..{n - 1}"
                )
        data = np.asarray(c.data, dtype=np.float64)
        return sp.csr_matrix(sp.coo_matrix((data, (row, col)), shape=(n, n)))
    assert doc.d_npz is not None
    return npz_matrix(doc.d_npz, n)


def _check_shape(form: str, shape: tuple[int, ...], n: int) -> None:
    if tuple(shape) != (n, n):
        raise ValueError(
            f"{form}: D must be {n}x{n} for this hall, got {'x'.join(map(str, shape))}"
        )


def npz_matrix(text: str, n: int) -> sp.csr_matrix:
    """A ``d_npz`` field back to the matrix, refusing what a sparse n x n .npz is not."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"d_npz: not base64 ({exc})") from None
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            unpacked = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"d_npz: not a scipy.sparse .npz file ({exc})") from None
    if unpacked > MAX_NPZ_BYTES:
        raise ValueError(f"d_npz: unpacks to {unpacked} bytes, more than {MAX_NPZ_BYTES}")
    try:  # no pickles: load_npz reads with allow_pickle=False
        m = sp.load_npz(io.BytesIO(raw))
    except UNREADABLE as exc:
        raise ValueError(f"d_npz: not a scipy.sparse .npz file ({exc})") from None
    _check_shape("d_npz", m.shape, n)
    return sp.csr_matrix(m, dtype=np.float64)


def npz_text(d: Matrix) -> str:
    """The ``d_npz`` field for a matrix (stored sparse, compressed)."""
    buf = io.BytesIO()
    sp.save_npz(buf, sp.csr_matrix(d), compressed=True)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode(d: Matrix, form: Form) -> dict[str, Any]:
    """The document field(s) carrying ``d`` in ``form``."""
    if form == "dense":
        dense = sp.csr_matrix(d).toarray() if sp.issparse(d) else np.asarray(d)
        return {"d_matrix": dense.tolist()}
    if form == "npz":
        return {"d_npz": npz_text(d)}
    coo = sp.coo_matrix(d)
    return {
        "d_coo": {
            "shape": list(coo.shape),
            "row": coo.row.tolist(),
            "col": coo.col.tolist(),
            "data": coo.data.tolist(),
        }
    }
