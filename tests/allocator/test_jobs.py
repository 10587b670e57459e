"""The job book with explicit clocks: FCFS without backfilling, expiry, restore, cancel."""

from __future__ import annotations

import pytest

from services.allocator.communication import runtime_stretch
from services.allocator.engine import Allocator
from services.allocator.jobs import NS, JobBook
from services.allocator.model import HallModel
from services.common.errors import NotFoundError
from services.common.thermal import reference_hall


def _book(policy: str = "first-fit", mttf: float = 0.0) -> JobBook:
    return JobBook(HallModel(reference_hall()), Allocator(policy, min_mttf_years=mttf))


def test_head_of_queue_blocks_smaller_jobs_behind_it() -> None:
    book = _book()
    a = book.submit(30, 0)
    b = book.submit(20, 0)
    c = book.submit(2, 0)  # would fit, but FCFS without backfilling
    assert (a.state, b.state, c.state) == ("running", "queued", "queued")
    assert b.waiting_reason == "capacity"
    book.cancel(a.id, 5)
    assert (b.state, c.state) == ("running", "running")
    assert a.state == "cancelled" and book.get(a.id).finished_ns == 5


def test_runtime_expiry_and_lf_stretch() -> None:
    book = _book("mpit")
    job = book.submit(6, 0, runtime_s=100.0, comm_share=0.3, stretch=True)
    lf = job.decision["lf"]
    assert job.ends_ns == round(100.0 * runtime_stretch(0.3, lf) * NS)
    assert book.next_end_ns() == job.ends_ns
    assert book.expire(job.ends_ns - 1) == []
    assert book.expire(job.ends_ns) == [job] and job.state == "finished"
    assert book.state.busy.sum() == 0


def test_restore_takes_nodes_back_and_finishes_what_ended_meanwhile() -> None:
    book = _book()
    short = book.submit(4, 0, runtime_s=10.0)
    long = book.submit(8, 0)
    waiting = book.submit(30, 0)
    doc = book.snapshot()
    again = _book()
    again.restore(doc, now_ns=20 * NS)
    assert again.get(short.id).state == "finished"
    assert again.get(short.id).finished_ns == 10 * NS  # when it ended, not when we came back
    assert again.get(long.id).nodes == long.nodes and again.get(long.id).state == "running"
    assert again.get(waiting.id).state == "running"  # the short job's nodes came free
    assert again.next_id == book.next_id


def test_cancel_errors() -> None:
    book = _book()
    with pytest.raises(NotFoundError):
        book.cancel("j99", 0)
    job = book.submit(1, 0)
    book.cancel(job.id, 1)
    with pytest.raises(ValueError, match="already ended"):
        book.cancel(job.id, 2)
    with pytest.raises(ValueError, match=r"expected 1\.\.40"):
        book.submit(41, 0)
    with pytest.raises(ValueError, match=r"runtime_s inf: expected seconds"):
        book.submit(1, 0, runtime_s=float("inf"))
    assert not book.running() and not book.queue


def test_a_job_that_can_never_meet_the_mttf_bound_is_rejected() -> None:
    book = _book("first-fit", mttf=100.0)
    job = book.submit(2, 0)
    assert job.state == "rejected" and job.waiting_reason == "mttf"
    assert not book.queue
