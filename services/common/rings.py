"""The recent readings of many sensors, written a whole batch at a time.

Each sensor has a ring of its last up to ``cap`` readings. The rings live in a
few 2-D arrays, one per capacity (16, 32, ... up to ``cap`` points), one column
per sensor: a sensor starts small and moves to the next capacity when it fills
up, so a sparse sensor costs little. Writing a batch of many sensors is a
handful of numpy calls (group by sensor, move the sensors that outgrow their
capacity, one scatter per capacity in use) plus one dictionary lookup per
series, done in C; there is no Python loop per reading or per sensor. With the
compiled core (services/common/csrc/rings.c) a batch is one pass in C instead,
with the same result (the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from services.common import native
from services.common.readings import Float64Array, Int64Array

FIRST_POINTS = 16
_PRESIZE_BYTES = 1 << 30
"""Address space one capacity class may reserve ahead for sensors not yet in it."""
_EMPTY_TS: Int64Array = np.empty(0, np.int64)
_EMPTY_VS: Float64Array = np.empty(0, np.float64)


class _Class:
    """The rings of one capacity: one column per sensor.

    Column-major on purpose: sensors sampled together sit at the same ring
    position, so a batch of them writes one row, sequentially in memory.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.ts: Int64Array = np.zeros((cap, 0), np.int64)
        self.vs: Float64Array = np.zeros((cap, 0), np.float64)
        self.used = 0
        self.free: Int64Array = np.zeros(0, np.int64)
        """Columns given back (sensors that moved on or were forgotten)."""

    def give_back(self, cols: Int64Array) -> None:
        self.free = np.concatenate((self.free, cols)) if self.free.shape[0] else cols

    def take_rows(self, n: int, sensors: int = 0) -> Int64Array:
        """``n`` free columns; ``sensors`` (all the rings hold) sizes a growth: every sensor
        may come to this capacity, and columns never written cost no memory (a row's
        tail is never touched), while each reallocation copies what is there (halves the
        cache's CPU per reading when 10k sensors fill up together). The address space
        reserved so is bounded (:data:`_PRESIZE_BYTES`); past it the class doubles."""
        got, self.free = self.free[:n], self.free[n:]
        fresh = n - got.shape[0]
        if self.used + fresh > self.ts.shape[1]:
            ahead = min(sensors, _PRESIZE_BYTES // (16 * self.cap))
            cols = max(self.used + fresh, 2 * self.ts.shape[1], 64, ahead)
            ts = np.zeros((self.cap, cols), np.int64)
            vs = np.zeros((self.cap, cols), np.float64)
            ts[:, : self.used], vs[:, : self.used] = (
                self.ts[:, : self.used],
                self.vs[:, : self.used],
            )
            self.ts, self.vs = ts, vs
        out = got if not fresh else np.concatenate((got, np.arange(self.used, self.used + fresh)))
        self.used += fresh
        return out


class Rings:
    """Rings of the last ``cap`` readings of each sensor (see the module docstring)."""

    def __init__(self, cap: int, compiled: bool = True) -> None:
        self.cap = cap
        self._core = native.module() if compiled else None
        """The compiled ring writes (csrc/rings.c), or None: the numpy code below."""
        self._scratch = np.zeros(0, np.int32)
        caps = [FIRST_POINTS]
        while caps[-1] < cap:
            caps.append(caps[-1] * 2)
        caps[-1] = cap
        self._classes = [_Class(c) for c in caps if c <= cap] or [_Class(cap)]
        self._caps = np.array([c.cap for c in self._classes], np.int64)
        self.ids: dict[str, int] = {}
        self._free_ids: list[int] = []
        self._cls = np.zeros(0, np.int64)
        self._row = np.zeros(0, np.int64)
        self._pos = np.zeros(0, np.int64)
        self._n = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    # ------------------------------------------------------------------ writing
    def put(
        self, names: Sequence[str], counts: Int64Array | None, ts: Int64Array, vs: Float64Array
    ) -> None:
        """Readings of series ``names`` (``counts[i]`` readings each; None: one each), in
        arrival order; a sensor may come more than once."""
        if ts.shape[0] == 0:
            return
        ids = self._ids_of(names)
        per = ids if counts is None else np.repeat(ids, counts)
        if self._core is not None:
            self._put_compiled(self._core, per, ts, vs)
            return
        order = np.argsort(per, kind="stable")  # stable: arrival order within a sensor
        per, ts, vs = per[order], ts[order], vs[order]
        first = np.flatnonzero(np.concatenate(([True], per[1:] != per[:-1])))
        if first.shape[0] == per.shape[0]:  # every sensor once
            gid, gk = per, np.ones(per.shape[0], np.int64)
            group, rank = None, None
        else:
            gid = per[first]
            gk = np.diff(np.append(first, per.shape[0]))
            group = np.repeat(np.arange(gid.shape[0]), gk)
            rank = np.arange(per.shape[0]) - first[group]
        self._grow(gid, gk)
        cls = self._cls[per]
        lo, hi = int(cls.min()), int(cls.max())
        for c in [lo] if lo == hi else np.unique(cls).tolist():
            ring = self._classes[c]
            sel = None if lo == hi else np.flatnonzero(cls == c)
            if rank is not None and group is not None:
                r = rank if sel is None else rank[sel]
                if int(gk.max()) > ring.cap:
                    # a sensor given more readings than its ring holds keeps the newest
                    keep = r >= gk[group if sel is None else group[sel]] - ring.cap
                    sel = np.flatnonzero(keep) if sel is None else sel[keep]
                    r = r[keep]
            p = per if sel is None else per[sel]
            slot = self._pos[p] if rank is None else self._pos[p] + r
            flat = (slot % ring.cap) * ring.ts.shape[1] + self._row[p]
            ring.ts.reshape(-1)[flat] = ts if sel is None else ts[sel]
            ring.vs.reshape(-1)[flat] = vs if sel is None else vs[sel]
        caps = self._caps[self._cls[gid]]
        self._pos[gid] = (self._pos[gid] + gk) % caps
        self._n[gid] = np.minimum(self._n[gid] + gk, caps)

    def _put_compiled(
        self, core: ModuleType, per: Int64Array, ts: Int64Array, vs: Float64Array
    ) -> None:
        """:meth:`put` by the compiled core: the same slots, positions and counts."""
        if self._scratch.shape[0] < self._n.shape[0]:
            self._scratch = np.zeros(self._n.shape[0], np.int32)
        got, counts = core.ring_growth(per, self._n, self._cls, self._caps, self.cap, self._scratch)
        if got:
            gid = np.frombuffer(got, np.int64)
            order = np.argsort(gid)  # as np.unique gives them to the numpy code
            self._grow(gid[order], np.frombuffer(counts, np.int64)[order])
        core.ring_put(
            np.ascontiguousarray(per, np.int64),
            np.ascontiguousarray(ts, np.int64),
            np.ascontiguousarray(vs, np.float64),
            self._cls,
            self._row,
            self._pos,
            self._n,
            self._caps,
            [c.ts for c in self._classes],
            [c.vs for c in self._classes],
        )

    def _ids_of(self, names: Sequence[str]) -> Int64Array:
        if self._core is not None and isinstance(names, list):
            out = np.empty(len(names), np.int64)
            if self._core.ring_ids(self.ids, names, out) == len(names):
                return out
        else:
            try:
                return np.fromiter(map(self.ids.__getitem__, names), np.int64, len(names))
            except KeyError:
                pass
        new = [n for n in dict.fromkeys(names) if n not in self.ids]
        ids = [self._free_ids.pop() if self._free_ids else -1 for _ in new]
        fresh = ids.count(-1)
        base = self._n.shape[0]
        if fresh:
            grow = base + fresh
            for attr in ("_cls", "_row", "_pos", "_n"):
                arr = np.zeros(grow, np.int64)
                arr[:base] = getattr(self, attr)
                setattr(self, attr, arr)
        it = iter(range(base, base + fresh))
        ids = [i if i >= 0 else next(it) for i in ids]
        arr = np.array(ids, np.int64)
        self._cls[arr] = 0
        self._row[arr] = self._classes[0].take_rows(len(ids), len(self.ids) + len(ids))
        self._pos[arr] = 0
        self._n[arr] = 0
        self.ids.update(zip(new, ids, strict=True))
        return np.fromiter(map(self.ids.__getitem__, names), np.int64, len(names))

    def _grow(self, gid: Int64Array, gk: Int64Array) -> None:
        """Move sensors whose readings would overflow a ring smaller than ``cap``."""
        need = np.minimum(self._n[gid] + gk, self.cap)
        small = need > self._caps[self._cls[gid]]
        if not small.any():
            return
        ids, need = gid[small], need[small]
        target = np.searchsorted(self._caps, need)
        for src, dst in set(zip(self._cls[ids].tolist(), target.tolist(), strict=True)):
            move = ids[(self._cls[ids] == src) & (target == dst)]
            a, b = self._classes[src], self._classes[dst]
            n, pos = self._n[move], self._pos[move]
            col = ((pos - n)[:, None] + np.arange(a.cap)) % a.cap  # oldest first
            rows = self._row[move]
            new_rows = b.take_rows(move.shape[0], len(self.ids))
            b.ts[: a.cap, new_rows] = a.ts[col, rows[:, None]].T
            b.vs[: a.cap, new_rows] = a.vs[col, rows[:, None]].T
            a.give_back(rows)
            self._cls[move], self._row[move], self._pos[move] = dst, new_rows, n

    # ------------------------------------------------------------------ reading
    def forget(self, name: str) -> None:
        i = self.ids.pop(name, None)
        if i is not None:
            self._classes[int(self._cls[i])].give_back(self._row[i : i + 1].copy())
            self._n[i] = 0
            self._free_ids.append(i)

    def ordered(self, name: str) -> tuple[Int64Array, Float64Array]:
        i = self.ids.get(name)
        if i is None or self._n[i] == 0:
            return _EMPTY_TS, _EMPTY_VS
        ring = self._classes[int(self._cls[i])]
        n, pos, row = int(self._n[i]), int(self._pos[i]), int(self._row[i])
        start = (pos - n) % ring.cap
        if start + n <= ring.cap:
            return ring.ts[start : start + n, row].copy(), ring.vs[start : start + n, row].copy()
        at = (start + np.arange(n)) % ring.cap
        return ring.ts[at, row], ring.vs[at, row]

    def latest(self, name: str) -> tuple[int, float] | None:
        i = self.ids.get(name)
        if i is None or self._n[i] == 0:
            return None
        ring = self._classes[int(self._cls[i])]
        at = (int(self._pos[i]) - 1) % ring.cap
        row = int(self._row[i])
        return int(ring.ts[at, row]), float(ring.vs[at, row])
