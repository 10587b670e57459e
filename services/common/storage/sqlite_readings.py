"""Readings in the SQLite file: staging writes, compacting them into chunks, reading.

A write is one ``staged`` row (the batch, sorted by sensor id), whatever the
number of sensors in it: that is what makes wide batches cheap. Compaction
moves staged rows into per-sensor chunks, LSM style: each compaction adds one
small open chunk (level 0) per sensor; when ``FANOUT`` chunks of one level
pile up at the top of a sensor's stack they merge into one of the next level;
once a sensor's open chunks hold ``SEAL_POINTS`` readings they are merged and
sealed (compressed). Every reading is rewritten a few times (log_FANOUT) and
compressed once.

Last write wins across all of this through ``seq`` (the staged row id, which
only grows): a merge only ever combines a contiguous run of a sensor's newest
chunks, so conflicting timestamps are always resolved in write order.

Every function takes the connection it works on; the writer-side caches
(sensor ids, open-chunk stacks) are validated against ``meta_kv['layout']``,
which every change of open chunks bumps, so several writers (processes) on
one file stay correct.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.readings import Batch, Float64Array, Int64Array
from services.common.storage import chunks
from services.common.storage.chunks import Piece
from services.common.storage.sqlite_schema import SEAL_POINTS, SEALED

FANOUT = 8
"""Open chunks of one level that merge into one of the next level."""
LATE_NS = 10_000_000_000
"""``modified_since`` resolution: sensors of a write whose earliest reading is
within this of the write's newest per-sensor minimum share one minimum."""
_MIN_I64 = -(2**63)


@dataclass(slots=True)
class OpenChunk:
    seq: int
    level: int
    n: int


@dataclass(slots=True)
class StagedIndex:
    """Which sensors a staged row holds and where (loaded once per read snapshot)."""

    seq: int
    sids: Int64Array
    offsets: Int64Array


def pack_ids(ids: Int64Array) -> bytes:
    """Sorted ids, delta-encoded and compressed (consecutive ids cost almost nothing)."""
    return zlib.compress(np.diff(ids, prepend=0).astype("<i8").tobytes(), 1)


def unpack_ids(blob: bytes) -> Int64Array:
    return np.cumsum(np.frombuffer(zlib.decompress(blob), "<i8"), dtype=np.int64)


