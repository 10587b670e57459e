"""The backend's DDL, Native blocks and queries on current ClickHouse (chdb, in-process),
codecs and LowCardinality on; and its pure parts (error codes, batch slicing)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch
from services.common.storage.clickhouse import errors, native
from services.common.storage.clickhouse.schema import Features, Schema
from services.common.storage.settings import ClickHouseSettings

T0 = 1_700_000_000 * 10**9


def _session(path: Path):  # type: ignore[no-untyped-def]
    try:
        from chdb import session
    except ImportError:
        msg = "chdb (current ClickHouse in-process) not installed: pip install -e '.[test]'"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return session.Session(str(path))


def test_schema_native_insert_and_final_on_current_clickhouse(tmp_path: Path) -> None:
    sess = _session(tmp_path / "chdb")
    try:
        version = tuple(
            int(x)
            for x in str(sess.query("SELECT version()", "CSV")).strip().strip('"').split(".")[:2]
        )
        settings = ClickHouseSettings(database="modern", raw_ttl_s=86400 * 365 * 10)
        schema = Schema(settings, version)
        assert schema.f == Features(codecs=True, low_cardinality=True, ttl=True)
        for sql in schema.ddl():
            sess.query(sql)
        cols = str(
            sess.query(
                "SELECT name, type, compression_codec FROM system.columns "
                "WHERE database = 'modern' AND table = 'readings'",
                "TSV",
            )
        )
        assert "LowCardinality(String)" in cols and "Delta" in cols and "ZSTD" in cols
        # two writes of the same readings, the second with new values: last write wins
        names = [f"/dc/n{i}/power" for i in range(100)]
        per = 1000
        ts = np.tile(T0 + np.arange(per, dtype=np.int64) * 10**9, len(names))
        offsets = np.arange(0, len(ts) + 1, per, dtype=np.int64)
        cache = native.StringCache()
        for k, vs in enumerate((np.zeros(len(ts)), np.round(np.arange(len(ts)) * 0.01, 2))):
            f = tmp_path / f"b{k}.native"
            f.write_bytes(
                b"".join(
                    bytes(p) for p in native.readings_block(Batch(names, offsets, ts, vs), cache)
                )
            )
            sess.query(f"INSERT INTO modern.readings SELECT * FROM file('{f}', Native)")
        got = str(
            sess.query(
                "SELECT count(), sum(value) FROM modern.readings FINAL "
                f"WHERE sensor IN {native.literals(names)}",
                "TSV",
            )
        ).split()
        assert int(got[0]) == len(ts)
        assert float(got[1]) == pytest.approx(float(np.round(np.arange(len(ts)) * 0.01, 2).sum()))
        # the rollup views ran on the modern engine too
        cnt = str(sess.query("SELECT countMerge(cnt) FROM modern.readings_1h", "TSV")).strip()
        assert int(cnt) == 2 * len(ts)  # both writes counted (see rollups.py)
        sess.query("OPTIMIZE TABLE modern.readings FINAL")
        size = str(
            sess.query(
                "SELECT sum(data_compressed_bytes) / sum(rows) FROM system.parts "
                "WHERE database = 'modern' AND table = 'readings' AND active",
                "TSV",
            )
        ).strip()
        assert 0 < float(size) < 16  # compressed below the raw 16 bytes + name
    finally:
        sess.close()


def test_legacy_server_gets_plain_columns() -> None:
    ddl = "\n".join(Schema(ClickHouseSettings(cluster="c"), (18, 16, 1)).ddl())
    assert "CODEC" not in ddl and "LowCardinality" not in ddl and " TTL " not in ddl
    assert "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/kelvin/readings'" in ddl
    assert "Distributed(`c`, `kelvin`, `readings_local`, cityHash64(sensor))" in ddl


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (242, RetryableStorageError),  # table read-only: ZooKeeper away
        (285, RetryableStorageError),  # too few replicas for the quorum
        (319, RetryableStorageError),  # insert status unknown
        (279, RetryableStorageError),  # a shard unreachable
        (999, RetryableStorageError),
        (60, PermanentStorageError),
        (516, PermanentStorageError),
        (27, PermanentStorageError),
        (12345, PermanentStorageError),  # unknown: permanent, never a stalled pipeline
    ],
)
def test_error_codes_map_to_retry_rules(code: int, kind: type) -> None:
    text = f"Code: {code}, e.displayText() = DB::Exception: something"
    assert errors.code_of(text) == code
    err = errors.error("http://x", "insert", errors.code_of(text), 500, text)
    assert isinstance(err, kind) and f"code {code}" in str(err)
    assert errors.code_of("", "241") == 241  # header of newer servers wins
    assert isinstance(errors.error("u", "q", None, 503, "proxy"), RetryableStorageError)


def test_slice_batch_keeps_every_reading_in_order() -> None:
    b = Batch(["/a", "/b", "/c"], np.array([0, 5, 5, 12]), np.arange(12), np.arange(12.0))
    parts = native.slice_batch(b, 4)
    assert [len(p) for p in parts] == [4, 4, 4]
    assert np.concatenate([p.timestamps_ns for p in parts]).tolist() == list(range(12))
    flat = [s for p in parts for s in p for _ in range(len(s))]
    assert [s.sensor for s in flat] == ["/a"] * 5 + ["/c"] * 7


def test_literals_escape_what_sql_would_break_on() -> None:
    assert native.literal("a'b\\c\nd") == "'a\\'b\\\\c\\nd'"
    assert native.literals([]) == "('')"


def test_native_answers_decode_across_blocks_and_refuse_a_cut() -> None:
    def block(ts: list[int], vs: list[float]) -> bytes:
        n = len(ts)
        parts = native.block(
            n,
            [
                native.column("ts", "Int64", np.array(ts, "<i8").tobytes()),
                native.column("value", "Float64", np.array(vs, "<f8").tobytes()),
            ],
        )
        return b"".join(bytes(p) for p in parts)

    body = bytearray(block([5, 6], [0.5, 0.6]) + block([1, 2, 3], [0.1, 0.2, 0.3]))
    ts, vs = native.sorted_points(body)  # two partitions out of order: sorted here
    assert ts.tolist() == [1, 2, 3, 5, 6] and vs.tolist() == [0.1, 0.2, 0.3, 0.5, 0.6]
    with pytest.raises(ValueError, match="cut short"):
        native.native_points(body[:-3])
    assert len(native.native_points(bytearray())[0]) == 0
