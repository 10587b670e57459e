"""The pusher's encoders produce exactly what the shared codec specifies and decodes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import codec
from services.common.readings import Batch
from services.common.sensors import SensorMetadata
from services.pusher.formats import Route, common_prefix, encode_dcdb, encode_kvb1


def route(names: list[str], scales: list[float] | None = None) -> Route:
    scales = scales or [1.0] * len(names)
    return Route([SensorMetadata(name=n, scale=s) for n, s in zip(names, scales, strict=True)])


def test_common_prefix_is_the_deepest_shared_level() -> None:
    assert common_prefix(["/n1/tester/s0000", "/n1/tester/s0001"]) == "/n1/tester"
    assert common_prefix(["/n1/procfs/cpu0/user", "/n1/procfs/meminfo/MemFree"]) == "/n1/procfs"
    assert common_prefix(["/a/x", "/b/y"]) == "/"
    assert common_prefix(["/only/one"]) == "/only"


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    k=st.integers(1, 4),
    masked=st.booleans(),
    max_bytes=st.sampled_from([1024, 1 << 20]),
    data=st.data(),
)
def test_kvb1_round_trips_through_the_codec(
    n: int, k: int, masked: bool, max_bytes: int, data: st.DataObject
) -> None:
    names = [f"/h/grp/s{i:03d}" for i in range(n)]
    r = route(names)
    ts = np.arange(k, dtype=np.int64) * 100_000_000 + 1_764_500_000_000_000_000
    values = np.array(
        data.draw(st.lists(st.floats(-1e12, 1e12), min_size=n * k, max_size=n * k))
    ).reshape(k, n)
    mask = None
    if masked:
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=n * k, max_size=n * k))).reshape(
            k, n
        )
    msgs = encode_kvb1(r, ts, values, mask, max_bytes)
    got: dict[str, list[tuple[int, float]]] = {}
    for m in msgs:
        assert m.topic == "/KELVIN_BATCH//h/grp"
        batch = codec.decode_batch("/h/grp", m.payload)
        assert len(batch) == m.readings
        for s in batch:
            got.setdefault(s.sensor, []).extend(
                zip(s.timestamps_ns.tolist(), s.values.tolist(), strict=True)
            )
    want = {
        names[j]: [
            (int(ts[i]), float(values[i, j])) for i in range(k) if mask is None or mask[i, j]
        ]
        for j in range(n)
    }
    assert got == {s: v for s, v in want.items() if v}


def test_kvb1_bytes_equal_the_codecs_encoder() -> None:
    names = ["/h/g/a", "/h/g/bb", "/h/g/sub/c"]
    r = route(names)
    ts = np.array([10, 20], dtype=np.int64)
    values = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    (msg,) = encode_kvb1(r, ts, values, None)
    batch = Batch.from_series([codec.decode_batch("/h/g", msg.payload).series(i) for i in range(3)])
    topic, payload = codec.encode_batch("/h/g", batch)
    assert (msg.topic, msg.payload) == (topic, payload)


def test_dcdb_one_message_per_sensor_with_all_its_readings_scaled() -> None:
    r = route(["/h/t/temp", "/h/t/power"], scales=[0.001, 1.0])
    ts = np.array([1_000, 2_000, 3_000], dtype=np.int64)
    values = np.array([[21.5, 100.2], [21.75, 100.6], [22.0, 101.0]])
    mask = np.array([[True, True], [False, True], [True, True]])
    msgs = encode_dcdb(r, ts, values, mask)
    assert [(m.topic, m.readings) for m in msgs] == [("/h/t/temp", 2), ("/h/t/power", 3)]
    t, v = codec.decode_dcdb(msgs[0].payload, 0)
    assert t.tolist() == [1_000, 3_000] and v.tolist() == [21500.0, 22000.0]
    t, v = codec.decode_dcdb(msgs[1].payload, 0)
    assert v.tolist() == [100.0, 101.0, 101.0], "integers: rint(value / scale)"
    assert codec.encode_dcdb([100, 101, 101], [1_000, 2_000, 3_000]) == msgs[1].payload
    unmasked = encode_dcdb(r, ts, values, None)
    assert [m.readings for m in unmasked] == [3, 3]


def test_dcdb_masked_nan_is_not_sent_and_warns_nothing() -> None:
    values = np.array([[1.0, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        msgs = encode_dcdb(
            route(["/h/t/a", "/h/t/b"]), np.array([5], dtype=np.int64), values, ~np.isnan(values)
        )
    assert [(m.topic, m.readings) for m in msgs] == [("/h/t/a", 1)]


def test_kvb1_splits_large_groups_by_bytes() -> None:
    names = [f"/h/g/s{i:04d}" for i in range(1000)]
    msgs = encode_kvb1(route(names), np.array([1], dtype=np.int64), np.ones((1, 1000)), None, 4096)
    assert len(msgs) > 1 and all(len(m.payload) <= 4096 + 64 for m in msgs)
    assert sum(m.readings for m in msgs) == 1000


def test_kvb1_with_a_mask_respects_max_bytes_whatever_the_name_lengths() -> None:
    names = [f"/h/g/{'x' * 200}{i:04d}" for i in range(1000)]
    mask = np.ones((1, 1000), dtype=bool)
    mask[0, 7] = False
    msgs = encode_kvb1(route(names), np.array([1], dtype=np.int64), np.ones((1, 1000)), mask, 16384)
    assert len(msgs) > 1 and all(len(m.payload) <= 16384 for m in msgs)
    got = [s for m in msgs for s in codec.decode_batch("/h/g", m.payload).sensors]
    assert got == names[:7] + names[8:]


@pytest.mark.parametrize("value", [1e30, -1e30])
def test_dcdb_clips_values_beyond_int64(value: float) -> None:
    (msg,) = encode_dcdb(route(["/h/x"]), np.array([1], dtype=np.int64), np.array([[value]]), None)
    _, v = codec.decode_dcdb(msg.payload, 0)
    assert abs(v[0]) > 9e18


def test_a_cycle_with_a_few_readings_missing_is_one_message_spliced_around_them() -> None:
    from array import array

    names = [f"/h/g/s{i:03d}" for i in range(40)]
    r = route(names)
    row = array("d", [float(i) for i in range(40)])
    keep = array("B", [1] * 40)
    for j in (0, 7, 8, 39):
        keep[j] = 0
    (msg,) = encode_kvb1(r, [5], [row], [keep])
    batch = codec.decode_batch("/h/g", msg.payload)
    assert batch.sensors == [n for j, n in enumerate(names) if keep[j]]
    assert batch.values.tolist() == [float(j) for j in range(40) if keep[j]]
    assert msg.readings == 36
    assert codec.encode_batch("/h/g", batch) == (msg.topic, msg.payload), "the codec's bytes"
    assert encode_kvb1(r, [5], [row], [array("B", [0] * 40)]) == []


def test_metadata_bytes_are_the_codecs() -> None:
    from services.pusher.formats import SensorMetadata as Light
    from services.pusher.formats import metadata_message

    light = Light(name="/h/t/x", unit="W", scale=0.001, interval_ms=1000, monotonic=True)
    heavy = SensorMetadata(name="/h/t/x", unit="W", scale=0.001, interval_ms=1000, monotonic=True)
    msg = metadata_message(light)
    assert (msg.topic, msg.payload) == codec.encode_metadata(heavy)
    assert codec.decode_metadata("/h/t/x", msg.payload) == heavy
