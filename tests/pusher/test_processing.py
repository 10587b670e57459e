"""DCDB's per-sensor semantics, vectorised: compared with a scalar model of DCDB's code.

``dcdb_store_reading`` transcribes ``SensorBase::storeReading`` /
``storeReadingGlobal`` (DCDB 0.4) reading by reading; the vectorised
:class:`Processor` must agree with it on arbitrary inputs.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.pusher.plugins.base import SensorOptions
from services.pusher.processing import Processor


class DcdbSensor:
    """A scalar transcription of DCDB's SensorBase (plus Kelvin's reset rule)."""

    def __init__(self, o: SensorOptions) -> None:
        self.o = o
        self.first = True
        self.last_raw = 0.0
        self.acc = 0.0
        self.index = 0
        self.last_sent: float | None = None

    def store(self, raw: float) -> tuple[float | None, float | None]:
        """Returns (cached value or None, sent value or None)."""
        if not math.isfinite(raw):
            return None, None
        o = self.o
        if o.delta:
            if self.first:
                self.first, self.last_raw = False, raw
                return None, None
            if raw < self.last_raw:
                if o.delta_max is None:  # Kelvin: a reset, not a negative amount
                    self.last_raw = raw
                    return None, None
                value = (raw + (o.delta_max - self.last_raw)) * o.factor
            else:
                value = (raw - self.last_raw) * o.factor
            self.last_raw = raw
        else:
            value = raw * o.factor
        self.acc = self.acc + value if o.delta else value
        sent = None
        if o.sub_sampling > 0 and self.index % o.sub_sampling == 0:
            if not (o.skip_const_val and self.acc == self.last_sent):
                sent = self.acc
                self.last_sent = self.acc
            if o.delta:
                self.acc = 0.0
        self.index += 1
        return value, sent


options = st.builds(
    SensorOptions,
    delta=st.booleans(),
    delta_max=st.one_of(st.none(), st.sampled_from([100.0, 1000.0])),
    sub_sampling=st.integers(-1, 3),
    skip_const_val=st.booleans(),
    factor=st.sampled_from([1.0, 0.5, 3.0]),
)
readings = st.lists(
    st.one_of(st.integers(0, 99).map(float), st.just(float("nan"))), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None)
@given(opts=st.lists(options, min_size=1, max_size=4), data=st.data())
def test_vectorised_processing_matches_dcdb(opts: list[SensorOptions], data: st.DataObject) -> None:
    cycles = data.draw(
        st.lists(
            st.lists(st.integers(0, 99), min_size=len(opts), max_size=len(opts)),
            min_size=1,
            max_size=10,
        )
    )
    nan_at = data.draw(st.sets(st.tuples(st.integers(0, 9), st.integers(0, 3))))
    proc = Processor(opts)
    refs = [DcdbSensor(o) for o in opts]
    for c, row in enumerate(cycles):
        raw = np.array(
            [np.nan if (c, j) in nan_at else float(v) for j, v in enumerate(row)], dtype=np.float64
        )
        out = proc.process(raw)
        for j, ref in enumerate(refs):
            cached, sent = ref.store(float(raw[j]))
            got_cached = None if np.isnan(out.cached[j]) else float(out.cached[j])
            assert got_cached == cached, (c, j)
            takes = out.send_mask is None or bool(out.send_mask[j])
            assert (float(out.send[j]) if takes else None) == sent, (c, j)


def test_trivial_options_pass_readings_through_without_copies() -> None:
    proc = Processor([SensorOptions(), SensorOptions()])
    raw = np.array([1.0, 2.0])
    out = proc.process(raw)
    assert out.send is raw and out.send_mask is None and out.invalid == 0
    out = proc.process(np.array([np.inf, 2.0]))
    assert out.send_mask.tolist() == [False, True] and out.invalid == 1


def test_delta_wraps_at_delta_max_and_resets_without_it() -> None:
    proc = Processor([SensorOptions(delta=True, delta_max=100), SensorOptions(delta=True)])
    sent = []
    for raw in ([90, 90], [95, 95], [5, 5], [7, 7]):
        out = proc.process(np.array(raw, dtype=np.float64))
        sent.append(
            [
                float(v) if out.send_mask is None or m else None
                for v, m in zip(
                    out.send,
                    out.send_mask if out.send_mask is not None else [True, True],
                    strict=True,
                )
            ]
        )
    assert sent == [[None, None], [5.0, 5.0], [10.0, None], [2.0, 2.0]]
