"""DCDB's per-sensor post-processing of raw readings, vectorised over a group.

For every read cycle a group hands over one raw value per sensor; this module
applies, in DCDB's order (``SensorBase::storeReading``): delta of a monotonic
counter with wrap-around (``delta``/``deltaMax``; the first reading is
dropped), ``factor``, then for publishing ``subSampling`` (deltas accumulate
over the skipped cycles) and ``skipConstVal``. The cache gets every processed
reading; the queue only what is to be sent. All of it is numpy over the
group's sensors: no Python loop per sensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.common.readings import Float64Array
from services.pusher.plugins.base import SensorOptions

BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class Processed:
    """One cycle after processing."""

    cached: Float64Array
    """Values for the cache (NaN = none)."""
    send: Float64Array
    """Values to queue for publishing."""
    send_mask: BoolArray | None
    """Which of ``send`` to publish; None = all of them."""
    invalid: int
    """Raw readings that were NaN or infinite (no reading)."""


class Processor:
    """The state DCDB keeps per sensor (last raw value, accumulator, last sent), as arrays."""

    def __init__(self, options: Sequence[SensorOptions]) -> None:
        n = len(options)
        self.n = n
        self.factor = np.array([o.factor for o in options], dtype=np.float64)
        self.delta = np.array([o.delta for o in options], dtype=bool)
        self.delta_max = np.array(
            [np.inf if o.delta_max is None else o.delta_max for o in options], dtype=np.float64
        )
        self.sub = np.array([o.sub_sampling for o in options], dtype=np.int64)
        self.skip = np.array([o.skip_const_val for o in options], dtype=bool)
        self.any_factor = bool((self.factor != 1.0).any())
        self.any_delta = bool(self.delta.any())
        self.any_sub = bool((self.sub != 1).any())
        self.any_skip = bool(self.skip.any())
        self.never = self.sub <= 0
        self.last_raw = np.zeros(n, dtype=np.float64)
        self.has_last = np.zeros(n, dtype=bool)
        self.acc = np.zeros(n, dtype=np.float64)
        self.index = np.zeros(n, dtype=np.int64)
        self.last_sent = np.full(n, np.nan, dtype=np.float64)

    @property
    def trivial(self) -> bool:
        return not (self.any_factor or self.any_delta or self.any_sub or self.any_skip)

    def process(self, raw: Float64Array) -> Processed:
        valid = np.isfinite(raw)
        all_valid = bool(valid.all())
        invalid = 0 if all_valid else int(self.n - np.count_nonzero(valid))
        if self.trivial:
            if all_valid:
                return Processed(raw, raw, None, 0)
            cached = np.where(valid, raw, np.nan)
            return Processed(cached, cached, valid, invalid)
        v = raw.astype(np.float64, copy=True)
        if self.any_delta:
            d = self.delta & valid
            down = d & (raw < self.last_raw)
            wraps = np.isfinite(self.delta_max)
            diff = np.where(
                down & wraps, raw + (self.delta_max - self.last_raw), raw - self.last_raw
            )
            # The first reading has nothing to subtract; a drop without deltaMax is a
            # counter reset (reboot, driver reload), not a negative amount.
            first = d & ~self.has_last
            v = np.where(d, diff, v)
            valid = valid & ~first & ~(down & ~wraps)
            self.last_raw = np.where(d, raw, self.last_raw)
            self.has_last |= d
        if self.any_factor:
            v = v * self.factor
        cached = np.where(valid, v, np.nan)
        # storeReadingGlobal: deltas accumulate over a sub-sampling period.
        if self.any_delta:
            self.acc = np.where(valid & self.delta, self.acc + v, np.where(valid, v, self.acc))
        else:
            self.acc = np.where(valid, v, self.acc)
        if self.any_sub:
            slot = valid & ~self.never & (self.index % np.maximum(self.sub, 1) == 0)
            self.index = self.index + valid
        else:
            slot = valid
        take = slot
        if self.any_skip:
            take = slot & ~(self.skip & (self.acc == self.last_sent))
        send = self.acc.copy()
        self.last_sent = np.where(take, self.acc, self.last_sent)
        if self.any_delta:
            self.acc = np.where(slot & self.delta, 0.0, self.acc)
        return Processed(cached, send, None if bool(take.all()) else take, invalid)
