"""The spool janitor (``kelvin spool orphans``) against a fake Kubernetes API server.

A real cluster cannot run here (no kube-apiserver, kind or k3s in the registries, no
container runtime for tests), so the API is :class:`~tests.collect_agent.fake_kube.FakeKube`
on loopback; everything else is real: the drain Job is the one the chart renders, and the
end-to-end test runs a real agent, the janitor as a real process, and the created Job's
container command as a real process on the agent's spool directory.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as kelvin
from services.collect_agent.janitor import Action, Janitor, drain_job, job_name
from services.collect_agent.kube_api import KubeApi, KubeApiError
from services.collect_agent.spool import Spool
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.collect_agent.agent_proc import ROOT, AgentProcess
from tests.collect_agent.fake_kube import FakeKube
from tests.collect_agent.test_drain import TS0, publish
from tests.collect_agent.test_orphans import left_behind
from tests.collect_agent.test_scaleout import blocked  # noqa: F401  (a fixture)

STS = "kelvin-collect-agent"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def template() -> Obj:
    """The drain Job as the chart renders it into the janitor's ConfigMap (default values)."""
    from tests.packaging.chart import ChartRenderer

    chart = ChartRenderer()
    try:
        cm = chart.render({}).get("ConfigMap", f"{STS}-janitor")
    finally:
        chart.close()
    job: Obj = json.loads(cm["data"]["drain-job.json"])
    return job


def claim(o: int) -> str:
    return f"spool-{STS}-{o}"


def pod(name: str, claims: list[str], phase: str = "Running", deleting: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T18:00:00Z"
    vols = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    return {"metadata": meta, "spec": {"volumes": vols}, "status": {"phase": phase}}


def finish(job: Obj, kind: str = "Complete") -> None:
    job["status"] = {"conditions": [{"type": kind, "status": "True"}]}


def cluster(kube: FakeKube, replicas: int, generation: int, ordinals: range) -> None:
    kube.put("apps/v1", "statefulsets",
             {"metadata": {"name": STS, "generation": generation}, "spec": {"replicas": replicas}})  # fmt: skip
    for o in ordinals:
        kube.put("v1", "persistentvolumeclaims", {"metadata": {"name": claim(o)}})
    for name in ("spool-kelvin-other-3", "kelvin-allocator-state"):  # not this StatefulSet's
        kube.put("v1", "persistentvolumeclaims", {"metadata": {"name": name}})
    for o in range(min(replicas, len(ordinals))):
        kube.put("v1", "pods", pod(f"{STS}-{o}", [claim(o)]))


def janitor(kube: FakeKube, template: Obj, token: str | None = None) -> Janitor:
    return Janitor(KubeApi(kube.url, "kelvin", kube.token_file(token)), STS, template)


def outcomes(actions: list[Action]) -> dict[int, str]:
    return {a.ordinal: a.outcome for a in actions}


def test_a_drain_job_for_each_claim_above_replicas_that_no_live_pod_mounts(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=2, generation=7, ordinals=range(5))
        kube.put("v1", "pods", pod(f"{STS}-3", [claim(3)], deleting=True))  # still draining
        kube.put("v1", "pods", pod("old-drain-x", [claim(4)], phase="Succeeded"))  # done long ago
        actions = janitor(kube, template).run()
        assert outcomes(actions) == {2: "created", 3: "mounted", 4: "created"}
        jobs = kube.jobs()
        assert sorted(jobs) == [f"{STS}-drain-2-g7", f"{STS}-drain-4-g7"]
        job = jobs[f"{STS}-drain-2-g7"]
        spec = job["spec"]["template"]["spec"]
        assert [v["persistentVolumeClaim"] for v in spec["volumes"] if v["name"] == "spool"] == [
            {"claimName": claim(2)}
        ]
        tspec = template["spec"]["template"]["spec"]
        assert spec["containers"] == tspec["containers"], "the chart's drain container, as is"
        assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "collect-agent-drain"
        assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kelvin-spool-janitor"
        assert "helm.sh/hook" not in job["metadata"]["annotations"]
        pvc_lists = [p for m, p in kube.calls if p.endswith("/persistentvolumeclaims")]
        assert len(pvc_lists) == 4, "seven claims listed two per page"


def test_a_second_run_creates_nothing_while_a_job_runs_or_after_it_finished(
    template: Obj,
) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=3, ordinals=range(3))
        j = janitor(kube, template)
        assert outcomes(j.run()) == {1: "created", 2: "created"}
        posts = kube.posts()
        assert outcomes(j.run()) == {1: "draining", 2: "draining"}  # their pods not yet up
        for job in kube.jobs().values():
            finish(job)
        assert outcomes(j.run()) == {1: "exists", 2: "exists"}
        assert kube.posts() == posts


