"""The embedded default backend: one SQLite file in WAL mode, readings in compressed chunks."""

from services.common.storage.sqlite.backend import SqliteStorage

__all__ = ["SqliteStorage"]
