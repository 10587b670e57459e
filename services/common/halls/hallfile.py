"""Hall files: a hall described as data (YAML or JSON) plus a matrix file.

A hall file names the layout, the recirculation model (``d_matrix``, or
``a_matrix`` with ``k_w_per_k``) and the operating constants::

    name: reference-40
    rows: 2
    racks: 5
    slots: 4                     # nodes per rack, slot 0 at the bottom
    inter_row_distance: 10       # communication hops for crossing one row
    idle_power_w: 1000
    busy_power_w: 3500
    supply_c: 15
    redline_c: 30
    cop_coeffs: [0.0068, 0.0008, 0.458]
    d_matrix: reference-40.D.txt # K/W; text (one row per line) or .npy, relative to this file,
                                 # or an inline list of rows; a sparse .npz for large halls
    # a_matrix: cfd.A.txt        # instead of d_matrix: outlet->inlet heat fractions
    # k_w_per_k: 293.5           # with a_matrix: ρ f c_p, one value or one per node
    absent: []                   # node indices that do not exist (draw no power, no inlet)

JSON with the same keys works too (YAML is a superset). Node index =
``row * racks * slots + rack * slots + slot``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from services.common.thermal import Float64Array, Hall, HallError, d_from_a, load_matrix

KEYS = {
    "name",
    "rows",
    "racks",
    "slots",
    "inter_row_distance",
    "idle_power_w",
    "busy_power_w",
    "supply_c",
    "redline_c",
    "cop_coeffs",
    "d_matrix",
    "a_matrix",
    "k_w_per_k",
    "absent",
}
_FLOATS = ("inter_row_distance", "idle_power_w", "busy_power_w", "supply_c", "redline_c")

REFERENCE_FILE = "reference-40.yaml"


def load_hall(path: str | Path) -> Hall:
    """Read a hall file (YAML/JSON); matrix paths are relative to the file."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HallError(f"{p}: cannot read hall file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise HallError(f"{p}: not valid YAML/JSON: {exc}") from exc
    return hall_from_doc(doc, p.parent, str(p))


def load_reference() -> Hall:
    """The reference hall shipped in this package."""
    ref = resources.files("services.common.halls").joinpath(REFERENCE_FILE)
    with resources.as_file(ref) as p:
        return load_hall(p)


def hall_from_doc(doc: Any, base_dir: Path, source: str = "hall") -> Hall:
    """Build a hall from a parsed hall document; errors name ``source`` and the key."""
    if not isinstance(doc, dict):
        raise HallError(f"{source}: expected a mapping of hall keys, got {type(doc).__name__}")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise HallError(
            f"{source}: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(KEYS))}"
        )
    kw: dict[str, Any] = {}
    for key in ("rows", "racks", "slots"):
        if key not in doc:
            raise HallError(f"{source}: {key}: required (a positive integer) but not given")
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HallError(f"{source}: {key}: expected a positive integer, got {v!r}")
        kw[key] = v
    for key in _FLOATS:
        if key in doc:
            kw[key] = _number(doc[key], source, key)
    if "name" in doc:
        kw["name"] = str(doc["name"])
    if "cop_coeffs" in doc:
        c = doc["cop_coeffs"]
        if not isinstance(c, list) or len(c) != 3:
            raise HallError(f"{source}: cop_coeffs: expected [a, b, c] of CoP(T)=aT²+bT+c")
        kw["cop_coeffs"] = tuple(_number(x, source, "cop_coeffs") for x in c)
    n = kw["rows"] * kw["racks"] * kw["slots"]
    kw["d_matrix"] = _d_matrix(doc, base_dir, source, n)
    absent = doc.get("absent") or []
    if not isinstance(absent, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in absent
    ):
        raise HallError(f"{source}: absent: expected a list of node indices in [0, {n})")
    if absent:
        present = np.ones(n, dtype=bool)
        present[absent] = False
        kw["present"] = present
    try:
        return Hall(**kw)
    except HallError as exc:
        raise HallError(f"{source}: {exc}") from exc


def _number(v: Any, source: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise HallError(f"{source}: {key}: expected a number, got {v!r}")
    return float(v)


def _matrix(v: Any, base_dir: Path, source: str, key: str) -> Float64Array:
    if isinstance(v, str):
        return load_matrix(base_dir / v)
    try:
        m = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise HallError(f"{source}: {key}: expected a file name or a list of rows") from exc
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise HallError(f"{source}: {key}: expected a square list of rows")
    return m


def _d_matrix(doc: dict[str, Any], base_dir: Path, source: str, n: int) -> Float64Array:
    if ("d_matrix" in doc) == ("a_matrix" in doc):
        raise HallError(f"{source}: give exactly one of d_matrix and a_matrix")
    if "d_matrix" in doc:
        if "k_w_per_k" in doc:
            raise HallError(f"{source}: k_w_per_k only goes with a_matrix")
        return _matrix(doc["d_matrix"], base_dir, source, "d_matrix")
    a = _matrix(doc["a_matrix"], base_dir, source, "a_matrix")
    if a.shape != (n, n):
        raise HallError(f"{source}: a_matrix must be {n}x{n}, got {a.shape[0]}x{a.shape[1]}")
    k = doc.get("k_w_per_k")
    if k is not None and not isinstance(k, int | float | list):
        raise HallError(f"{source}: k_w_per_k: expected a number or a list of {n} numbers")
    try:
        return d_from_a(a, k)
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise HallError(f"{source}: cannot derive D from a_matrix: {exc}") from exc


def hall_to_doc(hall: Hall, d_matrix_file: str | None = None) -> dict[str, Any]:
    """The hall as a document; D inline unless ``d_matrix_file`` names its file."""
    doc: dict[str, Any] = {
        "name": hall.name,
        "rows": hall.rows,
        "racks": hall.racks,
        "slots": hall.slots,
        "inter_row_distance": hall.inter_row_distance,
        "idle_power_w": hall.idle_power_w,
        "busy_power_w": hall.busy_power_w,
        "supply_c": hall.supply_c,
        "redline_c": hall.redline_c,
        "cop_coeffs": list(hall.cop_coeffs),
        "d_matrix": d_matrix_file or np.asarray(_dense(hall.d_matrix)).tolist(),
    }
    if hall.present is not None:
        doc["absent"] = np.flatnonzero(~hall.present).tolist()
    return doc


def _dense(d: Any) -> Any:
    return d.toarray() if hasattr(d, "toarray") else d


def save_hall(hall: Hall, path: str | Path) -> Path:
    """Write ``path`` (YAML) and its D beside it as ``<stem>.D.txt`` (a sparse D as
    ``<stem>.D.npz``); returns the hall file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if hall.sparse:
        import scipy.sparse as sp

        d_name = f"{p.stem}.D.npz"
        sp.save_npz(p.parent / d_name, hall.d_matrix)
    else:
        d_name = f"{p.stem}.D.txt"
        np.savetxt(p.parent / d_name, hall.d_matrix, fmt="%.10e")
    p.write_text(yaml.safe_dump(hall_to_doc(hall, d_name), sort_keys=False), encoding="utf-8")
    return p
