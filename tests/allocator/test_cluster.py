"""Following a workload manager: the sync of nodes and jobs, placements, re-placement, restarts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.allocator.cluster import ClusterIn, ReportError, sync
from services.allocator.engine import Allocator
from services.allocator.jobs import ExternalJobsError, JobBook
from services.allocator.model import HallModel
from services.common.thermal import reference_hall

HALL = reference_hall()


def _book() -> tuple[JobBook, list[tuple[str, str]]]:
    book = JobBook(HallModel(HALL), Allocator("joint"), external=True)
    events: list[tuple[str, str]] = []
    book.listeners.append(lambda ev, job: events.append((ev, job.id)))
    return book, events


def _report(jobs: list[dict[str, Any]], states: dict[int, str] | None = None) -> ClusterIn:
    states = states or {}
    nodes = [{"index": i, "state": states.get(i, "idle")} for i in range(HALL.n_nodes)]
    return ClusterIn.model_validate({"nodes": nodes, "jobs": jobs})


def _pending(job_id: str, size: int, **kw: Any) -> dict[str, Any]:
    return {"id": job_id, "state": "pending", "managed": True, "size": size, **kw}


def test_waiting_jobs_are_placed_in_order_and_asking_again_gives_the_same_nodes() -> None:
    book, _ = _book()
    report = _report([_pending("10", 4), _pending("11", 6, comm_share=0.3)])
    first = sync(book, report, 1)
    assert [j.id for j in first.placements] == ["10", "11"]
    a, b = (set(j.nodes) for j in first.placements)
    assert len(a) == 4 and len(b) == 6 and not a & b
    assert all(j.placed_by == "joint" and j.state == "placed" for j in first.placements)
    again = sync(book, report, 2)
    assert [(j.id, j.nodes) for j in again.placements] == [
        (j.id, j.nodes) for j in first.placements
    ]
    assert not again.changed and not book.decisions[2:]  # no new decision the second time


def test_first_come_first_served_a_job_that_does_not_fit_blocks_the_ones_behind() -> None:
    book, _ = _book()
    running = {"id": "5", "state": "running", "nodes": list(range(30))}
    result = sync(book, _report([running, _pending("6", 12), _pending("7", 2)]), 1)
    assert not result.placements
    assert [(j.id, j.waiting_reason) for j in result.waiting] == [("6", "capacity"), ("7", "fcfs")]
    # the big one leaves: both fit now, in order
    result = sync(book, _report([_pending("6", 12), _pending("7", 2)]), 2)
    assert [j.id for j in result.placements] == ["6", "7"]


def test_a_job_slurm_placed_itself_holds_its_nodes_until_it_ends() -> None:
    book, events = _book()
    foreign = {"id": "3", "state": "running", "nodes": [0, 1, 2, 3], "user": "bob"}
    result = sync(book, _report([foreign, _pending("4", 36)]), 1)
    assert set(result.placements[0].nodes) == set(range(4, 40))
    job = book.jobs["3"]
    assert (job.state, job.placed_by, job.user) == ("running", "slurm", "bob")
    assert ("started", "3") in events
    # Slurm reports it ended: nodes free, the job finished at Slurm's end time
    sync(book, _report([{**foreign, "state": "ended", "end_ns": 42}, _pending("4", 36)]), 99)
    assert "3" not in book.jobs and book.get("3").finished_ns == 42
    assert ("finished", "3") in events
    assert book.state.free[[0, 1, 2, 3]].all()


def test_a_placed_job_starts_runs_and_ends_as_the_manager_reports() -> None:
    book, events = _book()
    nodes = sync(book, _report([_pending("8", 3)]), 1).placements[0].nodes
    assert ("started", "8") not in events  # placed is not started
    sync(
        book,
        _report(
            [{"id": "8", "state": "running", "managed": True, "nodes": nodes, "start_ns": 500}]
        ),
        2,
    )
    job = book.jobs["8"]
    assert (job.state, job.started_ns, job.placed_by) == ("running", 500, "joint")
    assert events == [("started", "8")]
    sync(book, _report([]), 3)  # vanished from the manager: ended
    assert book.get("8").state == "finished" and events[-1] == ("finished", "8")


def test_a_drained_node_places_its_job_again_elsewhere() -> None:
    book, _ = _book()
    first = sync(book, _report([_pending("9", 4)]), 1).placements[0].nodes
    drained = first[0]
    again = sync(book, _report([_pending("9", 4)], {drained: "drained"}), 2).placements[0].nodes
    assert drained not in again and len(again) == 4
    assert book.state.unavailable[drained] and not book.state.free[drained]


@pytest.mark.parametrize("state", ["drained", "draining", "down", "reserved", "completing"])
def test_nodes_the_manager_cannot_give_out_are_never_chosen(state: str) -> None:
    book, _ = _book()
    taken = {i: state for i in range(0, 40, 2)}
    placed = sync(book, _report([_pending("1", 20)], taken), 1).placements[0].nodes
    assert sorted(placed) == list(range(1, 40, 2))


def test_hall_nodes_the_manager_does_not_report_are_not_used() -> None:
    book, _ = _book()
    report = ClusterIn.model_validate(
        {"nodes": [{"index": i, "state": "idle"} for i in range(8)], "jobs": [_pending("1", 8)]}
    )
    assert sync(book, report, 1).placements[0].nodes == list(range(8))
    report = ClusterIn.model_validate(
        {"nodes": report.model_dump()["nodes"], "jobs": [_pending("1", 8), _pending("2", 1)]}
    )
    assert [j.waiting_reason for j in sync(book, report, 2).waiting] == ["capacity"]


def test_a_job_running_on_other_nodes_than_placed_is_followed_there() -> None:
    book, _ = _book()
    placed = sync(book, _report([_pending("2", 2), _pending("3", 2)]), 1).placements
    two, three = placed[0].nodes, placed[1].nodes
    # job 2 runs on job 3's nodes (an operator moved it): job 3 is placed again
    result = sync(
        book,
        _report(
            [{"id": "2", "state": "running", "managed": True, "nodes": three}, _pending("3", 2)]
        ),
        2,
    )
    assert book.jobs["2"].nodes == sorted(three) and book.jobs["2"].state == "running"
    new_three = result.placements[0].nodes
    assert not set(new_three) & set(three)
    assert book.state.free[two].sum() + len(set(two) & set(new_three)) == 2


def test_a_job_that_can_never_fit_is_reported_and_blocks_nobody() -> None:
    book, _ = _book()
    result = sync(book, _report([_pending("1", 41), _pending("2", 3)]), 1)
    assert result.unplaceable == [("1", "size 41: the hall has 40 nodes")]
    assert [j.id for j in result.placements] == ["2"]


def test_cancelled_waiting_and_placed_jobs_give_their_nodes_back() -> None:
    book, events = _book()
    sync(book, _report([_pending("1", 30), _pending("2", 20)]), 1)
    assert "2" in book.queue
    sync(book, _report([]), 2)
    assert not book.jobs and book.state.free.all()
    assert {book.get("1").state, book.get("2").state} == {"cancelled"}
    assert ("started", "1") not in events


def test_node_indices_outside_the_hall_are_refused() -> None:
    book, _ = _book()
    report = _report([{"id": "1", "state": "running", "nodes": [40]}])
    with pytest.raises(ReportError, match=r"node indices \[40\] outside the hall"):
        sync(book, report, 1)


def test_placements_survive_a_restart_of_the_allocator() -> None:
    book, _ = _book()
    report = _report([{"id": "1", "state": "running", "nodes": [0, 1]}, _pending("2", 5)])
    placed = sync(book, report, 1).placements[0].nodes
    doc = book.snapshot()
    again, _ = _book()
    again.restore(doc, 2)
    assert again.jobs["2"].state == "placed" and again.state.busy[placed].all()
    assert sync(again, report, 3).placements[0].nodes == placed
    assert again.state.busy[[0, 1]].all() and again.jobs["1"].placed_by == "slurm"


def test_jobs_cannot_be_submitted_to_an_allocator_that_follows_a_manager() -> None:
    book, _ = _book()
    with pytest.raises(ExternalJobsError, match="submit jobs there"):
        book.submit(2, 1)
    assert not np.any(book.state.busy)


def test_a_completing_job_gives_back_its_nodes_one_by_one_and_keeps_its_record() -> None:
    book, _ = _book()
    running = {"id": "4", "state": "running", "nodes": [0, 1, 2]}
    sync(book, _report([running]), 1)
    sync(book, _report([{**running, "nodes": [1]}]), 2)  # Slurm lists only the completing one
    assert book.state.free[[0, 2]].all() and not book.state.free[1]
    assert book.jobs["4"].nodes == [0, 1, 2]
    sync(book, _report([{**running, "state": "ended", "end_ns": 9}]), 3)
    assert book.get("4").nodes == [0, 1, 2] and book.state.free[[0, 1, 2]].all()


def test_a_start_known_more_exactly_later_corrects_the_jobs_record() -> None:
    book, events = _book()
    running = {"id": "6", "state": "running", "nodes": [3], "start_ns": 5_000_000_000}
    sync(book, _report([running]), 1)
    sync(book, _report([{**running, "start_ns": 4_723_456_789}]), 2)
    assert book.jobs["6"].started_ns == 4_723_456_789
    sync(book, _report([running]), 3)  # the bridge restarted: only Slurm's second again
    assert book.jobs["6"].started_ns == 4_723_456_789
    assert events == [("started", "6"), ("start_time", "6")]


def test_a_job_reported_running_again_just_after_it_ended_is_a_stale_report() -> None:
    """A restarted bridge has lost the epilog's exact end and reports the job a moment longer."""
    book, events = _book()
    old = {"id": "35", "state": "running", "nodes": [0, 1, 2, 3]}
    sync(book, _report([old]), 1)
    sync(book, _report([{**old, "state": "ended", "end_ns": 7}]), 2)
    # 38 on 35's old nodes, as the allocator would place it once they are free
    sync(book, _report([_pending("38", 4)]), 3)
    book.state.release("38")
    book.state.place("38", [0, 1, 2, 3], 3500.0)
    book.jobs["38"].nodes = placed = [0, 1, 2, 3]
    again = sync(book, _report([old, _pending("38", 4)]), 4)
    assert again.placements[0].nodes == placed and "35" not in book.jobs
    assert events.count(("started", "35")) == 1
