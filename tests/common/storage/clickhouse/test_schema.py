"""Opening an existing ClickHouse database: tables checked, not created (a real server)."""

from __future__ import annotations

import itertools

import pytest

from services.common.errors import PermanentStorageError
from services.common.storage.clickhouse import ClickHouseStorage
from tests.support.clickhouse import ClickHouse

_dbs = itertools.count()


async def test_a_table_of_the_wrong_shape_is_refused_naming_the_columns(
    clickhouse_server: ClickHouse,
) -> None:
    db = f"shape_{next(_dbs)}"
    st = ClickHouseStorage(clickhouse_server.settings(db))
    await st.open()
    await st.close()
    clickhouse_server.query(f"ALTER TABLE {db}.readings MODIFY COLUMN value Float32")
    again = ClickHouseStorage(clickhouse_server.settings(db, create_tables=False))
    with pytest.raises(PermanentStorageError, match="needs columns value Float64; it has"):
        await again.open()


async def test_lists_of_many_sensors_stay_below_the_query_size_limit(
    clickhouse_server: ClickHouse,
) -> None:
    """10k names of ~40 bytes are ~400 KiB of SQL, past ClickHouse's 256 KiB max_query_size."""
    import time

    import numpy as np

    from services.common.readings import Batch

    st = ClickHouseStorage(clickhouse_server.settings(f"many_{next(_dbs)}"))
    await st.open()
    try:
        names = [f"/dc/row{i // 1000:02d}/rack{i % 1000:04d}/node/power_w" for i in range(10_000)]
        t0 = 1_700_000_000 * 10**9
        since = time.time_ns() - 1
        await st.write(
            Batch.from_rows(names, np.full(len(names), t0), np.arange(len(names), dtype=np.float64))
        )
        got = await st.read_many(names, t0, t0 + 1)
        assert sum(len(s) for s in got.values()) == len(names)
        assert await st.modified_since(names, since) == dict.fromkeys(names, t0)
    finally:
        await st.close()
