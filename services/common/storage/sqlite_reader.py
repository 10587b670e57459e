"""Reading the SQLite layout: one consistent snapshot of chunks plus staged writes.

Functions run inside the caller's read transaction, so a compaction that
commits meanwhile is either wholly visible or not at all.
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.readings import Int64Array
from services.common.storage import chunks
from services.common.storage.chunks import Piece

_MIN_I64 = -(2**63)


@dataclass(slots=True)
class StagedIndex:
    """Which sensors a staged row holds and where (loaded once per read snapshot)."""

    seq: int
    sids: Int64Array
    offsets: Int64Array


def unpack_ids(blob: bytes) -> Int64Array:
    """Inverse of the writer's ``pack_ids``."""
    return np.cumsum(np.frombuffer(zlib.decompress(blob), "<i8"), dtype=np.int64)


class StagedCache:
    """Staged rows' indexes, loaded once per backend instance.

    A staged row never changes (compaction deletes it, seq never repeats), so
    its index (sensor ids and offsets: 160 KiB for a 10k-sensor batch) is read
    once rather than by every read of recent data.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._cache: dict[tuple[int, int, int, int], StagedIndex] = {}
        self._lock = threading.Lock()

    def index(self, con: sqlite3.Connection, start_ns: int, end_ns: int) -> list[StagedIndex]:
        """Index of the staged rows that may hold readings in ``[start, end)``."""
        out = []
        for seq, n, k, lo in con.execute(
            "SELECT seq, n, k, min_ts FROM staged WHERE min_ts < ? AND max_ts >= ? ORDER BY seq",
            (end_ns, start_ns),
        ).fetchall():
            key = (int(seq), int(n), int(k), int(lo))  # not just seq: the file may be replaced
            found = self._cache.get(key)
            if found is None:
                (idx,) = con.execute("SELECT idx FROM staged WHERE seq=?", (seq,)).fetchone()
                ix = np.frombuffer(idx, "<i8")
                found = StagedIndex(int(seq), ix[:k], ix[k:])
                with self._lock:
                    if len(self._cache) >= self.limit:
                        self._cache.clear()
                    self._cache[key] = found
            out.append(found)
        return out


def _blob_slice(con: sqlite3.Connection, column: str, seq: int, a: int, b: int) -> bytes:
    """Readings ``[a, b)`` of one staged column, without loading the whole blob."""
    with con.blobopen("staged", column, seq, readonly=True) as blob:
        blob.seek(a * 8)
        return blob.read((b - a) * 8)


def read_pieces(
    con: sqlite3.Connection,
    sid: int,
    max_span: int,
    start_ns: int,
    end_ns: int,
    staged: Sequence[StagedIndex],
) -> list[Piece]:
    """Every stored piece of one sensor in ``[start, end)``; call inside a read transaction."""
    pieces = []
    for seq, enc, tb, vb in con.execute(
        "SELECT seq, enc, ts, vs FROM chunks WHERE sid=? AND t0 < ? AND t0 >= ? AND t1 >= ?",
        (sid, end_ns, max(start_ns - max_span, _MIN_I64), start_ns),
    ):
        t, v = chunks.decode(tb, vb, enc)
        p = chunks.clip(t, v, start_ns, end_ns)
        p.seq = int(seq)
        pieces.append(p)
    for st in staged:
        i = int(np.searchsorted(st.sids, sid))
        if i == st.sids.shape[0] or int(st.sids[i]) != sid:
            continue
        a, b = int(st.offsets[i]), int(st.offsets[i + 1])
        t = np.frombuffer(_blob_slice(con, "ts", st.seq, a, b), "<i8")
        v = np.frombuffer(_blob_slice(con, "vs", st.seq, a, b), "<f8")
        inside = (t >= start_ns) & (t < end_ns)
        if not bool(inside.all()):
            t, v = t[inside], v[inside]
        clean = t.shape[0] < 2 or bool(np.all(t[1:] > t[:-1]))
        pieces.append(Piece(st.seq, t, v, clean))
    return pieces


def newest_ts(
    con: sqlite3.Connection, sid: int, max_span: int, staged: Sequence[StagedIndex]
) -> int | None:
    """The largest stored timestamp of one sensor (read transaction)."""
    best: int | None = None
    row = con.execute("SELECT MAX(t0) FROM chunks WHERE sid=?", (sid,)).fetchone()
    if row[0] is not None:
        best = con.execute(
            "SELECT MAX(t1) FROM chunks WHERE sid=? AND t0 >= ?",
            (sid, max(int(row[0]) - max_span, _MIN_I64)),
        ).fetchone()[0]
    for st in staged:
        i = int(np.searchsorted(st.sids, sid))
        if i < st.sids.shape[0] and int(st.sids[i]) == sid:
            a, b = int(st.offsets[i]), int(st.offsets[i + 1])
            m = int(np.frombuffer(_blob_slice(con, "ts", st.seq, a, b), "<i8").max())
            best = m if best is None else max(best, m)
    return None if best is None else int(best)


def modified_since(
    con: sqlite3.Connection, wanted: dict[int, str], since_ns: int
) -> dict[str, int]:
    """Earliest reading written after wall-clock ``since_ns``, per wanted sensor id."""
    ids = np.array(sorted(wanted), dtype=np.int64)
    best: dict[int, int] = {}
    for base, sids_blob, late_blob in con.execute(
        "SELECT base_min, sids, late FROM writes WHERE written_at > ?", (since_ns,)
    ):
        present = ids[np.isin(ids, unpack_ids(sids_blob), assume_unique=True)]
        if present.shape[0] == 0:
            continue
        late = np.frombuffer(zlib.decompress(late_blob), "<i8").reshape(-1, 2)
        late_map = dict(zip(late[:, 0].tolist(), late[:, 1].tolist(), strict=True))
        for sid in present.tolist():
            m = late_map.get(sid, int(base))
            if sid not in best or m < best[sid]:
                best[sid] = m
    return {wanted[s]: m for s, m in best.items()}
