"""Byte strings to dense ids for many strings at once, exactly, without a Python loop.

The fast line-protocol parser names readings by looking up each line's series
key (measurement and tags) and each field's key here. A string is handed over
as a row of little-endian 64-bit words (its bytes, zero beyond its length) and
its length. Strings of the same number of words live in one sub-table; a lookup
hashes the rows with a few vector operations, finds a candidate by binary
search in a sorted hash index and compares the candidate's stored words with
the row. So a hash collision can only cost speed, never name a reading wrongly:
a row whose hash belongs to another string is unknown, and :meth:`SpanTable.insert`
refuses it (the caller parses that line the slow way).

The index is a bucketed hash table in numpy arrays (see :class:`_Width`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_FOLD = np.uint64(32)
_EMPTY_H = np.zeros(0, np.uint64)
_EMPTY_I = np.zeros(0, np.int64)


def _gather(a: U64, at: I64) -> U64:
    """``a[at]`` for a 2-D array: rows fetched as single fixed-size items (3x faster)."""
    width = a.shape[1] * a.itemsize
    flat = np.ascontiguousarray(a).view(f"S{width}").reshape(-1)
    return flat[at].view(a.dtype).reshape(-1, a.shape[1])


class _Width:
    """The strings of one word count: their words, global ids and hash index.

    The index is a bucketed hash table (4 ways per bucket, about one string per
    bucket, grown by doubling): a lookup reads one bucket per row. The few
    strings that find their bucket full go to a small sorted stash.
    """

    WAYS = 4

    def __init__(self, words: int) -> None:
        self.words = words
        self._rows = np.zeros((1024, words), np.uint64)
        self._lens = np.zeros(1024, np.int64)
        self._ids = np.zeros(1024, np.int64)
        self._hashes = np.zeros(1024, np.uint64)
        self.size = 0
        self._bits = 8
        self._table = np.zeros((1 << self._bits, 2 * self.WAYS), np.uint64)
        """Per bucket: the hashes of its ways, then their local rows (0: empty)."""
        self._stash: tuple[U64, I64] = (_EMPTY_H, _EMPTY_I)

    def ids(self, local: I64) -> I64:
        return self._ids[local]

    def candidates(self, h: U64) -> I64:
        """Local row of each hash, -1 if absent."""
        bucket = _gather(self._table, (h >> np.uint64(64 - self._bits)).astype(np.int64))
        local = np.full(h.shape[0], -1, np.int64)
        for way in range(self.WAYS):
            local = np.where(bucket[:, way] == h, bucket[:, self.WAYS + way].view(np.int64), local)
        if self._stash[0].shape[0]:
            miss = np.flatnonzero(local < 0)
            if miss.shape[0]:
                sh, sr = self._stash
                pos = np.minimum(np.searchsorted(sh, h[miss]), sh.shape[0] - 1)
                local[miss] = np.where(sh[pos] == h[miss], sr[pos], -1)
        return local

    def same(self, local: I64, rows: U64, lens: I64) -> Mask:
        """Whether each row equals its candidate's stored string (-1: no)."""
        at = np.maximum(local, 0)
        diff = _gather(self._rows, at) ^ rows
        acc = diff[:, 0].copy()
        for j in range(1, rows.shape[1]):
            acc |= diff[:, j]
        return (acc == 0) & (local >= 0) & (self._lens[at] == lens)  # type: ignore[no-any-return]

    def add(self, h: U64, rows: U64, lens: I64, ids: I64) -> None:
        n = h.shape[0]
        end = self.size + n
        if end > self._lens.shape[0]:
            cap = max(end, 2 * self._lens.shape[0])
            for name in ("_rows", "_lens", "_ids", "_hashes"):
                old = getattr(self, name)
                new = np.zeros((cap, *old.shape[1:]), old.dtype)
                new[: self.size] = old[: self.size]
                setattr(self, name, new)
        self._rows[self.size : end] = rows
        self._lens[self.size : end] = lens
        self._ids[self.size : end] = ids
        self._hashes[self.size : end] = h
        local = np.arange(self.size, end, dtype=np.int64)
        self.size = end
        if end > (1 << self._bits):  # about one string per bucket at most
            while end > (1 << self._bits):
                self._bits += 1
            self._table = np.zeros((1 << self._bits, 2 * self.WAYS), np.uint64)
            self._stash = (_EMPTY_H, _EMPTY_I)
            h, local = self._hashes[:end], np.arange(end, dtype=np.int64)
        self._place(h, local)

    def _place(self, h: U64, local: I64) -> None:
        b = (h >> np.uint64(64 - self._bits)).astype(np.int64)
        order = np.argsort(b, kind="stable")
        b, h, local = b[order], h[order], local[order]
        rank = np.arange(b.shape[0]) - np.searchsorted(b, b)
        way = (self._table[b, : self.WAYS] != 0).sum(axis=1) + rank
        fits = way < self.WAYS
        self._table[b[fits], way[fits]] = h[fits]
        self._table[b[fits], self.WAYS + way[fits]] = local[fits].astype(np.uint64)
        if not fits.all():
            sh = np.concatenate((self._stash[0], h[~fits]))
            sr = np.concatenate((self._stash[1], local[~fits]))
            o = np.argsort(sh, kind="stable")
            self._stash = (sh[o], sr[o])