def test_two_runs_at_once_a_409_is_success(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=1, ordinals=range(2))
        other: list[str] = []

        def another_janitor_first(job: Obj) -> None:  # the other run's POST lands first
            other.append(job["metadata"]["name"])
            kube.put("batch/v1", "jobs", json.loads(json.dumps(job)))

        kube.on_create = another_janitor_first
        (action,) = janitor(kube, template).run()
        assert action == Action(claim(1), 1, "exists", f"{STS}-drain-1-g1")
        assert list(kube.jobs()) == other == [f"{STS}-drain-1-g1"]


def test_an_ordinal_the_hpa_brings_back_during_the_run_gets_no_job(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=2, generation=4, ordinals=range(4))
        gets: list[str] = []

        def hpa_scales_up(gv: str, name: str) -> None:
            gets.append(name)
            if len(gets) == 2:  # after the first read, before the Jobs are made
                sts = kube.objects[("apps/v1", "statefulsets")][STS]
                sts["spec"]["replicas"], sts["metadata"]["generation"] = 4, 5

        kube.on_get = hpa_scales_up
        assert outcomes(janitor(kube, template).run()) == {2: "returned", 3: "returned"}
        assert kube.posts() == 0 and not kube.jobs()


def test_a_new_scale_down_gets_a_new_job_unless_one_still_runs(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=9, ordinals=range(3))
        # ordinal 1: drained at generation 8, came back and left again; 2: still draining
        done = kube.put("batch/v1", "jobs", drain_job(template, job_name(STS, 1, 8), claim(1)))
        finish(done)
        kube.put("batch/v1", "jobs", drain_job(template, job_name(STS, 2, 8), claim(2)))
        assert outcomes(janitor(kube, template).run()) == {1: "created", 2: "draining"}
        assert f"{STS}-drain-1-g9" in kube.jobs()


def test_a_failed_job_is_followed_by_another(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=5, ordinals=range(2))
        j = janitor(kube, template)
        assert outcomes(j.run()) == {1: "created"}
        finish(kube.jobs()[f"{STS}-drain-1-g5"], "Failed")  # its retries spent
        assert [a.job for a in j.run()] == [f"{STS}-drain-1-g5-r1"]
        finish(kube.jobs()[f"{STS}-drain-1-g5-r1"])
        assert outcomes(j.run()) == {1: "exists"}


def test_ordinals_that_start_above_zero(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=2, generation=1, ordinals=range(4))
        sts = kube.objects[("apps/v1", "statefulsets")][STS]
        sts["spec"]["ordinals"] = {"start": 2}  # runs ordinals 2 and 3
        kube.objects[("v1", "pods")].clear()
        kube.put("v1", "pods", pod(f"{STS}-2", [claim(2)]))
        kube.put("v1", "pods", pod(f"{STS}-3", [claim(3)]))
        assert outcomes(janitor(kube, template).run()) == {0: "created", 1: "created"}


def test_a_hook_drain_job_of_helm_upgrade_counts_as_draining(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=2, ordinals=range(2))
        kube.put("batch/v1", "jobs", drain_job(template, f"{STS}-drain-1", claim(1)))
        assert outcomes(janitor(kube, template).run()) == {1: "draining"}


def test_a_refused_token_is_a_clear_error(template: Obj) -> None:
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=1, ordinals=range(2))
        with pytest.raises(KubeApiError, match="401"):
            janitor(kube, template, token="wrong").run()


def test_kelvin_spool_orphans_dry_run_creates_nothing(
    template: Obj, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "drain-job.json"
    job_file.write_text(json.dumps(template))
    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=1, ordinals=range(2))
        args = ["spool", "orphans", "--statefulset", STS, "--job-template", str(job_file),
                "--api-server", kube.url, "--namespace", "kelvin",
                "--token-file", str(kube.token_file())]  # fmt: skip
        assert kelvin([*args, "--dry-run"]) == 0
        assert kube.posts() == 0
        assert json.loads(capsys.readouterr().out)["outcome"] == "would create"
        kube.token = "rotated"  # a refused token: a clear message, exit 1, no traceback
        assert kelvin(args) == 1
        assert "401" in capsys.readouterr().err


