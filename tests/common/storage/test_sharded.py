"""Sharded specifics: routing by longest prefix, data on the right server, config errors."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.errors import ConfigError
from services.common.readings import Batch
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage import Child
from services.common.storage.settings import ShardedSettings
from services.common.storage.sharded import ShardedStorage, subset
from tests.support.influxdb import InfluxDB


def two_shards(servers: list[InfluxDB], db: str) -> ShardedSettings:
    a, b = servers
    return ShardedSettings(
        shards=[
            {"name": "a", "influxdb": a.settings(db).model_dump()},
            {"name": "b", "influxdb": b.settings(db).model_dump()},
        ],
        rules=[
            {"prefix": "/dc/row1", "shard": "b"},
            {"prefix": "/dc/row1/rack9", "shard": "a"},
        ],
    )


def test_longest_prefix_wins_and_default_is_first_shard(influx_servers: list[InfluxDB]) -> None:
    st = ShardedStorage(two_shards(influx_servers, "route"))
    assert st.shard_of("/dc/row1/rack0/n0") == "b"
    assert st.shard_of("/dc/row1/rack9/n0") == "a"
    assert st.shard_of("/dc/row1") == "b"
    assert st.shard_of("/dc/row10/x") == "a"  # a level, not a string prefix
    assert st.shard_of("/other") == "a"
    assert st.shards_under("/dc/row1/rack0") == ["b"]
    assert st.shards_under("/dc") == ["a", "b"]


async def test_readings_live_on_their_shard_and_listings_merge(
    influx_servers: list[InfluxDB],
) -> None:
    st = ShardedStorage(two_shards(influx_servers, "placement"))
    await st.open()
    names = ["/dc/row0/n0", "/dc/row1/rack0/n0", "/dc/row1/rack9/n0", "/dc/row1/rack0/n1"]
    await st.write(Batch.from_rows(names, np.arange(4), np.arange(4.0)))
    assert await st.shards["a"].sensors("/") == ["/dc/row0/n0", "/dc/row1/rack9/n0"]
    assert await st.shards["b"].sensors("/") == ["/dc/row1/rack0/n0", "/dc/row1/rack0/n1"]
    assert await st.children("/dc/row1") == [
        Child("/dc/row1/rack0", False, True),
        Child("/dc/row1/rack9", False, True),
    ]
    got = await st.read_many(names, 0, 10)
    assert [got[n].values.tolist() for n in names] == [[0.0], [1.0], [2.0], [3.0]]

    await st.put_metadata(SensorMetadata(name="/dc/row1/rack0/n0", unit="W"))
    assert await st.shards["b"].get_metadata("/dc/row1/rack0/n0") is not None
    assert await st.shards["a"].get_metadata("/dc/row1/rack0/n0") is None
    assert [m.name for m in await st.list_metadata("/dc")] == ["/dc/row1/rack0/n0"]

    await st.put_job(JobRecord(job_id="1", start_ns=5, nodes=("/dc/row1/rack0/n0",)))
    assert [j.job_id for j in await st.shards["a"].jobs()] == ["1"]  # jobs live on the default
    stats = await st.stats()
    assert stats["shards"]["b"]["sensors"] == 2 and stats["default_shard"] == "a"
    await st.close()


def test_subset_keeps_series_and_readings_aligned() -> None:
    batch = Batch.from_series(
        Batch.single(n, np.arange(k), np.arange(k) + 10 * i).series(0)
        for i, (n, k) in enumerate([("/a", 2), ("/b", 3), ("/c", 1)])
    )
    part = subset(batch, [0, 2])
    assert list(part.sensors) == ["/a", "/c"]
    assert part.offsets.tolist() == [0, 2, 3]
    assert part.values.tolist() == [0.0, 1.0, 20.0]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"shards": []}, "at least one shard"),
        ({"shards": [{"name": "a"}, {"name": "a"}]}, "duplicate"),
        ({"shards": [{"name": "a"}], "default": "z"}, "default: unknown shard 'z'"),
        ({"shards": [{"name": "a"}], "rules": [{"prefix": "/x", "shard": "q"}]}, r"rules\[0\]"),
        ({"shards": [{"name": "a"}], "rules": [{"prefix": "x+", "shard": "a"}]}, "prefix"),
    ],
)
def test_bad_configuration_names_the_key(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShardedStorage(ShardedSettings(**config))
