"""DCDB's per-sensor post-processing of raw readings, for one group at a time.

For every read cycle a group hands over one raw value per sensor; this module
applies, in DCDB's order (``SensorBase::storeReading``): delta of a monotonic
counter with wrap-around (``delta``/``deltaMax``; the first reading is
dropped), ``factor``, then for publishing ``subSampling`` (deltas accumulate
over the skipped cycles) and ``skipConstVal``. The cache gets every processed
reading; the queue only what is to be sent.

Most groups set none of these options (``procfs``, ``sysfs``, ``tester`` by
default): their cycle passes through untouched after one C-speed check that
every value is finite. Only groups that set an option pay a Python loop over
their sensors (a handful of operations each).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.pusher.plugins.base import SensorOptions

_NAN = float("nan")
_INF = float("inf")


@dataclass(slots=True)
class Processed:
    """One cycle after processing."""

    cached: Sequence[float]
    """Values for the cache (NaN = none)."""
    send: Sequence[float]
    """Values to queue for publishing."""
    send_mask: array[int] | None
    """Which of ``send`` to publish (``array('B')``, 1 = send); None = all of them."""
    invalid: int
    """Raw readings that were NaN or infinite (no reading)."""


def all_finite(values: Sequence[float]) -> bool:
    """Whether no value is NaN or infinite: one C-level sum (NaN and inf survive it), and
    the exact check only when the sum overflows."""
    return math.isfinite(sum(values, 0.0)) or all(map(math.isfinite, values))


class Processor:
    """The state DCDB keeps per sensor (last raw value, accumulator, last sent), as lists."""

    def __init__(self, options: Sequence[SensorOptions]) -> None:
        n = len(options)
        self.n = n
        self.factor = [float(o.factor) for o in options]
        self.delta = [bool(o.delta) for o in options]
        self.delta_max = [_INF if o.delta_max is None else float(o.delta_max) for o in options]
        self.sub = [int(o.sub_sampling) for o in options]
        self.skip = [bool(o.skip_const_val) for o in options]
        self.any_factor = any(f != 1.0 for f in self.factor)
        self.any_delta = any(self.delta)
        self.any_sub = any(s != 1 for s in self.sub)
        self.any_skip = any(self.skip)
        self.last_raw = [0.0] * n
        self.has_last = [False] * n
        self.acc = [0.0] * n
        self.index = [0] * n
        self.last_sent = [_NAN] * n

    @property
    def trivial(self) -> bool:
        return not (self.any_factor or self.any_delta or self.any_sub or self.any_skip)

    def process(self, raw: Sequence[float]) -> Processed:
        if self.trivial:
            if all_finite(raw):
                return Processed(raw, raw, None, 0)
            valid = array("B", map(math.isfinite, raw))
            cached = array("d", [v if ok else _NAN for v, ok in zip(raw, valid, strict=True)])
            return Processed(cached, cached, valid, self.n - sum(valid))
        return self._process(raw)

    def _process(self, raw: Sequence[float]) -> Processed:
        n = self.n
        cached = array("d", bytes(8 * n))
        send = array("d", bytes(8 * n))
        take_all = True
        takes = array("B", bytes(n))
        invalid = 0
        any_delta, any_factor, any_sub, any_skip = (
            self.any_delta,
            self.any_factor,
            self.any_sub,
            self.any_skip,
        )
        isfinite = math.isfinite
        for j in range(n):
            r: Any = float(raw[j])
            ok = isfinite(r)
            if not ok:
                invalid += 1
            v = r
            delta = any_delta and self.delta[j]
            if delta and ok:
                last = self.last_raw[j]
                down = r < last
                wraps = self.delta_max[j] != _INF
                v = r + (self.delta_max[j] - last) if down and wraps else r - last
                # The first reading has nothing to subtract; a drop without deltaMax is a
                # counter reset (reboot, driver reload), not a negative amount.
                ok = self.has_last[j] and not (down and not wraps)
                self.last_raw[j] = r
                self.has_last[j] = True
            if any_factor:
                v = v * self.factor[j]
            cached[j] = v if ok else _NAN
            # storeReadingGlobal: deltas accumulate over a sub-sampling period.
            acc = self.acc[j]
            if ok:
                acc = acc + v if delta else v
            if any_sub:
                sub = self.sub[j]
                slot = ok and sub > 0 and self.index[j] % sub == 0
                if ok:
                    self.index[j] += 1
            else:
                slot = ok
            take = slot and not (any_skip and self.skip[j] and acc == self.last_sent[j])
            send[j] = acc
            if take:
                self.last_sent[j] = acc
                takes[j] = 1
            else:
                take_all = False
            if delta and slot:
                acc = 0.0
            self.acc[j] = acc
        return Processed(cached, send, None if take_all else takes, invalid)
