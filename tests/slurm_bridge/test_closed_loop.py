"""Kelvin places a real Slurm's jobs: sbatch -> held -> allocator -> nodes set, released -> run.

One Slurm (12 nodes), one ``kelvin up`` and one bridge for the whole module
(conftest.py); each test leaves the cluster idle for the next.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.slurm_bridge.conftest import Stack, slurm_name
from tests.support.slurm import NOBODY


@pytest.fixture
def idle(stack: Stack) -> Stack:
    stack.idle()
    return stack


def _policy(stack: Stack, job_id: str) -> str | None:
    placed_by: str | None = stack.allocator_job(job_id).get("placed_by")
    return placed_by


def test_mixed_jobs_run_on_exactly_the_nodes_kelvin_chose(idle: Stack) -> None:
    notified = "kelvin_slurm_bridge_notifications_total"
    events = ("submit", "start", "end")
    before = {e: idle.bridge.metric(f'{notified}{{event="{e}"}}') for e in events}
    rng = np.random.default_rng(14)
    sizes = [int(s) for s in rng.integers(1, 5, 22)]
    ids = [
        idle.cluster.sbatch(n, f"--comment=kelvin:comm={rng.uniform(0, 0.4):.2f}", seconds=0.5)
        for n in sizes
    ]
    jobs = idle.wait_done(ids, timeout=90)
    for job_id, size in zip(ids, sizes, strict=True):
        job = jobs[job_id]
        assert job["job_state"] == "COMPLETED", (job_id, job["job_state"], job["state_reason"])
        ran_on = idle.slurm_nodes(job)
        assert len(ran_on) == size
        assert ran_on == idle.kelvin_nodes(job_id), f"job {job_id} ran elsewhere"
        assert idle.cluster.hostnames(job["required_nodes"]) == ran_on
        assert _policy(idle, job_id) == "joint"
        # the allocator hears of the end from the epilog's hint or the bridge's next poll
        # (1 s): after Slurm's COMPLETED, not with it
        idle.cluster.wait(
            lambda j=job_id: idle.allocator_job(j)["state"] == "finished",
            30,
            f"job {job_id} finished in the allocator",
        )
    # each job was released once and never held again or moved
    actions = idle.bridge.actions()
    for job_id in ids:
        mine = [a for j, a in actions if j == job_id]
        assert mine.count("release") == 1 and "hold" not in mine, (job_id, mine)

    # the Lua's UDP wake-up at each submit, the prolog's start and the epilog's end arrive
    # (hints only: on a loaded machine a few miss their 3 s, and polling covers them)
    def arrived() -> dict[str, float] | None:
        got = {e: idle.bridge.metric(f'{notified}{{event="{e}"}}') - before[e] for e in events}
        return got if all(n >= len(ids) for n in got.values()) else None

    try:
        idle.cluster.wait(arrived, 5, "notifications")
    except TimeoutError:
        got = {e: idle.bridge.metric(f'{notified}{{event="{e}"}}') - before[e] for e in events}
        assert all(n >= len(ids) // 2 for n in got.values()), got


def test_a_job_slurm_placed_itself_occupies_its_nodes(idle: Stack) -> None:
    c = idle.cluster
    direct = c.sbatch(4, "-p", "direct", "-w", "n01,n02,n03,n04", seconds=2.5)
    c.wait(lambda: c.jobs()[direct]["job_state"] == "RUNNING", 20, "direct job running")
    fits = c.sbatch(8, seconds=0.5)
    waits = c.sbatch(3, seconds=0.5)
    jobs = idle.wait_done([fits], timeout=30)
    assert idle.slurm_nodes(jobs[fits]) == [slurm_name(i) for i in range(4, 12)]
    # three more nodes are only free once the direct job or the 8-node one ends
    jobs = idle.wait_done([direct, waits], timeout=30)
    assert jobs[waits]["start_time"] >= min(jobs[direct]["end_time"], jobs[fits]["end_time"])
    assert idle.slurm_nodes(jobs[waits]) == idle.kelvin_nodes(waits)
    assert _policy(idle, direct) == "slurm" and _policy(idle, fits) == "joint"


def test_a_user_cannot_release_or_retarget_a_kelvin_job(idle: Stack) -> None:
    c = idle.cluster
    blocker = c.sbatch(12, "-p", "direct", seconds=2)
    c.wait(lambda: c.jobs()[blocker]["job_state"] == "RUNNING", 20, "blocker running")
    job = c.sbatch(2, seconds=0.5, user=NOBODY)
    assert c.jobs()[job]["priority"] == 0  # held by the Lua at submit
    for attempt in (
        ["scontrol", "release", job],
        ["scontrol", "update", f"JobId={job}", "ReqNodeList=n01,n02"],
        ["scontrol", "update", f"JobId={job}", "NumNodes=1"],
        ["scontrol", "update", f"JobId={job}", "Partition=direct"],
    ):
        out = c.run(*attempt, user=NOBODY, check=False)
        assert "Access/permission denied" in out, (attempt, out)
    record = c.jobs()[job]
    assert record["priority"] == 0 and not record["required_nodes"]
    # submitting with nodes of one's own choosing is refused too
    refused = c.run("sbatch", "-N", "1", "-w", "n05", "--wrap", "true", user=NOBODY, check=False)
    assert "Kelvin places the jobs of this partition" in refused
    # once the blocker ends, Kelvin places it, and the user cannot move it then either
    c.wait(lambda: c.jobs()[job]["priority"] != 0, 30, "placed after the blocker")
    out = c.run("scontrol", "hold", job, user=NOBODY, check=False)
    assert "Access/permission denied" in out or c.jobs()[job]["job_state"] != "PENDING"
    assert "kelvin: refused uid 65534: hold or release job" in c.log("slurmctld.log")
    jobs = idle.wait_done([job])
    assert jobs[job]["job_state"] == "COMPLETED"
    assert idle.slurm_nodes(jobs[job]) == idle.kelvin_nodes(job)


def test_a_job_whose_chosen_node_is_drained_is_placed_again(idle: Stack) -> None:
    c = idle.cluster
    gate = c.sbatch(1, "-p", "direct", "-w", "n12", seconds=2)
    c.wait(lambda: c.jobs()[gate]["job_state"] == "RUNNING", 20, "gate running")
    # released onto Kelvin's nodes, but it cannot start before the gate job ends
    job = c.sbatch(2, f"--dependency=afterany:{gate}", seconds=0.5)

    def released() -> list[str] | None:
        rec = c.jobs()[job]
        return (
            c.hostnames(rec["required_nodes"])
            if rec["priority"] and rec["required_nodes"]
            else None
        )

    first = c.wait(released, 20, "first placement")
    drained = first[0]
    c.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=kelvin-test")
    try:
        second = c.wait(
            lambda: (n := released()) and drained not in n and n, 20, "placed again elsewhere"
        )
        jobs = idle.wait_done([gate, job])
        assert jobs[job]["job_state"] == "COMPLETED"
        assert idle.slurm_nodes(jobs[job]) == second == idle.kelvin_nodes(job)
        assert drained not in idle.slurm_nodes(jobs[job])
        assert idle.bridge.metric("kelvin_slurm_bridge_replacements_total") >= 1
    finally:
        c.run("scontrol", "update", f"NodeName={drained}", "State=RESUME")


def test_the_bridge_killed_mid_stream_loses_no_job_and_places_none_twice(idle: Stack) -> None:
    c, bridge = idle.cluster, idle.bridge
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in rng.integers(1, 6, 14)]
    ids = [c.sbatch(n, seconds=1) for n in sizes]
    c.wait(
        lambda: sum(j["job_state"] == "COMPLETED" for j in _of(c.jobs(), ids)) >= 3, 30, "3 done"
    )
    killed = bridge.runs - 1  # (the bridge has served the tests before this one)
    bridge.kill()
    now = c.jobs()
    held = sorted(j for j in ids if now[j]["priority"] == 0)
    assert held, "nothing left to place after the kill"
    bridge.start(slurm_api="commands", slurm_conf=str(c.conf))  # and through scontrol this time
    jobs = idle.wait_done(ids, timeout=90)
    for job_id, size in zip(ids, sizes, strict=True):
        assert jobs[job_id]["job_state"] == "COMPLETED" and jobs[job_id]["restart_cnt"] == 0
        assert idle.slurm_nodes(jobs[job_id]) == idle.kelvin_nodes(job_id)
        assert len(idle.slurm_nodes(jobs[job_id])) == size
    # Slurm's state at the kill says which jobs the first run released: the second run
    # releases exactly the others, once each. (The first run's log may lack the line of
    # a release the kill cut off right after it happened: what Slurm did is the truth.)
    first = [j for j, a in bridge.actions(run=killed) if a == "release" and j in ids]
    second = [j for j, a in bridge.actions(run=killed + 1) if a == "release" and j in ids]
    assert sorted(second) == held, "the restarted bridge releases what was held, once each"
    assert len(set(first)) == len(first) and not set(first) & set(held)
    decided = [j for j in ids if idle.allocator_job(j)["placed_by"] == "joint"]
    assert decided == ids


def _of(jobs: dict[str, dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    return [jobs[i] for i in ids]
