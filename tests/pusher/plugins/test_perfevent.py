"""perfevent against the real kernel: software counters here, hardware where exposed.

Counting system-wide per CPU is allowed to root; the refusal for an
unprivileged user is checked in a child process that drops to ``nobody``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import KelvinError
from services.pusher.plugins.perfevent import online_cpus
from tests.pusher.conftest import build_plugin

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="system-wide per-CPU counters need root")


@needs_root
async def test_software_counters_per_cpu_grow() -> None:
    plugin, (group,) = await build_plugin(
        "perfevent", {"events": ["cpu-clock", "context-switches"]}
    )
    cpus = online_cpus()
    assert [s.name for s in group.sensors][: len(cpus)] == [
        f"/t/perfevent/cpu{c}/cpu-clock" for c in cpus
    ]
    assert group.sensors[0].options.delta, "counters are published as deltas by default"
    first = np.asarray(group.read(0))
    deadline = time.perf_counter() + 0.02
    while time.perf_counter() < deadline:  # keep this CPU busy so that its clock advances
        pass
    second = np.asarray(group.read(0))
    assert (second[: len(cpus)] > first[: len(cpus)]).all(), "cpu-clock (ns) advances on every CPU"
    group.close()
    await plugin.close()


@needs_root
async def test_hardware_counters_where_the_machine_exposes_a_pmu() -> None:
    try:
        _, groups = await build_plugin("perfevent", {"events": ["instructions"]})
    except KelvinError as exc:
        pytest.skip(f"no hardware PMU exposed here: {exc}")
    (group,) = groups
    a = np.asarray(group.read(0))
    b = np.asarray(group.read(0))
    assert (b >= a).all() and b.sum() > a.sum()
    group.close()


async def test_unknown_event_is_a_config_error() -> None:
    from services.common.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown event 'cyclez'"):
        await build_plugin("perfevent", {"events": ["cyclez"]})


@needs_root
def test_refusal_names_perf_event_paranoid_and_the_fix() -> None:
    paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    if paranoid <= 0:
        pytest.skip("perf_event_paranoid <= 0 here: an unprivileged user is allowed")
    code = (
        "import asyncio, os\n"
        "import services.pusher.plugins.perfevent\n"
        "from tests.pusher.conftest import build_plugin\n"
        "os.setgid(65534); os.setuid(65534)  # after the imports: nobody cannot read them\n"
        "try:\n"
        "    asyncio.run(build_plugin('perfevent', {'events': ['cpu-clock']}))\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), timeout=60
    )
    assert f"kernel.perf_event_paranoid is {paranoid}" in out.stdout, out.stderr
    assert "CAP_PERFMON" in out.stdout
