"""A real Slurm cluster on loopback, from Debian's packages, started once per test session.

munged (its own key and socket), slurmctld, one ``slurmd -N <name>`` per node
(each on its own port, all on 127.0.0.1) and slurmrestd with JWT
(``SLURM_JWT=daemon``, run as ``nobody``: it refuses root). Two partitions
over the same nodes: ``kelvin`` (the default; the shipped job_submit.lua
holds and marks its jobs) and ``direct`` (Slurm places those itself). The
PrologSlurmctld/EpilogSlurmctld is the shipped ``kelvin-notify.sh``; a test
points its ``kelvin-notify.conf`` at the bridge it starts.

Missing packages skip the tests with the reason (fail under ``CI=true``);
``scripts/install-peers.sh`` installs them. The cluster lives in a
world-readable directory under /tmp (slurmrestd, as nobody, reads
slurm.conf there; pytest's own temporary directories are private).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.slurm_bridge.install import write_files
from tests.support.servers import free_port, require_binary, wait_port

PLUGIN_DIRS = [Path(p) for p in sorted(glob.glob("/usr/lib/*/slurm-wlm"))]
PACKAGES = "slurmctld slurmd slurm-client slurmrestd munge slurm-wlm-jwt-plugin"
NODES = 12
NOBODY = "nobody"


def _require_plugin(name: str, package: str) -> None:
    if not any((d / name).exists() for d in PLUGIN_DIRS):
        msg = f"Slurm plugin {name} not installed (Debian package {package})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


class SlurmCluster:
    """munged + slurmctld + ``nodes`` slurmd + slurmrestd, with helpers to drive it."""

    def __init__(self, nodes: int = NODES) -> None:
        self.bins = {
            name: require_binary(name, pkg)
            for name, pkg in [
                ("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                ("slurmrestd", "slurmrestd"), ("scontrol", "slurm-client"),
                ("sbatch", "slurm-client"), ("squeue", "slurm-client"), ("sinfo", "slurm-client"),
            ]
        }  # fmt: skip
        _require_plugin("auth_jwt.so", "slurm-wlm-jwt-plugin")
        _require_plugin("job_submit_lua.so", "slurm-wlm-basic-plugins")
        self.names = [f"n{i:02d}" for i in range(1, nodes + 1)]
        self.dir = Path(tempfile.mkdtemp(prefix="kelvin-slurm-"))
        os.chmod(self.dir, 0o755)
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.jwt_key = self.dir / "jwt_hs256.key"
        self.rest_port = free_port()
        self.rest_url = f"http://127.0.0.1:{self.rest_port}"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> SlurmCluster:
        munge = self.dir / "munge"
        munge.mkdir()
        os.chmod(munge, 0o755)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        self.jwt_key.write_bytes(secrets.token_bytes(32))
        os.chmod(self.jwt_key, 0o600)
        self._spawn(
            "munged",
            [self.bins["munged"], "-F", "-f", f"--key-file={key}", f"--socket={munge}/sock",
             f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed"],
        )  # fmt: skip
        self._wait_file(munge / "sock")
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir()
        self._write_conf(munge / "sock")
        self.notify_conf(None)
        self._spawn("slurmctld", [self.bins["slurmctld"], "-D", "-c", "-f", str(self.conf)])
        for name in self.names:
            self._spawn(
                f"slurmd-{name}", [self.bins["slurmd"], "-D", "-N", name, "-f", str(self.conf)]
            )
        self.wait(lambda: self.idle_nodes() == len(self.names), 30, "every node idle")
        self._spawn(
            "slurmrestd",
            [self.bins["slurmrestd"], "-s", "openapi/v0.0.38", "-a", "rest_auth/jwt",
             f"127.0.0.1:{self.rest_port}"],
            user=NOBODY,
            env={"SLURM_JWT": "daemon"},
        )  # fmt: skip
        wait_port(self.rest_port, proc=self.procs[-1], timeout=15)
        return self

    def _write_conf(self, munge_socket: Path) -> None:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
            "CPUs=1 RealMemory=100 State=UNKNOWN"
            for n in self.names
        )
        self.conf.write_text(
            f"""ClusterName=kelvintest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={self.jwt_key}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/spool/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobSubmitPlugins=lua
