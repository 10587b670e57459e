"""Physical limits of Kelvin's storage layout on this machine, measured beside each benchmark.

- **Blob inserts in plain sqlite3**: the readings as Kelvin's SQLite layout
  keeps them (one row per chunk of raw int64 timestamps and float64 values),
  inserted with nothing else: the most any SQLite writer of that layout can do.
- **fdatasync** of a spool-sized append on the disk the benchmark writes to:
  the floor of an acknowledgement that waits for durability.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from pathlib import Path

import numpy as np


def blob_inserts(path: Path, ts: np.ndarray, vs: np.ndarray, chunk: int = 200_000) -> float:
    """Readings/s inserting ``chunk``-reading rows of raw bytes (WAL, one transaction each)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(
        "CREATE TABLE chunks (id INTEGER PRIMARY KEY, t0 INTEGER, n INTEGER, ts BLOB, vs BLOB)"
    )
    pieces = [
        (
            int(ts[a]),
            min(chunk, len(ts) - a),
            ts[a : a + chunk].tobytes(),
            vs[a : a + chunk].tobytes(),
        )
        for a in range(0, len(ts), chunk)
    ]
    t0 = time.perf_counter()
    for piece in pieces:
        con.execute("BEGIN")
        con.execute("INSERT INTO chunks (t0, n, ts, vs) VALUES (?,?,?,?)", piece)
        con.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    con.close()
    return len(ts) / elapsed


def fdatasync_ms(directory: Path, size: int = 16 << 10, n: int = 200) -> tuple[float, float]:
    """(p50, p99) ms of appending ``size`` bytes and fdatasync'ing, in ``directory``."""
    path = directory / "fdatasync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    data = os.urandom(size)
    took = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            took.append((time.perf_counter() - t0) * 1e3)
    finally:
        os.close(fd)
        path.unlink()
    q = statistics.quantiles(took, n=100)
    return q[49], q[98]
