"""Writing the SQLite layout: staging batches, compacting them into chunks, deleting.

A write is one ``staged`` row (the batch, sorted by sensor id), whatever the
number of sensors in it: that is what makes wide batches cheap. Compaction
moves staged rows into per-sensor chunks, LSM style: each compaction adds one
small open chunk (level 0) per sensor; when ``FANOUT`` chunks of one level
pile up at the top of a sensor's stack they merge into one of the next level;
once a sensor's open chunks hold ``SEAL_POINTS`` readings they are merged and
sealed (compressed). Every reading is rewritten a few times (log_FANOUT) and
compressed once. One compaction costs a handful of statements whatever the
number of sensors: merge inputs are loaded by one join, outputs written by
``executemany``.

Last write wins across all of this through ``seq`` (the staged row id, which
only grows): a merge only ever combines a contiguous run of a sensor's newest
chunks, so conflicting timestamps are always resolved in write order.

The writer-side caches (sensor ids, open-chunk stacks) are validated against
``meta_kv['layout']``, which every change of open chunks bumps, so several
writers (processes) on one file stay correct.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from services.common.readings import Batch, Float64Array, Int64Array
from services.common.storage import chunks
from services.common.storage.chunks import Piece
from services.common.storage.sqlite.schema import SEAL_POINTS, SEALED

FANOUT = 16
"""Open chunks of one level that merge into one of the next level (16 measured
~1.3x faster than 8 for 10k sensors: one level fewer before sealing)."""
LATE_NS = 10_000_000_000
"""``modified_since`` resolution: sensors of a write whose earliest reading is
within this of the write's newest per-sensor minimum share one minimum."""
_MIN_I64 = -(2**63)
_MAX_I64 = 2**63 - 1

Row = tuple[int, int, int, int, int, int, int, bytes, bytes]
_INSERT = "INSERT INTO chunks (sid, t0, t1, n, seq, level, enc, ts, vs) VALUES (?,?,?,?,?,?,?,?,?)"


@dataclass(slots=True)
class OpenChunk:
    seq: int
    level: int
    n: int


@dataclass(slots=True)
class Stack:
    """A sensor's open chunks, oldest first; levels never increase towards the top."""

    chunks: list[OpenChunk] = field(default_factory=list)
    n: int = 0


@dataclass(slots=True)
class _Merge:
    """New readings of one sensor that merge with its open chunks from ``origin`` up."""

    sid: int
    origin: int
    level: int
    ts: Int64Array
    vs: Float64Array


def pack_ids(ids: Int64Array) -> bytes:
    """Sorted ids, delta-encoded and compressed (consecutive ids cost almost nothing)."""
    return zlib.compress(np.diff(ids, prepend=0).astype("<i8").tobytes(), 1)


