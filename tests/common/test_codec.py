"""Wire formats: every decoder the collect agent uses, exact round trips, and fuzzing.

The hypothesis tests feed random and mutated payloads to every decoder; the
only acceptable failure is a PayloadError with a reason (never another
exception, never a hang).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common import codec
from services.common.errors import PayloadError
from services.common.readings import Batch
from services.common.sensors import SensorMetadata

TS0 = 1_764_500_000_000_000_000
NOW = TS0 + 123
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- DCDB


def test_dcdb_round_trip_and_single_value() -> None:
    payload = codec.encode_dcdb([-5, 2**62], [TS0, TS0 + 1])
    assert len(payload) == 32
    ts, vs = codec.decode_dcdb(payload, NOW)
    assert ts.tolist() == [TS0, TS0 + 1] and vs.tolist() == [-5.0, float(2**62)]
    ts, vs = codec.decode_dcdb(struct.pack("<q", 42), NOW)
    assert ts.tolist() == [NOW] and vs.tolist() == [42.0]


@pytest.mark.parametrize(("payload", "reason"), [(b"", "bad_length"), (b"x" * 17, "bad_length"),
                                                 (struct.pack("<qQ", 1, 2**63), "bad_timestamp")])  # fmt: skip
def test_dcdb_rejects(payload: bytes, reason: str) -> None:
    with pytest.raises(PayloadError) as exc:
        codec.decode_dcdb(payload, NOW)
    assert exc.value.reason == reason


def test_decode_dcdb_many_joins_payloads() -> None:
    ps = [codec.encode_dcdb([i, i + 1], [TS0 + i, TS0 + i + 1]) for i in range(5)]
    ts, vs, offsets = codec.decode_dcdb_many(ps, NOW)
    assert offsets.tolist() == [0, 2, 4, 6, 8, 10]
    assert vs.tolist() == [float(v) for i in range(5) for v in (i, i + 1)]
    ts, vs, offsets = codec.decode_dcdb_many([struct.pack("<q", 9), ps[0]], NOW)
    assert ts.tolist() == [NOW, TS0, TS0 + 1] and offsets.tolist() == [0, 1, 3]


# --------------------------------------------------------------------------- KVB1


def _batch() -> Batch:
    return Batch.from_series(
        [
            Batch.single("/dc/n1/power", [TS0, TS0 + 1], [1.5, np.nan]).series(0),
            Batch.single("/dc/n1", [TS0], [7.0]).series(0),
            Batch.single("/dc/n1/ü", [TS0 + 2], [-1.0]).series(0),
        ]
    )


def test_kvb1_round_trip_including_prefix_itself_and_unicode() -> None:
    topic, payload = codec.encode_batch("/dc/n1", _batch())
    assert topic == "/KELVIN_BATCH//dc/n1"
    kind, prefix = codec.classify(topic)
    assert kind is codec.TopicKind.BATCH
    back = codec.decode_batch(prefix, payload)
    assert list(back.sensors) == ["/dc/n1/power", "/dc/n1", "/dc/n1/ü"]
    assert np.array_equal(back.values, _batch().values, equal_nan=True)
    assert back.offsets.tolist() == [0, 2, 3, 4]
    root_topic, root_payload = codec.encode_batch("/", _batch())
    assert root_topic == "/KELVIN_BATCH/"
    assert list(codec.decode_batch("/", root_payload).sensors) == list(_batch().sensors)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: b"KVB2" + p[4:], "bad_magic"),
        (lambda p: p[:-1], "bad_length"),
        (lambda p: p + b"\x00", "bad_length"),
        (lambda p: p[:5], "bad_length"),
        (lambda p: p[:4] + struct.pack("<I", 99) + p[8:], "bad_length"),
    ],
)
def test_kvb1_rejects(mutate: object, reason: str) -> None:
    _, payload = codec.encode_batch("/dc/n1", _batch())
    with pytest.raises(PayloadError) as exc:
        codec.decode_batch("/dc/n1", mutate(payload))  # type: ignore[operator]
    assert exc.value.reason == reason


def test_kvb1_bad_names_are_bad_topic() -> None:
    bad = Batch.single("/dc/x", [TS0], [1.0])
    for rel in (b"\xff\xfe", b"/a//b", b"/+"):
        with pytest.raises(PayloadError) as exc:
            codec.decode_batch("/dc", codec.encode_batch_rel([rel], bad))
        assert exc.value.reason == "bad_topic"


# --------------------------------------------------------------------------- JSON and control topics


def test_json_forms_and_epoch_units() -> None:
    for doc, want in [
        ({"ts": TS0, "value": 1.5}, [(TS0, 1.5)]),
        ({"value": "2"}, [(NOW, 2.0)]),
        ([{"ts": 1764500000, "value": 1}, {"ts": 1764500000001, "value": 2}], [(TS0, 1.0), (TS0 + 1_000_000, 2.0)]),
        ([3, {"timestamp": 1764500000000000, "value": 4}], [(NOW, 3.0), (TS0, 4.0)]),
    ]:  # fmt: skip
        ts, vs = codec.decode_json(json.dumps(doc).encode(), NOW)
        assert list(zip(ts.tolist(), vs.tolist(), strict=True)) == want


def test_json_fractional_epochs_keep_their_fraction() -> None:
    doc = [{"ts": 1764500000.25, "value": 1}, {"ts": "1764500000.75", "value": 2},
           {"ts": 1764500000000.5, "value": 3}]  # fmt: skip
    ts, _ = codec.decode_json(json.dumps(doc).encode(), NOW)
    assert ts.tolist() == [TS0 + 250_000_000, TS0 + 750_000_000, TS0 + 500_000]


@pytest.mark.parametrize("payload", [b"{nope}", b"[]", b'{"ts": 1}', b'{"value": true}', b'[{"value": "x"}]',
                                     b'{"value": 1, "ts": -5}', b'{"value": 1, "ts": "soon"}'])  # fmt: skip
def test_json_rejects(payload: bytes) -> None:
    with pytest.raises(PayloadError) as exc:
        codec.decode_publish("/j/x", payload, NOW)
    assert exc.value.reason in ("bad_json", "bad_timestamp")


def test_classify_control_topics() -> None:
    assert codec.classify("/DCDB_MAP//a/b") == (codec.TopicKind.MAP, "/a/b")
    assert codec.classify("/DCDB_MAP/a/b") == (codec.TopicKind.MAP, "/a/b")
    assert codec.classify("/DCDB_MAP/METADATA//a/b") == (codec.TopicKind.METADATA, "/a/b")
    assert codec.classify("/DCDB_JOBDATA/") == (codec.TopicKind.JOBDATA, "")
    assert codec.classify("/a/b") == (codec.TopicKind.DATA, "/a/b")
    with pytest.raises(PayloadError) as exc:
        codec.classify("/DCDB_WHAT/x")
    assert exc.value.reason == "unknown_control_topic"


def test_metadata_round_trip_and_dcdb_string_values() -> None:
    meta = SensorMetadata(
        name="/a/b", public_name="ab", unit="W", scale=0.001, ttl_ms=5000, interval_ms=100,
        operations=("avg", "max"), monotonic=True,
    )  # fmt: skip
    topic, payload = codec.encode_metadata(meta)
    got = codec.decode_publish(topic, payload, NOW).metadata
    assert got == meta
    dcdb = b'{"publicName":"x","scale":"0.5","ttl":"1000","integrable":"true","isVirtual":"0"}'
    m = codec.decode_publish("/DCDB_MAP/METADATA//a/c", dcdb, NOW).metadata
    assert m is not None and (m.scale, m.ttl_ms, m.integrable, m.is_virtual) == (
        0.5,
        1000,
        True,
        False,
    )
    with pytest.raises(PayloadError) as exc:
        codec.decode_publish("/DCDB_MAP/METADATA//a/c", b'{"scale": "big"}', NOW)
    assert exc.value.reason == "bad_metadata"


def test_job_start_and_end() -> None:
    start = {"jobid": 7, "userid": "u", "starttime": TS0, "endtime": 1, "nodes": ["n1"]}
    job = codec.decode_publish("/DCDB_JOBDATA/", json.dumps(start).encode(), NOW).job
    assert job is not None and job.job_id == "7" and job.running
    end = {**start, "endtime": TS0 + 10}
    job = codec.decode_publish("/DCDB_JOBDATA/", json.dumps(end).encode(), NOW).job
    assert job is not None and job.end_ns == TS0 + 10
    with pytest.raises(PayloadError) as exc:
        codec.decode_publish("/DCDB_JOBDATA/", b'{"userid": "u"}', NOW)
    assert exc.value.reason == "bad_job"


# --------------------------------------------------------------------------- fuzzing

_topics = st.one_of(
    st.sampled_from(["/a/b", "/DCDB_MAP//a/b", "/DCDB_MAP/METADATA//a/b", "/DCDB_JOBDATA/",
                     "/KELVIN_BATCH//a", "/KELVIN_BATCH/", "/DCDB_X", "//", "/a/+/b", ""]),
    st.text(max_size=40),
)  # fmt: skip
_payloads = st.one_of(
    st.binary(max_size=200),
    st.integers(0, 12).map(lambda n: codec.encode_dcdb(list(range(n)), [TS0 + i for i in range(n)])),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(["ts", "value", "scale", "ttl", "interval", "jobid", "starttime", "endtime", "nodes", "x"]), c, max_size=4),
        max_leaves=8,
    ).map(lambda d: json.dumps(d).encode()),
)  # fmt: skip


@FUZZ
@given(topic=_topics, payload=_payloads)
def test_fuzz_decode_publish_only_raises_payload_error(topic: str, payload: bytes) -> None:
    try:
        d = codec.decode_publish(topic, payload, NOW)
    except PayloadError as exc:
        assert exc.reason and str(exc)
        return
    if d.batch is not None:
        assert d.batch.timestamps_ns.dtype == np.int64 and len(d.batch.sensors) >= 1


@FUZZ
@given(
    data=st.lists(
        st.tuples(
            st.sampled_from(["/p", "/p/q", "/p/ü/x", "/p/a b"]),
            st.lists(st.tuples(st.integers(0, 2**62), st.floats(allow_nan=False)), min_size=0, max_size=5),
        ),
        min_size=1,
        max_size=6,
    ),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)  # fmt: skip
def test_fuzz_kvb1_round_trip_and_mutations(
    data: list[tuple[str, list[tuple[int, float]]]], flips: list[tuple[int, int]]
) -> None:
    batch = Batch.from_series(
        Batch.single(name, [t for t, _ in rows], [v for _, v in rows]).series(0)
        for name, rows in data
    )
    _, payload = codec.encode_batch("/p", batch)
    back = codec.decode_batch("/p", payload)
    assert list(back.sensors) == list(batch.sensors)
    assert np.array_equal(back.timestamps_ns, batch.timestamps_ns)
    assert np.array_equal(back.values, batch.values)
    mutated = bytearray(payload)
    for pos, val in flips:
        mutated[pos % len(mutated)] = val
    try:
        codec.decode_batch("/p", bytes(mutated))
    except PayloadError as exc:
        assert exc.reason in ("bad_magic", "bad_length", "bad_topic")


@FUZZ
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20), base=st.integers(0, 2**63 - 100)
)
def test_fuzz_dcdb_round_trip(values: list[int], base: int) -> None:
    stamps = [base + i for i in range(len(values))]
    payload = codec.encode_dcdb(np.array(values, dtype=np.int64), np.array(stamps, dtype=np.uint64))
    if not values:
        with pytest.raises(PayloadError):
            codec.decode_dcdb(payload, NOW)
        return
    ts, vs = codec.decode_dcdb(payload, NOW)
    assert ts.tolist() == stamps
    assert vs.tolist() == [float(v) for v in values]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [(b'{"value": 1, "ts": 99999999999}', "bad_timestamp"), (b'{"value": 1, "ts": 1e30}', "bad_timestamp"),
     (b"[" + b"9" * 400 + b"]", "bad_json"), (b'{"value": ' + b"9" * 400 + b"}", "bad_json")],
)  # fmt: skip
def test_json_out_of_range_numbers_are_rejected(payload: bytes, reason: str) -> None:
    with pytest.raises(PayloadError) as exc:
        codec.decode_json(payload, NOW)
    assert exc.value.reason == reason


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [("/j/x", b'{"value": 1, "ts": 1e400}', "bad_timestamp"),
     ("/j/x", b'{"value": 1, "ts": "Infinity"}', "bad_timestamp"),
     ("/DCDB_MAP/METADATA//j/x", b'{"ttl": "inf"}', "bad_metadata"),
     ("/DCDB_MAP/METADATA//j/x", b'{"interval": 1e400}', "bad_metadata"),
     ("/DCDB_JOBDATA/", b'{"jobid": 1, "starttime": 5, "endtime": [1]}', "bad_job"),
     ("/DCDB_JOBDATA/", b'{"jobid": 1, "starttime": 5, "endtime": 1e400}', "bad_job"),
     ("/DCDB_JOBDATA/", b'{"jobid": 1, "starttime": 9223372036854775808}', "bad_job"),
     ("/DCDB_JOBDATA/", b'{"jobid": 1, "starttime": 5, "endtime": -4}', "bad_job")],
)  # fmt: skip
def test_infinite_and_out_of_range_numbers_are_payload_errors(
    topic: str, payload: bytes, reason: str
) -> None:
    with pytest.raises(PayloadError) as exc:
        codec.decode_publish(topic, payload, NOW)
    assert exc.value.reason == reason


def test_json_overflowing_float_is_infinity_like_any_float64() -> None:
    ts, vs = codec.decode_json(b"[1e400]", NOW)
    assert vs.tolist() == [float("inf")] and ts.tolist() == [NOW]


# The exact bytes dcdbslurmjob publishes (boost::property_tree::write_json, pretty):
# every value a string, an empty node list written as "".
DCDBSLURMJOB_START = (
    b'{\n    "domainid": "default",\n    "jobid": "4711",\n    "userid": "alice",\n'
    b'    "starttime": "1764500000000000000",\n    "endtime": "0",\n'
    b'    "nodes": [\n        "n01",\n        "n02"\n    ]\n}\n'
)
DCDBSLURMJOB_START_NO_NODES = DCDBSLURMJOB_START.replace(
    b'[\n        "n01",\n        "n02"\n    ]', b'""'
)
DCDBSLURMJOB_STOP = (
    b'{\n    "domainid": "default",\n    "jobid": "4711",\n    "userid": "",\n'
    b'    "starttime": "0",\n    "endtime": "1764500360000000000",\n    "nodes": ""\n}\n'
)


def test_dcdbslurmjob_records_with_an_empty_node_list_are_accepted() -> None:
    start = codec.decode_publish("/DCDB_JOBDATA/", DCDBSLURMJOB_START, NOW).job
    assert start is not None and start.running and start.nodes == ("n01", "n02")
    bare = codec.decode_publish("/DCDB_JOBDATA/", DCDBSLURMJOB_START_NO_NODES, NOW).job
    assert bare is not None and bare.running and bare.nodes == ()
    stop = codec.decode_publish("/DCDB_JOBDATA/", DCDBSLURMJOB_STOP, NOW).job
    assert stop is not None and stop.job_id == "4711" and stop.nodes == ()
    assert stop.end_ns == 1_764_500_360_000_000_000 and stop.start_ns == 0
    with pytest.raises(PayloadError) as exc:  # a string that is not empty is still refused
        codec.decode_publish(
            "/DCDB_JOBDATA/", DCDBSLURMJOB_STOP.replace(b'""\n}', b'"n01"\n}'), NOW
        )
    assert exc.value.reason == "bad_job"
