"""Values the evaluator passes between nodes, every step of a query at once.

An instant vector is a matrix of ``series x steps`` with a presence mask (a NaN
sample is a value, so absence cannot be NaN); a range vector keeps each series'
samples flat with one window ``[lo, hi)`` per series and step. Labels are tuples
of ``(name, value)`` sorted by name, so series sort as Prometheus sorts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from services.common.promnames import Labels
from services.query_api.promql.ast import EvalError

F1 = npt.NDArray[np.float64]
F2 = npt.NDArray[np.float64]
I1 = npt.NDArray[np.int64]
I2 = npt.NDArray[np.int64]
B2 = npt.NDArray[np.bool_]

STALE_BITS = 0x7FF0000000000002
"""Prometheus' staleness marker: a NaN with this bit pattern ends a series."""


def is_stale(vs: F1) -> npt.NDArray[np.bool_]:
    return np.asarray(vs.view(np.uint64) == np.uint64(STALE_BITS), dtype=bool)


def seconds(ns: np.ndarray) -> np.ndarray:
    """Times in ns as float seconds, exactly as Prometheus divides its milliseconds
    (``ms / 1000``) where they are whole milliseconds."""
    ms, rest = np.divmod(ns, 1_000_000)
    out = ms.astype(np.float64) / 1000
    odd = rest != 0
    if bool(np.any(odd)):
        whole, frac = np.divmod(ns, 1_000_000_000)
        out = np.where(odd, whole.astype(np.float64) + frac.astype(np.float64) / 1e9, out)
    return out


def label(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


def drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != "__name__")


def without(labels: Labels, names: Iterable[str]) -> Labels:
    drop = set(names)
    return tuple(p for p in labels if p[0] not in drop)


def keep(labels: Labels, names: Iterable[str]) -> Labels:
    wanted = set(names)
    return tuple(p for p in labels if p[0] in wanted)


def with_label(labels: Labels, name: str, value: str) -> Labels:
    """``labels`` with ``name`` set to ``value`` (removed when ``value`` is empty)."""
    rest = [p for p in labels if p[0] != name]
    if value:
        rest.append((name, value))
    return tuple(sorted(rest))


def labels_text(labels: Labels) -> str:
    """Prometheus' ``Labels.String()``: ``{a="1", b="2"}``."""
    from services.query_api.promql.printer import go_quote

    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in labels) + "}"


@dataclass
class Scalar:
    values: F1  # (steps,)


@dataclass
class String:
    value: str


@dataclass
class Vector:
    labels: list[Labels]
    values: F2  # (series, steps)
    present: B2  # (series, steps)
    times: I2 | None = None
    """Sample timestamps (ns) where the series came straight from a selector (timestamp())."""

    @classmethod
    def empty(cls, steps: int) -> Vector:
        return cls([], np.empty((0, steps)), np.zeros((0, steps), dtype=bool))

    @property
    def steps(self) -> int:
        return int(self.values.shape[1])

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: npt.ArrayLike) -> Vector:
        idx = np.asarray(rows, dtype=np.int64)
        times = self.times[idx] if self.times is not None else None
        return Vector(
            [self.labels[i] for i in idx.tolist()], self.values[idx], self.present[idx], times
        )

    def nonempty(self) -> Vector:
        """Only the series present at some step (Prometheus keeps no empty series)."""
        rows = np.flatnonzero(self.present.any(axis=1))
        return self if rows.shape[0] == len(self.labels) else self.take(rows)

    def relabel(self, labels: list[Labels], whole_series: bool = False) -> Vector:
        """The same samples under new labels; series that now share labels are merged.

        Merging is allowed where they never overlap in time (Prometheus checks each
        step), unless ``whole_series`` (Prometheus checks the whole result, as for
        functions of range vectors and unary minus).
        """
        out = Vector(labels, self.values, self.present, None)
        return out.merged(whole_series)

    def merged(self, whole_series: bool = False) -> Vector:
        groups: dict[Labels, list[int]] = {}
        for i, lab in enumerate(self.labels):
            groups.setdefault(lab, []).append(i)
        if len(groups) == len(self.labels):
            return self
        keep_rows: list[int] = []
        values, present = self.values.copy(), self.present.copy()
        for rows in groups.values():
            first = rows[0]
            keep_rows.append(first)
            if len(rows) == 1:
                continue
            live = [r for r in rows if bool(present[r].any())] if whole_series else rows
            count = present[rows].sum(axis=0)
            if (whole_series and len(live) > 1) or bool((count > 1).any()):
                raise EvalError("vector cannot contain metrics with the same labelset")
            for r in rows[1:]:
                values[first] = np.where(present[r], values[r], values[first])
                present[first] |= present[r]
        idx = np.asarray(keep_rows, dtype=np.int64)
        return Vector([self.labels[i] for i in keep_rows], values[idx], present[idx], None)


@dataclass
class Matrix:
    """A range vector at every step: series samples flat, one window per series and step."""

    labels: list[Labels]
    ts: I1  # sample times (ns), series after series, each ascending
    vs: F1
    lo: I2  # (series, steps): window start index into ts/vs
    hi: I2  # (series, steps): window end (exclusive)
    ends: I1  # (steps,): the time each window ends at (inclusive)
    range_ns: int

    @property
    def steps(self) -> int:
        return int(self.ends.shape[0])


Value = Scalar | String | Vector | Matrix


def stacked_search(parts: list[I1], qs: I1, side: Literal["left", "right"]) -> I2:
    """``np.searchsorted(parts[i], qs, side)`` for every series ``i`` in one call, as positions
    in ``np.concatenate(parts)`` (series x queries).

    Each series' times are shifted into a band of its own (``i * width``), so the
    concatenation is one sorted array; a query shifted the same way finds its place
    within its series' band. A Python loop per series cost about 10 us each, the
    bulk of a small query's evaluation.
    """
    n = len(parts)
    if n == 0:
        return np.empty((0, qs.shape[0]), dtype=np.int64)
    sizes = np.fromiter((p.shape[0] for p in parts), dtype=np.int64, count=n)
    flat = np.concatenate(parts)
    if flat.shape[0] == 0 or qs.shape[0] == 0:
        return np.zeros((n, qs.shape[0]), dtype=np.int64)
    low = min(int(flat.min()), int(qs.min()))
    width = max(int(flat.max()), int(qs.max())) - low + 1
    if n == 1 or width > 2**62 // n:  # the bands would overflow int64: a series at a time
        base = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        rows = [
            np.searchsorted(p, qs, side=side) + int(b) for p, b in zip(parts, base, strict=True)
        ]
        return np.vstack(rows).astype(np.int64)
    shift = np.arange(n, dtype=np.int64) * width - low
    keys = flat + np.repeat(shift, sizes)
    return np.searchsorted(keys, qs[None, :] + shift[:, None], side=side).astype(np.int64)


def windows(ts: I1, base: int, ends: I1, range_ns: int) -> tuple[I1, I1]:
    """``[lo, hi)`` of samples with ``end - range <= t <= end`` for each end."""
    lo = np.searchsorted(ts, ends - range_ns, side="left") + base
    hi = np.searchsorted(ts, ends, side="right") + base
    return lo.astype(np.int64), hi.astype(np.int64)
