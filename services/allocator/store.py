"""Persistence of the allocator under ``state_dir``: atomic, and loud about damage.

``state.json`` holds jobs, queue, policy and history; ``model.D.npy`` (or,
sparse, ``model.D.npz``) a fitted D applied at run time (with ``model.json``
saying where it came from). Every write goes to a temporary file in the same directory, is
fsynced, then renamed over the old one, so a crash leaves either the old or
the new state, never half of one. A file that does not parse is moved aside
(``*.corrupt-<ns>``) and reported, never silently replaced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from services.allocator.model_wire import UNREADABLE
from services.common.errors import ConfigError
from services.common.thermal import Float64Array

log = logging.getLogger(__name__)

MODEL_DENSE, MODEL_SPARSE = "model.D.npy", "model.D.npz"


class StateStore:
    """Reads and atomically writes the allocator's files."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"allocator.state_dir {directory}: cannot create: {exc.strerror}"
            ) from exc
        self.corrupt: list[Path] = []

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def load_state(self) -> dict[str, Any] | None:
        doc = self._read_json(self.state_path)
        return doc if isinstance(doc, dict) else None

    def save_state(self, doc: dict[str, Any]) -> None:
        self._write(self.state_path, json.dumps(doc, separators=(",", ":")).encode())

    def load_model(self) -> tuple[Float64Array | sp.csr_matrix, dict[str, Any]] | None:
        """The saved D (dense ``model.D.npy`` or sparse ``model.D.npz``) and what it came from."""
        saved = [p for p in (self.dir / MODEL_DENSE, self.dir / MODEL_SPARSE) if p.exists()]
        if not saved:
            return None
        # both exist only after a crash between writing one and removing the other: the newer
        path = max(saved, key=lambda p: p.stat().st_mtime_ns)
        d: Float64Array | sp.csr_matrix
        try:
            if path.name == MODEL_SPARSE:
                d = sp.csr_matrix(sp.load_npz(path), dtype=np.float64)
            else:
                d = np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)
        except UNREADABLE as exc:
            self._set_aside(path, exc)
            return None
        meta = self._read_json(self.dir / "model.json")
        return d, meta if isinstance(meta, dict) else {}

    def save_model(self, d: Float64Array | sp.spmatrix, meta: dict[str, Any]) -> None:
        """Write D atomically (sparse as ``.npz``, dense as ``.npy``), then drop the other form."""
        name, other = (MODEL_SPARSE, MODEL_DENSE) if sp.issparse(d) else (MODEL_DENSE, MODEL_SPARSE)
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        with tmp.open("wb") as f:
            if sp.issparse(d):
                sp.save_npz(f, sp.csr_matrix(d), compressed=True)
            else:
                np.save(f, d, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / other).unlink()
        self._write(self.dir / "model.json", json.dumps(meta).encode())

    def clear_model(self) -> None:
        for name in (MODEL_DENSE, MODEL_SPARSE, "model.json"):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        self._sync_dir()

    def _read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._set_aside(path, exc)
            return None

    def _set_aside(self, path: Path, exc: Exception) -> None:
        target = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
        with contextlib.suppress(OSError):
            os.replace(path, target)
        self.corrupt.append(target)
        log.error(
            "allocator state %s is unreadable (%s); moved to %s, starting without it",
            path,
            exc,
            target,
        )

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._sync_dir()

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