class ChunkStore:
    """Writer-side state and the readings operations of one backend instance."""

    def __init__(self, seal_points: int = SEAL_POINTS, fanout: int = FANOUT) -> None:
        self.seal_points = seal_points
        self.fanout = fanout
        self._sids: dict[str, int] = {}
        self._stacks: dict[int, list[OpenChunk]] = {}
        self._spans: dict[int, int] = {}
        self._layout = -1

    # ------------------------------------------------------------------ sensor ids
    def sensor_ids(self, con: sqlite3.Connection, names: Sequence[str]) -> Int64Array:
        """Ids for ``names`` (creating missing sensors); call inside a write transaction.

        Created ids are cached only once the caller commits (:meth:`forget_uncommitted`).
        """
        cache = self._sids
        missing = [n for n in dict.fromkeys(names) if n not in cache]
        self._pending: list[str] = []
        for name in missing:
            row = con.execute("SELECT id FROM sensors WHERE name=?", (name,)).fetchone()
            if row is None:
                row = con.execute(
                    "INSERT INTO sensors(name) VALUES (?) RETURNING id", (name,)
                ).fetchone()
                self._pending.append(name)
            cache[name] = int(row[0])
        return np.fromiter((cache[n] for n in names), np.int64, len(names))

    def forget_uncommitted(self) -> None:
        """The transaction rolled back: ids it created no longer exist."""
        for name in getattr(self, "_pending", []):
            self._sids.pop(name, None)
        self._pending = []
        self._layout = -1

    def sensor_id(self, con: sqlite3.Connection, name: str) -> tuple[int, int] | None:
        """(id, max_span) of an existing sensor, read from the file (not cached)."""
        row = con.execute("SELECT id, max_span FROM sensors WHERE name=?", (name,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    # ------------------------------------------------------------------ staging
    def stage(self, con: sqlite3.Connection, batch: Batch, sids: Int64Array, now_ns: int) -> None:
        """Append ``batch`` (sensor ids per series in ``sids``) as one staged row."""
        per = np.repeat(sids, batch.counts)
        ts, vs = batch.timestamps_ns, batch.values
        if per.shape[0] > 1 and not bool(np.all(per[1:] >= per[:-1])):
            order = np.argsort(per, kind="stable")
            per, ts, vs = per[order], ts[order], vs[order]
        starts = np.flatnonzero(np.concatenate(([True], per[1:] != per[:-1])))
        uniq = per[starts]
        offsets = np.append(starts, per.shape[0])
        idx = np.concatenate([uniq, offsets]).astype("<i8").tobytes()
        cur = con.execute(
            "INSERT INTO staged (written_at, n, k, min_ts, max_ts, idx, ts, vs) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                now_ns,
                int(per.shape[0]),
                int(uniq.shape[0]),
                int(ts.min()),
                int(ts.max()),
                idx,
                np.ascontiguousarray(ts, "<i8").tobytes(),
                np.ascontiguousarray(vs, "<f8").tobytes(),
            ),
        )
        mins = np.minimum.reduceat(ts, starts)
        late = mins < int(mins.max()) - LATE_NS
        base = int(mins[~late].min())
        late_pairs = np.stack([uniq[late], mins[late]], axis=1).astype("<i8").tobytes()
        con.execute(
            "INSERT INTO writes VALUES (?,?,?,?,?)",
            (cur.lastrowid, now_ns, base, pack_ids(uniq), zlib.compress(late_pairs, 1)),
        )

    @staticmethod
    def staged_totals(con: sqlite3.Connection) -> tuple[int, int]:
        """(staged rows, staged readings)."""
        rows, n = con.execute("SELECT COUNT(*), COALESCE(SUM(n), 0) FROM staged").fetchone()
        return int(rows), int(n)

    # ------------------------------------------------------------------ compaction
    def _load_layout(self, con: sqlite3.Connection) -> None:
        row = con.execute("SELECT value FROM meta_kv WHERE key='layout'").fetchone()
        layout = int(row[0]) if row else 0
        if layout == self._layout:
            return
        self._stacks = {}
        for sid, seq, level, n in con.execute(
            "SELECT sid, seq, level, n FROM chunks WHERE level >= 0 ORDER BY sid, seq"
        ):
            self._stacks.setdefault(sid, []).append(OpenChunk(seq, level, n))
        self._spans = dict(con.execute("SELECT id, max_span FROM sensors").fetchall())
        self._layout = layout

    def bump_layout(self, con: sqlite3.Connection, cache_updated: bool = False) -> None:
        """Record that open chunks changed; call inside the transaction that changed them.

        ``cache_updated``: the caller applied the same change to the cached stacks.
        """
        row = con.execute(
            "INSERT INTO meta_kv VALUES ('layout', '1') ON CONFLICT(key) DO UPDATE "
            "SET value = CAST(value AS INTEGER) + 1 RETURNING value"
        ).fetchone()
        new = int(row[0])
        self._layout = new if cache_updated and self._layout == new - 1 else -1

    def compact(self, con: sqlite3.Connection) -> int:
        """Move every staged reading into chunks; call inside a write transaction.

        Returns the number of staged readings moved.
        """
        rows = con.execute("SELECT seq, idx, ts, vs, k FROM staged ORDER BY seq").fetchall()
        if not rows:
            return 0
        self._load_layout(con)
        keys, ts_parts, vs_parts = [], [], []
        for _seq, idx, tb, vb, k in rows:
            ix = np.frombuffer(idx, "<i8")
            keys.append(np.repeat(ix[:k], np.diff(ix[k:])))
            ts_parts.append(np.frombuffer(tb, "<i8"))
            vs_parts.append(np.frombuffer(vb, "<f8"))
        seq = int(rows[-1][0])
        uk, off, ts, vs = chunks.group_by_key(
            np.concatenate(keys), np.concatenate(ts_parts), np.concatenate(vs_parts)
        )
        new_l0: list[tuple[int, int, int, int, int, int, int, bytes, bytes]] = []
        spans: list[tuple[int, int]] = []
        for i, sid in enumerate(uk.tolist()):
            a, b = int(off[i]), int(off[i + 1])
            self._add(con, sid, ts[a:b], vs[a:b], seq, new_l0, spans)
        con.executemany(
            "INSERT INTO chunks (sid, t0, t1, n, seq, level, enc, ts, vs) VALUES (?,?,?,?,?,?,?,?,?)",
            new_l0,
        )
        if spans:
            con.executemany("UPDATE sensors SET max_span=max(max_span, ?) WHERE id=?", spans)
        con.execute("DELETE FROM staged WHERE seq <= ?", (seq,))
        self.bump_layout(con, cache_updated=True)
        return int(off[-1])

    def _add(
        self,
        con: sqlite3.Connection,
        sid: int,
        ts: Int64Array,
        vs: Float64Array,
        seq: int,
        new_l0: list[tuple[int, int, int, int, int, int, int, bytes, bytes]],
        spans: list[tuple[int, int]],
    ) -> None:
        stack = self._stacks.setdefault(sid, [])
        if sum(c.n for c in stack) + ts.shape[0] >= self.seal_points:
            self._seal(con, sid, stack, ts, vs, seq, spans)
            return
        new_l0.append(self._row(sid, ts, vs, seq, 0, chunks.RAW, spans))
        stack.append(OpenChunk(seq, 0, int(ts.shape[0])))
        level = 0
        while len(stack) >= self.fanout and all(c.level == level for c in stack[-self.fanout :]):
            run = stack[-self.fanout :]
            if level == 0:  # the new level-0 chunk is not inserted yet: merge it in memory
                pieces = [*self._load(con, sid, run[0].seq), Piece(seq, ts, vs, True)]
                new_l0.pop()
            else:
                pieces = self._load(con, sid, run[0].seq)
            mt, mv = chunks.merge(pieces)
            con.execute(
                "DELETE FROM chunks WHERE sid=? AND level >= 0 AND seq >= ?", (sid, run[0].seq)
            )
            level += 1
            con.execute(
                "INSERT INTO chunks (sid, t0, t1, n, seq, level, enc, ts, vs) VALUES (?,?,?,?,?,?,?,?,?)",
                self._row(sid, mt, mv, run[-1].seq, level, chunks.RAW, spans),
            )
            del stack[-self.fanout :]
            stack.append(OpenChunk(run[-1].seq, level, int(mt.shape[0])))

    def _seal(
        self,
        con: sqlite3.Connection,
        sid: int,
        stack: list[OpenChunk],
        ts: Int64Array,
        vs: Float64Array,
        seq: int,
        spans: list[tuple[int, int]],
    ) -> None:
        """Merge every open chunk of ``sid`` with new readings into sealed chunks."""
        pieces = [Piece(seq, ts, vs, True)]
        if stack:
            pieces = [*self._load(con, sid, stack[0].seq), *pieces]
            con.execute("DELETE FROM chunks WHERE sid=? AND level >= 0", (sid,))
        mt, mv = chunks.merge(pieces)
        stack.clear()
        full = mt.shape[0] // self.seal_points * self.seal_points
        rows = [
            self._row(
                sid,
                mt[a : a + self.seal_points],
                mv[a : a + self.seal_points],
                seq,
                SEALED,
                chunks.ZLIB,
                spans,
            )
            for a in range(0, full, self.seal_points)
        ]
        if full < mt.shape[0]:  # the remainder stays open, to be filled by later writes
            rows.append(self._row(sid, mt[full:], mv[full:], seq, 0, chunks.RAW, spans))
            stack.append(OpenChunk(seq, 0, int(mt.shape[0] - full)))
        con.executemany(
            "INSERT INTO chunks (sid, t0, t1, n, seq, level, enc, ts, vs) VALUES (?,?,?,?,?,?,?,?,?)",
            rows,
        )

    def _row(
        self,
        sid: int,
        ts: Int64Array,
        vs: Float64Array,
        seq: int,
        level: int,
        enc: int,
        spans: list[tuple[int, int]],
    ) -> tuple[int, int, int, int, int, int, int, bytes, bytes]:
        t0, t1 = int(ts[0]), int(ts[-1])
        if t1 - t0 > self._spans.get(sid, 0):
            self._spans[sid] = t1 - t0
            spans.append((t1 - t0, sid))
        tb, vb = chunks.encode(ts, vs, enc)
        return (sid, t0, t1, int(ts.shape[0]), seq, level, enc, tb, vb)

    @staticmethod
    def _load(con: sqlite3.Connection, sid: int, from_seq: int) -> list[Piece]:
        """Open chunks of ``sid`` with ``seq >= from_seq``, oldest first."""
        out = []
        for s, enc, tb, vb in con.execute(
            "SELECT seq, enc, ts, vs FROM chunks WHERE sid=? AND level >= 0 AND seq >= ? "
            "ORDER BY seq",
            (sid, from_seq),
        ):
            t, v = chunks.decode(tb, vb, enc)
            out.append(Piece(s, t, v, True))
        return out

    # ------------------------------------------------------------------ deleting
    def delete(
        self, con: sqlite3.Connection, sid: int, max_span: int, start_ns: int, end_ns: int
    ) -> int:
        """Remove stored points of ``sid`` in ``[start, end)`` from chunks (compact first).

        Returns the points removed (a timestamp overwritten before compaction
        merged both versions counts once per stored version).
        """
        removed = 0
        changed = False
        for cid, t0, t1, n, level, enc, tb, vb in con.execute(
            "SELECT id, t0, t1, n, level, enc, ts, vs FROM chunks "
            "WHERE sid=? AND t0 < ? AND t0 >= ? AND t1 >= ?",
            (sid, end_ns, max(start_ns - max_span, _MIN_I64), start_ns),
        ).fetchall():
            changed |= level >= 0
            if t0 >= start_ns and t1 < end_ns:
                con.execute("DELETE FROM chunks WHERE id=?", (cid,))
                removed += n
                continue
            t, v = chunks.decode(tb, vb, enc)
            keep = (t < start_ns) | (t >= end_ns)
            kept = int(np.count_nonzero(keep))
            removed += n - kept
            if kept == 0:
                con.execute("DELETE FROM chunks WHERE id=?", (cid,))
            elif kept < n:
                t, v = t[keep], v[keep]
                nt, nv = chunks.encode(t, v, enc)
                con.execute(
                    "UPDATE chunks SET t0=?, t1=?, n=?, ts=?, vs=? WHERE id=?",
                    (int(t[0]), int(t[-1]), kept, nt, nv, cid),
                )
        if changed:
            self.bump_layout(con)
        return removed


# ---------------------------------------------------------------------- reading
def staged_index(con: sqlite3.Connection, start_ns: int, end_ns: int) -> list[StagedIndex]:
    """Index of the staged rows that may hold readings in ``[start, end)``."""
    out = []
    for seq, k, idx in con.execute(
        "SELECT seq, k, idx FROM staged WHERE min_ts < ? AND max_ts >= ? ORDER BY seq",
        (end_ns, start_ns),
    ):
        ix = np.frombuffer(idx, "<i8")
        out.append(StagedIndex(int(seq), ix[:k], ix[k:]))
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


def prune_writes(con: sqlite3.Connection, cutoff_ns: int) -> None:
    """Drop the write log before ``cutoff_ns``, remembering the newest write dropped."""
    row = con.execute("SELECT MAX(written_at) FROM writes WHERE written_at < ?", (cutoff_ns,))
    newest = row.fetchone()[0]
    if newest is not None:
        con.execute("DELETE FROM writes WHERE written_at < ?", (cutoff_ns,))
        con.execute("INSERT OR REPLACE INTO meta_kv VALUES ('writes_pruned', ?)", (str(newest),))


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
