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