def test_a_broken_or_wrong_job_template_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["spool", "orphans", "--statefulset", STS, "--job-template"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"kind": "Job",\n')
    assert kelvin([*args, str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken}: line 2, column 1 is not valid YAML" in err and "Traceback" not in err
    assert kelvin([*args, str(tmp_path / "missing.json")]) == 2
    assert "cannot read the drain Job template: No such file" in capsys.readouterr().err
    (tmp_path / "pod.json").write_text('{"kind": "Pod"}')
    assert kelvin([*args, str(tmp_path / "pod.json")]) == 2
    assert "not a Job manifest" in capsys.readouterr().err


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl makes the test's certificate")
def test_in_a_pod_it_verifies_the_api_server_with_the_cluster_ca(
    template: Obj, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeKube(tls=True) as kube:
        cluster(kube, replicas=1, generation=1, ordinals=range(2))
        sa = tmp_path / "serviceaccount"  # as the chart's projected volume lays it out
        sa.mkdir()
        shutil.copy(kube.token_file(), sa / "token")
        (sa / "namespace").write_text("kelvin")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", kube.url.rsplit(":", 1)[1])
        shutil.copy(kube.other_ca(), sa / "ca.crt")
        with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
            Janitor(KubeApi.in_cluster(sa_dir=sa), STS, template).run()
        assert not kube.calls, "nothing reached a server it could not verify"
        shutil.copy(kube.ca, sa / "ca.crt")
        (action,) = Janitor(KubeApi.in_cluster(sa_dir=sa), STS, template).run()
        assert action.outcome == "created"


def test_job_names_stay_dns_labels() -> None:
    long = "x" * 60
    name = job_name(long, 12, 345)
    assert len(name) <= 63 and name.endswith("-drain-12-g345")
    assert name == job_name(long, 12, 345) != job_name("y" * 60, 12, 345)


def local_path(arg: str, mounts: dict[str, Path]) -> str:
    """``arg`` with the container path it names (if any) replaced by the local directory."""
    for path in sorted(mounts, key=len, reverse=True):
        if arg == path or arg.startswith(path + "/"):
            return str(mounts[path]) + arg[len(path) :]
    return arg


def kelvin_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow
async def test_a_scaled_down_agents_spool_is_drained_by_the_job_the_janitor_creates(
    tmp_path: Path,
    template: Obj,
    blocked: Path,  # noqa: F811
) -> None:
    # Ordinal 1 of two acknowledges readings while storage is unavailable, then the
    # StatefulSet is scaled to 1: SIGTERM, its drain time passes, its spool stays.
    agent = AgentProcess(tmp_path, "ordinal-1", blocked, drain_timeout_s=0.5).start()
    try:
        acked = await publish(agent.mqtt_port, "/janitor/s", 0, 100)
        await agent.until("spooled", lambda s: s["spool"]["pending_readings"] == acked)
        assert agent.terminate() == 0
    finally:
        agent.stop()
    assert list(agent.spool_dir.glob("spool-*.wal")), "its spool waits on the retained claim"

    with FakeKube() as kube:
        cluster(kube, replicas=1, generation=2, ordinals=range(2))
        token = kube.token_file()
        job_file = tmp_path / "drain-job.json"
        job_file.write_text(json.dumps(template))
        api = ("--api-server", kube.url, "--namespace", "kelvin", "--token-file", str(token))
        ran = kelvin_cli("spool", "orphans", "--statefulset", STS, "--job-template",
                         str(job_file), *api)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        (line,) = ran.stdout.splitlines()
        assert json.loads(line) == {"claim": claim(1), "ordinal": 1, "outcome": "created",
                                    "job": f"{STS}-drain-1-g2"}  # fmt: skip
        job = kube.jobs()[f"{STS}-drain-1-g2"]

    # The Job's container, as a process: its volumes' mount paths are local directories
    # (the claim it names is the agent's spool; the config a storage that works now).
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    db = tmp_path / "kelvin.sqlite"
    config = tmp_path / "config"
    config.mkdir()
    (config / "kelvin.yaml").write_text(f"storage:\n  sqlite:\n    path: {db}\n")
    local = {"config": config, "tmp": tmp_path}
    for v in spec["volumes"]:
        if v["name"] == "spool":
            assert v["persistentVolumeClaim"]["claimName"] == claim(1)
            local["spool"] = agent.spool_dir
    mounts = {m["mountPath"]: local[m["name"]] for m in container["volumeMounts"]}
    args = [local_path(a, mounts) for a in container["args"]]
    drained = kelvin_cli(*args)
    assert drained.returncode == 0, drained.stderr
    assert f"{acked} readings written, 0 left" in drained.stdout
    assert not list(agent.spool_dir.glob("spool-*.wal"))

    storage = SqliteStorage(SqliteSettings(path=db))
    await storage.open()
    try:
        ts = (await storage.read("/janitor/s", 0, 2**62)).timestamps_ns.tolist()
    finally:
        await storage.close()
    assert ts == [TS0 + k for k in range(acked)], "every acknowledged reading, once"


async def test_a_drain_job_on_a_spool_its_returned_agent_holds_exits_0_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ordinal came back before its drain Job's pod started: the Job leaves it alone."""
    spool_dir = tmp_path / "ordinal-2"
    written = await left_behind(spool_dir)
    agent = Spool(spool_dir)  # the returned agent holds it and replays it itself
    await agent.open()
    try:
        config = tmp_path / "kelvin.yaml"
        config.write_text(f"storage:\n  sqlite:\n    path: {tmp_path / 'k.sqlite'}\n")
        args = ["spool", "drain", str(spool_dir), "--config", str(config)]
        assert await asyncio.to_thread(kelvin, args) == 0
        assert "is held by another process" in capsys.readouterr().out
        assert agent.pending_readings == written, "nothing taken from the agent"
    finally:
        await agent.close()
