"""The image, built and run for real: podman (or buildah) builds every Dockerfile target
offline from a local Debian base (``scripts/image-base.sh``), and the services run from
the release image as uid 10001 on a read-only root filesystem, as the chart runs them.

Where podman or buildah is installed it runs with every test (about a minute, a few
more the first time, for the base; ``KELVIN_IMAGE_TEST=0`` leaves it out). Elsewhere it
skips with the reason, also under ``CI=true``: ``make image-test`` installs the tools
and runs it alone (``KELVIN_IMAGE_TEST=1``), and then a missing tool fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.packaging.chart import ROOT, ChartRenderer
from tests.support.servers import free_port, wait_port

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        os.environ.get("KELVIN_IMAGE_TEST") == "0",
        reason="KELVIN_IMAGE_TEST=0: the container image is not built",
    ),
]

BASE = "localhost/kelvin-base:bookworm"
# Tags of this checkout's own: two checkouts testing at once must not run each other's image.
_CHECKOUT = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
RELEASE = f"localhost/kelvin:image-test-{_CHECKOUT}"
DEV = f"localhost/kelvin:image-test-{_CHECKOUT}-dev"
# runc: crun refuses this kind of host's cgroups. Lower rlimits than the host's: podman's
# defaults are higher than an unprivileged container manager may set here.
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def _tool() -> str:
    for tool in ("podman", "buildah"):
        if shutil.which(tool):
            return tool
    reason = "neither podman nor buildah is installed (`make image-test` installs podman)"
    if os.environ.get("KELVIN_IMAGE_TEST") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _build(tool: str, target: str, tag: str) -> None:
    cmd = [*PODMAN, "build"] if tool == "podman" else ["buildah", "--runtime", "runc", "bud"]
    done = subprocess.run(
        [*cmd, "--build-arg", f"PYTHON_IMAGE={BASE}", "--target", target, "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{target}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def images() -> Iterator[str]:
    tool = _tool()
    if not shutil.which("podman"):
        pytest.skip("running the image needs podman (buildah alone only builds it)")
    base = subprocess.run([str(ROOT / "scripts" / "image-base.sh"), BASE], capture_output=True)
    assert base.returncode == 0, base.stderr.decode()[-2000:]
    _build(tool, "release", RELEASE)
    _build(tool, "dev", DEV)
    yield RELEASE


def _run(image: str, *args: str, user: str = "10001:10001", opts: tuple[str, ...] = ()) -> str:
    done = subprocess.run(
        [*PODMAN, "run", "--rm", *LIMITS, "--read-only", "--user", user, *opts, image, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_every_target_builds_and_runs_as_10001_on_a_read_only_root(images: str) -> None:
    assert _run(RELEASE, "--version").startswith("kelvin ")
    out = subprocess.run(
        [*PODMAN, "image", "inspect", RELEASE, "--format", "{{.Config.User}}"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "10001:10001"
    assert "ipmitool version" in _run(RELEASE, "-V", opts=("--entrypoint", "ipmitool"))
    # The dev target: its entrypoint restarts kelvin on a change; here it only has to exist.
    assert "watchfiles" in _run(DEV, "/usr/local/bin/kelvin-dev", opts=("--entrypoint", "cat"))


def test_the_pusher_node_setup_step_works_in_the_image(
    images: str, chart: ChartRenderer, tmp_path: Path
) -> None:
    """The init container's script, rendered by the chart, run in the image as root with
    only the capabilities the chart grants, on a host directory mounted where the chart
    mounts it, twice (pod restarts)."""
    rendered = chart.render({"pusher": {"stateHostPath": "/var/lib/kelvin/pusher"}})
    inits = rendered.workload("pusher")["spec"]["template"]["spec"]["initContainers"]
    (init,) = [c for c in inits if c["name"] == "node-setup"]  # (mqtt-credentials: no root)
    caps = [f"--cap-add={c}" for c in init["securityContext"]["capabilities"]["add"]]
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    for _ in range(2):
        _run(
            RELEASE,
            *init["command"][1:],
            *init["args"],
            user="0:0",
            opts=(
                "--cap-drop=ALL",
                *caps,
                "-v",
                f"{state}:/host/pusher-state",
                "--entrypoint",
                init["command"][0],
            ),
        )
    st = state.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 10001, 0o750)


def test_the_services_run_from_the_image_as_the_chart_runs_them(
    images: str, tmp_path: Path
) -> None:
    ports = {k: free_port() for k in ("agent", "mqtt", "query", "allocator", "pusher")}
    data = tmp_path / "data"
    dirs = {name: tmp_path / name for name in ("spool", "allocator", "pusher")}
    for d in (data, *dirs.values()):
        d.mkdir()
        os.chown(d, 10001, 10001)  # as fsGroup/the init step make the chart's volumes
    local = "127.0.0.1"
    # As the chart gives them (from its Secret): every service the same tokens, the
    # publishers an MQTT login (here the write and admin tokens, as `kelvin up` does).
    tokens = {f"{role}_token": secrets.token_urlsafe(32) for role in ("read", "write", "admin")}
    config = {
        "auth": tokens,
        "storage": {"sqlite": {"path": "/var/lib/kelvin/data/kelvin.sqlite"}},
        "collect_agent": {
            "host": local,
            "port": ports["agent"],
            "mqtt_port": ports["mqtt"],
            "spool_dir": "/var/lib/kelvin/spool",
        },
        "query_api": {
            "host": local,
            "port": ports["query"],
            "collect_agent_url": f"http://{local}:{ports['agent']}",
            "allocator_url": f"http://{local}:{ports['allocator']}",
        },
        "allocator": {
            "host": local,
            "port": ports["allocator"],
            "state_dir": "/var/lib/kelvin/allocator",
            "brokers": [f"{local}:{ports['mqtt']}"],
            "query_api_url": f"http://{local}:{ports['query']}",
            "mqtt_username": "kelvin-allocator",
            "mqtt_password": tokens["admin_token"],
        },
        "pusher": {
            "host": local,
            "port": ports["pusher"],
            "brokers": [f"{local}:{ports['mqtt']}"],
            "state_dir": "/var/lib/kelvin/pusher",
            "prefix": "/image",
            "mqtt_username": "kelvin-pusher",
            "mqtt_password": tokens["write_token"],
            "plugins": {"tester": {"sensors": 3, "interval_ms": 500}},
        },
    }
    cfg = tmp_path / "kelvin.yaml"
    cfg.write_text(yaml.safe_dump(config))
    volumes = [
        "-v", f"{cfg}:/etc/kelvin/kelvin.yaml:ro",
        "-v", f"{data}:/var/lib/kelvin/data",
        *(x for n, d in dirs.items() for x in ("-v", f"{d}:/var/lib/kelvin/{n}")),
    ]  # fmt: skip
    names = []
    try:
        for service, port in (
            ("collect-agent", ports["agent"]),
            ("query-api", ports["query"]),
            ("allocator", ports["allocator"]),
            ("pusher", ports["pusher"]),
        ):
            name = f"kelvin-image-test-{service}-{port}"
            subprocess.run(
                [*PODMAN, "run", "-d", "--name", name, *LIMITS, "--read-only",
                 "--tmpfs", "/tmp", "--user", "10001:10001", "--cap-drop=ALL",
                 "--security-opt", "no-new-privileges", "--network", "host", *volumes,
                 RELEASE, "run", service, "--config", "/etc/kelvin/kelvin.yaml"],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
            names.append(name)
            wait_port(port, timeout=60)
            assert _get(f"http://{local}:{port}/healthz")[0] == 200, service
        for service in ("agent", "query"):
            assert _get(f"http://{local}:{ports[service]}/readyz")[0] == 200, service
        # The pusher's readings go through the agent's spool into SQLite and come back
        # from the query API: every service wrote only to its volumes.
        deadline = time.monotonic() + 60
        while True:
            status, body = _get(
                f"http://{local}:{ports['query']}/api/v1/sensors?prefix=/image",
                tokens["read_token"],
            )
            if status == 200 and body and body.get("children"):
                break
            assert time.monotonic() < deadline, f"no pusher readings in the query API: {body}"
            time.sleep(0.2)
        assert any(p.name.startswith("spool") or p.name == "lock" for p in dirs["spool"].iterdir())
    finally:
        logs = {}
        for name in names:
            out = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True)
            logs[name] = out.stdout[-2000:] + out.stderr[-2000:]
            subprocess.run([*PODMAN, "rm", "-f", "-t", "5", name], capture_output=True)
        print(json.dumps(logs, indent=1))