class SpanTable:
    """Exact (words, length) rows -> ids 0, 1, 2, ... in insertion order."""

    def __init__(self, seed: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        odd = np.uint64(1)
        self._mul = rng.integers(1, 2**63, (2, 65), dtype=np.uint64) * np.uint64(2) + odd
        self.clear()

    def clear(self) -> None:
        self._widths: dict[int, _Width] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _hash(self, rows: U64, lens: I64) -> U64:
        """Each word scrambled on its own first (so that strings differing in one high
        byte do not collide), then combined; seeded per process."""
        a, b = self._mul
        w = rows.shape[1]
        x = rows * a[:w]
        x ^= x >> _FOLD
        h = x @ b[:w] + lens.astype(np.uint64) * a[-1]
        h ^= h >> _FOLD
        h |= np.uint64(1)  # 0 marks an empty way
        return h  # type: ignore[no-any-return]

    def find(self, rows: U64, lens: I64) -> I64:
        """The id of each row, -1 for a row not in the table. All rows have as many words
        as their longest needs (``rows.shape[1] == ceil(lens.max() / 8)`` or more)."""
        out = np.full(lens.shape[0], -1, np.int64)
        for words, pick in self._groups(lens):
            table = self._widths.get(words)
            if table is None:
                continue
            r, n = (rows[:, :words], lens) if pick is None else (rows[pick, :words], lens[pick])
            local = table.candidates(self._hash(r, n))
            hit = table.same(local, r, n)
            if pick is None:
                out[hit] = table.ids(local[hit])
            else:
                out[pick[hit]] = table.ids(local[hit])
        return out

    def insert(self, rows: U64, lens: I64) -> I64:
        """Ids for rows ``find`` did not know (equal rows share one new id); -1 for a row
        whose hash another string holds."""
        out = np.full(lens.shape[0], -1, np.int64)
        for words, pick in self._groups(lens):
            table = self._widths.setdefault(words, _Width(words))
            r, n = (rows[:, :words], lens) if pick is None else (rows[pick, :words], lens[pick])
            h = self._hash(r, n)
            uniq, first, inverse = np.unique(h, return_index=True, return_inverse=True)
            fresh = table.candidates(uniq) < 0
            ids = np.full(uniq.shape[0], -1, np.int64)
            ids[fresh] = self._size + np.arange(int(fresh.sum()), dtype=np.int64)
            self._size += int(fresh.sum())
            reps = first[fresh]
            table.add(uniq[fresh], r[reps], n[reps], ids[fresh])
            got = ids[inverse]
            # a row that shares its hash with another row of this batch but not its bytes
            same = np.ones(got.shape[0], bool)
            rep_rows = r[first[inverse]]
            for j in range(words):
                same &= rep_rows[:, j] == r[:, j]
            same &= n[first[inverse]] == n
            out[slice(None) if pick is None else pick] = np.where(same, got, -1)
        return out

    @staticmethod
    def _groups(lens: I64) -> list[tuple[int, I64 | None]]:
        """(word count, rows) of each group of rows; rows None: all of them."""
        words = (lens + 7) // 8
        if words.shape[0] == 0:
            return []
        lo, hi = int(words.min()), int(words.max())
        if lo == hi:
            return [(max(lo, 1), None)]
        return [(max(w, 1), np.flatnonzero(words == w)) for w in np.unique(words).tolist()]
