"""The pusher's ``node-setup`` init container, run for real: its rendered script as root
with exactly the capabilities the chart grants it (``setpriv`` bounding set), on a real
host directory, twice (a pod restart finds the directory already handed over)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.packaging.chart import ChartRenderer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv"
)

STATE = "/host/pusher-state"
"""Where the init container mounts the state directory."""


def _setup(chart: ChartRenderer) -> tuple[str, list[str]]:
    rendered = chart.render({"pusher": {"stateHostPath": "/var/lib/kelvin/pusher"}})
    inits = rendered.workload("pusher")["spec"]["template"]["spec"]["initContainers"]
    (init,) = [c for c in inits if c["name"] == "node-setup"]  # (mqtt-credentials: no root)
    sc = init["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"]["drop"] == ["ALL"]
    return init["args"][0], sc["capabilities"]["add"]


def _host_dir(tmp_path: Path) -> Path:
    """As the kubelet's DirectoryOrCreate leaves the host path: root's, 0755."""
    state = tmp_path / "pusher"
    state.mkdir(mode=0o755)
    return state


def _run(script: str, caps: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in caps)])
    return subprocess.run(
        [
            "setpriv",
            f"--bounding-set={bounding}",
            "--inh-caps=-all",
            "--",
            "sh",
            "-ec",
            script.replace(STATE, str(state)),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_state_dir_setup_works_with_the_granted_capabilities_and_again_after_a_restart(
    chart: ChartRenderer, tmp_path: Path
) -> None:
    script, caps = _setup(chart)
    state = _host_dir(tmp_path)
    for start in ("first start", "restart"):
        done = _run(script, caps, state)
        assert done.returncode == 0, f"{start}: {done.stderr}"
        st = state.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 10001, 0o750), start


def test_chown_alone_is_not_enough_which_is_why_the_chart_adds_fowner(
    chart: ChartRenderer, tmp_path: Path
) -> None:
    script, _ = _setup(chart)
    state = _host_dir(tmp_path)
    done = _run(script, ["CHOWN"], state)
    assert done.returncode != 0 and "Operation not permitted" in done.stderr
