"""The saved live model: dense or sparse, one at a time, the newer after a crash, damage set aside."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from services.allocator.store import MODEL_DENSE, MODEL_SPARSE, StateStore
from services.common.halls.synthetic import tiled_hall


def test_a_sparse_model_replaces_a_dense_one_and_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    d = tiled_hall(2, 10, seed=1, sparse=True).d_matrix
    store.save_model(d.toarray(), {"source": "dense"})
    store.save_model(d, {"source": "sparse"})
    assert not (tmp_path / MODEL_DENSE).exists()
    saved = store.load_model()
    assert saved is not None and sp.issparse(saved[0]) and (saved[0] != d).nnz == 0
    assert saved[1] == {"source": "sparse"}
    store.save_model(d.toarray(), {"source": "dense"})
    assert not (tmp_path / MODEL_SPARSE).exists()
    again = store.load_model()
    assert again is not None and not sp.issparse(again[0])
    assert np.array_equal(again[0], d.toarray())


def test_after_a_crash_between_the_two_files_the_newer_one_counts(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    d = tiled_hall(2, 10, seed=1, sparse=True).d_matrix
    store.save_model(d, {})
    np.save(tmp_path / MODEL_DENSE, (d * 2).toarray())  # the older file left behind
    old = (tmp_path / MODEL_SPARSE).stat().st_mtime_ns - 10**9
    os.utime(tmp_path / MODEL_DENSE, ns=(old, old))
    saved = store.load_model()
    assert saved is not None and sp.issparse(saved[0]) and (saved[0] != d).nnz == 0


def test_a_damaged_sparse_model_is_set_aside(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    (tmp_path / MODEL_SPARSE).write_bytes(b"PK\x03\x04 not really")
    assert store.load_model() is None
    assert [p.name.split("-")[0] for p in store.corrupt] == [f"{MODEL_SPARSE}.corrupt"]
    assert not (tmp_path / MODEL_SPARSE).exists()