PrologSlurmctld={d}/kelvin-notify.sh
EpilogSlurmctld={d}/kelvin-notify.sh
KillWait=2
{nodes}
PartitionName=kelvin Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=direct Nodes=ALL MaxTime=INFINITE State=UP
"""
        )
        os.chmod(self.conf, 0o644)

    def notify_conf(
        self, bridge_url: str | None, token_file: Path | None = None, wake_port: int | None = None
    ) -> None:
        """Point the prolog/epilog (and the Lua's UDP wake-up) at a bridge (None: at nobody).

        slurmctld reloads job_submit.lua when the file changes."""
        write_files(
            self.dir,
            bridge_url or "http://127.0.0.1:9",
            partitions=["kelvin"],
            default_partition="kelvin",
            operators=[0],
            token_file=token_file,
            wake=("127.0.0.1", wake_port) if wake_port else None,
        )

    def _spawn(
        self, what: str, argv: list[str], user: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        log = open(self.dir / f"{what}.out", "wb")  # noqa: SIM115
        kwargs: dict[str, Any] = {}
        if user is not None:
            pw = pwd.getpwnam(user)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
            cwd=self.dir, **kwargs,
        )  # fmt: skip
        log.close()
        self.procs.append(proc)

    @staticmethod
    def _wait_file(path: Path, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear")
            time.sleep(0.02)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ driving it

    def run(self, *args: str, user: str | None = None, check: bool = True) -> str:
        """A Slurm command (by name) with this cluster's SLURM_CONF; stdout."""
        argv = [self.bins.get(args[0], args[0]), *args[1:]]
        kwargs: dict[str, Any] = {}
        if user is not None:
            pw = pwd.getpwnam(user)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        r = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=30, cwd="/tmp", **kwargs
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout if r.returncode == 0 else r.stderr

    def sbatch(self, nodes: int, *extra: str, seconds: float = 1.0, user: str | None = None) -> str:
        """Submit ``sleep seconds`` on ``nodes`` nodes; the job id."""
        out = self.run(
            "sbatch", "--parsable", "-N", str(nodes), "-o", "/dev/null", "-D", "/tmp",
            *extra, "--wrap", f"sleep {seconds}", user=user,
        )  # fmt: skip
        return out.strip().split(";")[0]

    def jobs(self) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.run("squeue", "--json", "--states=all"))
        return {str(j["job_id"]): j for j in doc["jobs"]}

    def nodes(self) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.run("sinfo", "--json"))
        return {n["name"]: n for n in doc["nodes"]}

    def idle_nodes(self) -> int:
        with contextlib.suppress(RuntimeError, ValueError):
            return sum(
                1 for n in self.nodes().values() if n["state"] == "idle" and not n["state_flags"]
            )
        return 0

    def cancel_all(self) -> None:
        """Cancel every job and wait until every node is idle again (between tests)."""
        for user in ("root", NOBODY):
            self.run("scancel", "-u", user, check=False)
        self.wait(lambda: self.idle_nodes() == len(self.names), 30, "every node idle")

    def log(self, name: str) -> str:
        """A daemon's log (``slurmctld.log``, ``slurmd-n01.log``)."""
        return (self.dir / "log" / name).read_text(errors="replace")

    def hostnames(self, hostlist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", hostlist).split()

    @staticmethod
    def wait(check: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
        """Poll ``check`` until it returns something truthy (an event outside this process)."""
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout} s")
            time.sleep(step)


class Bridge:
    """One ``kelvin run slurm-bridge`` process; its log lines are kept across restarts."""

    def __init__(
        self, workdir: Path, settings: dict[str, Any], auth: dict[str, Any] | None = None
    ) -> None:
        self.workdir = workdir
        self.settings = settings
        self.auth = auth or {}
        """Its ``auth`` section (e.g. the token file of the ``kelvin up`` it works with)."""
        self.port = int(settings["port"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self, **changes: Any) -> Bridge:
        conf = self.workdir / f"bridge-{self.runs}.yaml"
        doc = {"slurm_bridge": {**self.settings, **changes}, "auth": self.auth}
        conf.write_text(yaml.safe_dump({k: v for k, v in doc.items() if v}))
        self.log = self.workdir / f"bridge-{self.runs}.log"
        self.runs += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "run",
                    "slurm-bridge",
                    "--config",
                    str(conf),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
            )
        wait_port(self.port, proc=self.proc, timeout=30)
        deadline = time.monotonic() + 30
        while httpx.get(f"{self.url}/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bridge not ready:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else int(self.proc.returncode)
        self.proc.send_signal(signal.SIGTERM)
        return int(self.proc.wait(30))

    def actions(self, run: int | None = None) -> list[tuple[str, str]]:
        """(job id, action) of every side effect every run of the bridge (or run number
        ``run``, from 0) logged."""
        found = []
        for i in range(self.runs) if run is None else [run]:
            for line in (self.workdir / f"bridge-{i}.log").read_text().splitlines():
                if "slurm bridge: job " in line and ": " in line.split("slurm bridge: job ", 1)[1]:
                    job, rest = line.split("slurm bridge: job ", 1)[1].split(": ", 1)
                    found.append((job, rest.split(" ", 1)[0]))
        return found

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One real Slurm for the whole session (see the module docstring)."""
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