class ChunkStore:
    """Writer-side state and operations of one backend instance (its writer thread)."""

    def __init__(self, seal_points: int = SEAL_POINTS, fanout: int = FANOUT) -> None:
        self.seal_points = seal_points
        self.fanout = fanout
        self.seal_encoding = chunks.ZLIB
        self._sids: dict[str, int] = {}
        self._pending: list[str] = []
        self._stacks: dict[int, Stack] = {}
        self._spans: dict[int, int] = {}
        self._layout = -1

    # ------------------------------------------------------------------ sensor ids
    def known(self, names: Sequence[str]) -> tuple[int, ...] | None:
        """Cached ids of ``names`` if every one is known (and so already validated)."""
        if not names:
            return ()
        try:
            got = itemgetter(*names)(self._sids)
        except KeyError:
            return None
        return got if isinstance(got, tuple) else (got,)

    def sensor_ids(self, con: sqlite3.Connection, names: Sequence[str]) -> Int64Array:
        """Ids for ``names`` (creating missing sensors); call inside a write transaction.

        Ids created here are forgotten again by :meth:`forget_uncommitted`.
        """
        ids = self.known(names)
        if ids is None:
            cache = self._sids
            for name in dict.fromkeys(n for n in names if n not in cache):
                row = con.execute("SELECT id FROM sensors WHERE name=?", (name,)).fetchone()
                if row is None:
                    row = con.execute(
                        "INSERT INTO sensors(name) VALUES (?) RETURNING id", (name,)
                    ).fetchone()
                    self._pending.append(name)
                cache[name] = int(row[0])
            ids = self.known(names)
        return np.array(ids, dtype=np.int64)

    def committed(self) -> None:
        self._pending = []

    def forget_uncommitted(self) -> None:
        """The transaction rolled back: ids it created no longer exist, caches are stale."""
        for name in self._pending:
            self._sids.pop(name, None)
        self._pending = []
        self._layout = -1

    @staticmethod
    def sensor_id(con: sqlite3.Connection, name: str) -> tuple[int, int] | None:
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
        hi = int(ts.max())
        if hi == _MAX_I64:  # the exclusive end of every range: nothing could read it back
            raise ValueError(
                f"batch rejected, nothing stored: timestamp {hi} (int64's largest) lies past "
                "the end of every [start, end) range"
            )
        cur = con.execute(
            "INSERT INTO staged (written_at, n, k, min_ts, max_ts, idx, ts, vs) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                now_ns,
                int(per.shape[0]),
                int(uniq.shape[0]),
                int(ts.min()),
                hi,
                np.concatenate([uniq, offsets]).astype("<i8").tobytes(),
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

    # ------------------------------------------------------------------ layout cache
    def _load_layout(self, con: sqlite3.Connection) -> None:
        row = con.execute("SELECT value FROM meta_kv WHERE key='layout'").fetchone()
        layout = int(row[0]) if row else 0
        if layout == self._layout:
            return
        self._stacks = {}
        for sid, seq, level, n in con.execute(
            "SELECT sid, seq, level, n FROM chunks WHERE level >= 0 ORDER BY sid, seq"
        ):
            stack = self._stacks.setdefault(sid, Stack())
            stack.chunks.append(OpenChunk(seq, level, n))
            stack.n += n
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

    # ------------------------------------------------------------------ compaction
    def compact(self, con: sqlite3.Connection) -> int:
        """Move every staged reading into chunks; call inside a write transaction.

        Returns the number of staged readings moved.
        """
        staged = con.execute("SELECT seq, idx, ts, vs, k FROM staged ORDER BY seq").fetchall()
        if not staged:
            return 0
        self._load_layout(con)
        keys, ts_parts, vs_parts = [], [], []
        for _seq, idx, tb, vb, k in staged:
            ix = np.frombuffer(idx, "<i8")
            keys.append(np.repeat(ix[:k], np.diff(ix[k:])))
            ts_parts.append(np.frombuffer(tb, "<i8"))
            vs_parts.append(np.frombuffer(vb, "<f8"))
        seq = int(staged[-1][0])
        uk, off, ts, vs = chunks.group_by_key(
            np.concatenate(keys), np.concatenate(ts_parts), np.concatenate(vs_parts)
        )
        rows: list[Row] = []
        spans: list[tuple[int, int]] = []
        merges: list[_Merge] = []
        bounds = off.tolist()
        for i, sid in enumerate(uk.tolist()):
            t, v = ts[bounds[i] : bounds[i + 1]], vs[bounds[i] : bounds[i + 1]]
            stack = self._stacks.get(sid)
            if stack is None:
                stack = self._stacks[sid] = Stack()
            plan = self._plan(stack, t.shape[0])
            if plan is None:  # the common case: one more level-0 chunk
                rows.append(self._row(sid, t, v, seq, 0, chunks.RAW, spans))
                stack.chunks.append(OpenChunk(seq, 0, t.shape[0]))
                stack.n += t.shape[0]
            else:
                merges.append(_Merge(sid, plan[0], plan[1], t, v))
        if merges:
            rows.extend(self._merge_all(con, merges, seq, spans))
        con.executemany(_INSERT, rows)
        if spans:
            con.executemany("UPDATE sensors SET max_span=max(max_span, ?) WHERE id=?", spans)
        con.execute("DELETE FROM staged WHERE seq <= ?", (seq,))
        self.bump_layout(con, cache_updated=True)
        return int(bounds[-1])

    def _plan(self, stack: Stack, n_new: int) -> tuple[int, int] | None:
        """Where new readings go: None (a new level-0 chunk), or (first open chunk to
        merge with, level of the result or SEALED)."""
        if stack.n + n_new >= self.seal_points:
            return 0, SEALED
        f = self.fanout
        levels = [c.level for c in stack.chunks]
        levels.append(0)
        origins = list(range(len(levels)))
        level = 0
        # Levels never increase towards the top, so a run of f equal levels at the
        # top is recognised by its lowest element alone.
        while len(levels) >= f and levels[-f] == level:
            start = len(levels) - f
            levels[start:] = [level + 1]
            origins[start:] = [origins[start]]
            level += 1
        return None if level == 0 else (origins[-1], level)

    def _merge_all(
        self, con: sqlite3.Connection, merges: list[_Merge], seq: int, spans: list[tuple[int, int]]
    ) -> list[Row]:
        """Merge new readings with open chunks for many sensors at once."""
        loads = [
            (m.sid, self._stacks[m.sid].chunks[m.origin].seq)
            for m in merges
            if m.origin < len(self._stacks[m.sid].chunks)
        ]
        pieces: dict[int, list[Piece]] = {}
        if loads:
            con.execute(
                "CREATE TEMP TABLE IF NOT EXISTS merge_from "
                "(sid INTEGER PRIMARY KEY, from_seq INTEGER NOT NULL)"
            )
            con.execute("DELETE FROM temp.merge_from")
            con.executemany("INSERT INTO temp.merge_from VALUES (?,?)", loads)
            # CROSS JOIN fixes the loop order: the temp table outside, the open-chunk
            # index inside (left to itself the planner scans every open chunk).
            for sid, s, enc, tb, vb in con.execute(
                "SELECT c.sid, c.seq, c.enc, c.ts, c.vs FROM temp.merge_from w CROSS JOIN chunks c "
                "ON c.sid = w.sid AND c.level >= 0 AND c.seq >= w.from_seq"
            ):
                t, v = chunks.decode(tb, vb, enc)
                pieces.setdefault(sid, []).append(Piece(s, t, v, True))
            for found in pieces.values():
                found.sort(key=lambda p: p.seq)
            con.executemany("DELETE FROM chunks WHERE sid=? AND level >= 0 AND seq >= ?", loads)
        rows: list[Row] = []
        for m in merges:
            stack = self._stacks[m.sid]
            mt, mv = chunks.merge([*pieces.get(m.sid, []), Piece(seq, m.ts, m.vs, True)])
            del stack.chunks[m.origin :]
            if m.level != SEALED:
                rows.append(self._row(m.sid, mt, mv, seq, m.level, chunks.RAW, spans))
                stack.chunks.append(OpenChunk(seq, m.level, mt.shape[0]))
            else:
                size = self.seal_points
                full = mt.shape[0] // size * size
                for a in range(0, full, size):
                    rows.append(
                        self._row(
                            m.sid,
                            mt[a : a + size],
                            mv[a : a + size],
                            seq,
                            SEALED,
                            self.seal_encoding,
                            spans,
                        )
                    )
                if full < mt.shape[0]:  # the remainder stays open, to be filled by later writes
                    rows.append(self._row(m.sid, mt[full:], mv[full:], seq, 0, chunks.RAW, spans))
                    stack.chunks.append(OpenChunk(seq, 0, mt.shape[0] - full))
            stack.n = sum(c.n for c in stack.chunks)
        return rows

    def _row(
        self,
        sid: int,
        ts: Int64Array,
        vs: Float64Array,
        seq: int,
        level: int,
        enc: int,
        spans: list[tuple[int, int]],
    ) -> Row:
        t0, t1 = int(ts[0]), int(ts[-1])
        span = min(t1 - t0, _MAX_I64)
        if span > self._spans.get(sid, 0):
            self._spans[sid] = span
            spans.append((span, sid))
        tb, vb = chunks.encode(ts, vs, enc)
        return (sid, t0, t1, int(ts.shape[0]), seq, level, enc, tb, vb)

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


def log_delete(con: sqlite3.Connection, sid: int, start_ns: int, now_ns: int) -> None:
    """Log a deletion from ``start_ns`` on as a write of ``sid`` (``modified_since``
    reports it, so virtual results computed from the deleted readings go stale).
    Deletions take negative ``seq`` values, which staged writes never have."""
    seq = con.execute("SELECT MIN(0, COALESCE(MIN(seq), 0)) - 1 FROM writes").fetchone()[0]
    con.execute(
        "INSERT INTO writes VALUES (?,?,?,?,?)",
        (seq, now_ns, start_ns, pack_ids(np.array([sid], np.int64)), zlib.compress(b"", 1)),
    )


def prune_writes(con: sqlite3.Connection, cutoff_ns: int) -> None:
    """Drop the write log before ``cutoff_ns``, remembering the newest write dropped."""
    row = con.execute("SELECT MAX(written_at) FROM writes WHERE written_at < ?", (cutoff_ns,))
    newest = row.fetchone()[0]
    if newest is not None:
        con.execute("DELETE FROM writes WHERE written_at < ?", (cutoff_ns,))
        con.execute("INSERT OR REPLACE INTO meta_kv VALUES ('writes_pruned', ?)", (str(newest),))
