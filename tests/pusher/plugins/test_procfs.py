"""procfs against the checked-in fake /proc tree."""

from __future__ import annotations

import pytest

from services.common.errors import ConfigError
from tests.pusher.conftest import FIXTURES, build_plugin, by_name

PROC = str(FIXTURES / "proc")


async def test_meminfo_vmstat_and_stat_per_cpu() -> None:
    _, (mem, vm, stat) = await build_plugin("procfs", {"root": PROC})
    m = by_name(mem, mem.read(0))
    assert (
        m["/t/procfs/meminfo/MemFree"] == 8123456 and m["/t/procfs/meminfo/Active(anon)"] == 2345678
    )
    units = {s.name.rsplit("/", 1)[1]: s.unit for s in mem.sensors}
    assert units["MemTotal"] == "KiB" and units["HugePages_Total"] is None
    mono = {s.name.rsplit("/", 1)[1]: s.monotonic for s in vm.sensors}
    assert mono["pgfault"] and mono["nr_dirtied"] and not mono["nr_free_pages"]
    st = by_name(stat, stat.read(0))
    hz = 1 / stat.sensors[0].metadata(1000).scale
    assert st["/t/procfs/cpu1/system"] == pytest.approx(306173 / hz)
    assert st["/t/procfs/cpu/idle"] == pytest.approx(98765432 / hz)
    assert st["/t/procfs/stat/procs_running"] == 3 and st["/t/procfs/stat/ctxt"] == 987654321
    assert len([k for k in st if k.startswith("/t/procfs/cpu0/")]) == 10


async def test_selections() -> None:
    section = {
        "root": PROC,
        "files": ["meminfo", "stat"],
        "meminfo": ["MemFree", "Dirty"],
        "cpus": False,
        "cpu_fields": ["user", "idle"],
    }
    _, (mem, stat) = await build_plugin("procfs", section)
    assert [s.name for s in mem.sensors] == ["/t/procfs/meminfo/MemFree", "/t/procfs/meminfo/Dirty"]
    names = [s.name for s in stat.sensors]
    assert "/t/procfs/cpu/user" in names and not any("/cpu0/" in n for n in names)
    assert "/t/procfs/cpu/system" not in names


async def test_unknown_keys_and_a_missing_root_are_precise_errors() -> None:
    with pytest.raises(ConfigError, match=r"has no key\(s\) Swap"):
        await build_plugin("procfs", {"root": PROC, "meminfo": ["Swap"]})
    with pytest.raises(ConfigError, match="cannot read /nonexistent/meminfo"):
        await build_plugin("procfs", {"root": "/nonexistent"})
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.procfs\.files\.0: expected"):
        await build_plugin("procfs", {"files": ["cpuinfo"]})
