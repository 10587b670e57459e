"""gpfs from recorded mmpmon output (there is no GPFS cluster on test machines)."""

from __future__ import annotations

import pytest

from services.common.errors import ConfigError
from tests.pusher.conftest import FIXTURES, build_plugin, by_name

MMPMON = str(FIXTURES / "gpfs" / "fake-mmpmon")


async def test_gpfs_per_file_system_counters_from_mmpmon() -> None:
    plugin, (group,) = await build_plugin("gpfs", {"command": [MMPMON, "-p", "-s"]})
    values = by_name(group, await group.read_async(0))
    assert values["/t/gpfs/scratch/bytes_read"] == 91268055040
    assert values["/t/gpfs/home/writes"] == 2345
    assert len(values) == 16
    by = {s.name: s for s in group.sensors}
    assert by["/t/gpfs/home/bytes_written"].unit == "B" and by["/t/gpfs/home/opens"].monotonic
    await plugin.close()


async def test_gpfs_node_totals_and_file_source() -> None:
    _, (group,) = await build_plugin("gpfs", {"command": [MMPMON, "-p", "-s"], "request": "io_s"})
    assert by_name(group, await group.read_async(0))["/t/gpfs/all/inode_updates"] == 10230
    _, (from_file,) = await build_plugin(
        "gpfs", {"file": str(FIXTURES / "gpfs" / "mmpmon-fs_io_s.txt"), "filesystems": ["home"]}
    )
    assert [s.name.rsplit("/", 1)[1] for s in from_file.sensors][:2] == [
        "bytes_read",
        "bytes_written",
    ]
    assert (await from_file.read_async(0))[0] == 734003200


async def test_gpfs_errors_are_precise() -> None:
    with pytest.raises(ConfigError, match="reports no file system work; it reports home, scratch"):
        await build_plugin("gpfs", {"command": [MMPMON, "-p", "-s"], "filesystems": ["work"]})
    with pytest.raises(ConfigError, match="either 'command' or 'file'"):
        await build_plugin("gpfs", {"command": ["x"], "file": "y"})
