"""The ClickHouse backend (one server, or a replicated and sharded cluster)."""

from services.common.storage.clickhouse.backend import ClickHouseStorage

__all__ = ["ClickHouseStorage"]
