"""Persistence of the allocator under ``state_dir``: atomic, and loud about damage.

``state.json`` holds jobs, queue, policy and history; ``model.D.npy`` a
fitted D applied at run time (with ``model.json`` saying where it came
from). Every write goes to a temporary file in the same directory, is
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

from services.common.errors import ConfigError
from services.common.thermal import Float64Array

log = logging.getLogger(__name__)


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

    def load_model(self) -> tuple[Float64Array, dict[str, Any]] | None:
        path = self.dir / "model.D.npy"
        if not path.exists():
            return None
        try:
            d = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            self._set_aside(path, exc)
            return None
        meta = self._read_json(self.dir / "model.json")
        return np.asarray(d, dtype=np.float64), meta if isinstance(meta, dict) else {}

    def save_model(self, d: Float64Array, meta: dict[str, Any]) -> None:
        tmp = self.dir / f".model.D.npy.{os.getpid()}.tmp"
        with tmp.open("wb") as f:
            np.save(f, d, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / "model.D.npy")
        self._write(self.dir / "model.json", json.dumps(meta).encode())

    def clear_model(self) -> None:
        for name in ("model.D.npy", "model.json"):
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
