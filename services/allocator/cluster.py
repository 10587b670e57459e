"""Following a workload manager: its report of nodes and jobs in, placements out.

With ``allocator.cluster: external`` a bridge (``kelvin run slurm-bridge``)
reports what the manager sees — every node's state and every job that holds
or waits for hall nodes — in ``POST /api/v1/cluster/sync``; :func:`sync`
makes the job book agree with it and answers with a placement for each
managed job that waits. The manager's report is the truth: the private busy
set of the internal mode has no say here.

A sync is idempotent and safe to repeat after a restart of either side:

- a job the manager runs holds exactly the nodes it runs on (a managed job
  Kelvin placed becomes ``running`` there; any other job is recorded as
  placed by ``slurm``); a completing job gives back each node the manager
  no longer lists (its record keeps every node it ran on); a job that ended
  or vanished releases its nodes;
- a node that is not idle and not running a reported job (drained, down,
  reserved, completing, or allocated to a job outside the report), and a
  hall node the report leaves out, is unavailable: never given out;
- a placement stands while all its nodes stay available and no other job
  runs on them, so asking again returns the same nodes; otherwise the job is
  placed again (a drained node re-places its job);
- waiting managed jobs are placed in the order given (first come, first
  served: a job that does not fit makes the ones behind it wait); a job that
  can never fit the hall is reported ``unplaceable`` and does not block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from services.allocator.jobs import Job, JobBook
from services.allocator.state import HallState
from services.common.errors import KelvinError

log = logging.getLogger(__name__)

NodeState = Literal["idle", "allocated", "drained", "draining", "down", "reserved", "completing"]
FOREIGN = "slurm"
NS = 1_000_000_000
STALE_RUNNING_S = 30.0
"""A job reported running within this long after it ended here is a stale report (a requeued
job that runs again later is followed as usual)."""
"""``placed_by`` of a job the workload manager placed itself."""


class ReportError(KelvinError, ValueError):
    """A report that does not fit the hall (node indices outside it)."""

    http_status = 422


class ModeError(KelvinError):
    """A report sent to an allocator that runs its own jobs."""

    http_status = 409


class NodeIn(BaseModel):
    """One hall node as the manager sees it."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    state: NodeState
    reason: str | None = Field(None, max_length=400)


class JobIn(BaseModel):
    """One job that holds or waits for hall nodes."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=64)
    state: Literal["pending", "running", "ended"]
    managed: bool = False
    """Kelvin places it (held until then); otherwise the manager placed it."""
    size: int = Field(1, ge=1)
    comm_share: float = Field(0.0, ge=0, le=1)
    time_limit_s: float | None = Field(None, gt=0)
    nodes: list[int] = []
    """Running: the hall nodes it runs on."""
    submit_ns: int | None = Field(None, ge=0)
    start_ns: int | None = Field(None, ge=0)
    end_ns: int | None = Field(None, ge=0)
    user: str | None = Field(None, max_length=200)
    name: str | None = Field(None, max_length=200)


class ClusterIn(BaseModel):
    """The manager's view of the hall, in its scheduling order (``jobs``)."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field("slurm", max_length=64)
    nodes: list[NodeIn]
    jobs: list[JobIn] = []


@dataclass
class SyncResult:
    """What the manager should do: run each placed job on its nodes; the others wait."""

    placements: list[Job] = field(default_factory=list)
    waiting: list[Job] = field(default_factory=list)
    unplaceable: list[tuple[str, str]] = field(default_factory=list)
    changed: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "placements": [
                {"id": j.id, "nodes": j.nodes, "policy": j.placed_by, "decision": j.decision}
                for j in self.placements
            ],
            "waiting": [{"id": j.id, "reason": j.waiting_reason} for j in self.waiting],
            "unplaceable": [{"id": i, "reason": r} for i, r in self.unplaceable],
        }


def sync(book: JobBook, report: ClusterIn, now_ns: int) -> SyncResult:
    """Make ``book`` agree with the manager's ``report``; placements for its waiting jobs."""
    state = book.state
    n = state.model.n
    bad = [x.index for x in report.nodes if x.index >= n] + [
        i for j in report.jobs for i in j.nodes if not 0 <= i < n
    ]
    if bad:
        raise ReportError(f"node indices {sorted(set(bad))[:10]} outside the hall (0..{n - 1})")
    result = SyncResult()
    seen = {j.id: j for j in report.jobs}
    _end_vanished(book, seen, now_ns, result)
    for r in report.jobs:
        if r.state == "running" and r.nodes:
            _follow_running(book, r, now_ns, result)
    _mark_unavailable(state, report)
    _drop_invalid_placements(book, result)
    _place_waiting(book, [r for r in report.jobs if r.state == "pending" and r.managed], result)
    return result


def _end_vanished(book: JobBook, seen: dict[str, JobIn], now_ns: int, result: SyncResult) -> None:
    """Jobs that ended, or that the manager no longer reports, give their nodes back."""
    for job in list(book.jobs.values()):
        r = seen.get(job.id)
        if job.state == "queued":
            if r is None or r.state != "pending":
                if job.id in book.queue:
                    book.queue.remove(job.id)
                book.close(job, "cancelled", now_ns)
                result.changed = True
            continue
        if r is not None and r.state != "ended":
            continue
        book.state.release(job.id)
        ended = (r.end_ns if r is not None else None) or now_ns
        how = "finished" if job.state == "running" else "cancelled"
        log.info("allocator: job %s %s (nodes %s)", job.id, how, job.nodes)
        book.close(job, how, ended)
        result.changed = True


def _follow_running(book: JobBook, r: JobIn, now_ns: int, result: SyncResult) -> None:
    """A running job holds exactly the nodes it runs on."""
    state = book.state
    nodes = sorted(set(r.nodes))
    job = book.jobs.get(r.id)
    if job is None and book.ended_within(r.id, STALE_RUNNING_S):
        # It ended here a moment ago: a report that still shows it running is older than ours
        # (a bridge restarted while the job completed), not a job on those nodes again.
        return
    if job is not None and job.state == "running":
        if _more_exact(r.start_ns, job.started_ns):
            # a start known to the nanosecond now (the prolog's notification came later)
            job.started_ns = r.start_ns
            book.emit("start_time", job)
            result.changed = True
        held = state.jobs[job.id].tolist()
        if held == nodes:
            return
        if set(nodes) <= set(held):  # completing: Slurm frees its nodes one by one
            state.shrink(job.id, nodes)
            result.changed = True
            return
    # A placement made for another job on these nodes is void: that job is placed again.
    for other in {state.owner[i] for i in nodes} - {None, r.id}:
        assert other is not None
        victim = book.jobs[other]
        state.release(other)
        if victim.state == "running":  # the manager moved on without telling: it ended
            book.close(victim, "finished", now_ns)
        else:
            log.warning(
                "allocator: job %s runs on %s, which job %s was placed on; placing %s again",
                r.id,
                nodes,
                other,
                other,
            )
            victim.state, victim.nodes = "queued", []
    if job is not None and r.id in state.jobs:
        state.release(r.id)
    if job is None:
        job = Job(r.id, len(nodes), r.comm_share, r.submit_ns or now_ns, r.time_limit_s)
        job.name, job.user = r.name, r.user
        job.placed_by = FOREIGN if not r.managed else None
        book.jobs[job.id] = job
    elif job.state == "placed" and job.nodes != nodes:
        log.warning("allocator: job %s placed on %s runs on %s", job.id, job.nodes, nodes)
    model = state.model
    power = (
        job.node_power_w
        if job.state == "placed" and job.nodes == nodes and job.node_power_w
        else model.power.busy_w(r.comm_share, model.lf(np.array(nodes)))
    )
    state.place(job.id, nodes, float(power), observed=True)
    was_running = job.state == "running"
    job.state, job.waiting_reason, job.nodes, job.node_power_w = "running", None, nodes, power
    if not was_running:
        job.started_ns = r.start_ns or now_ns
        book.emit("started", job)
    result.changed = True


def _more_exact(new: int | None, old: int | None) -> bool:
    """Whether ``new`` refines ``old``: a whole second (Slurm's) replaced by a time within it
    known to the nanosecond (never the other way, e.g. after the bridge restarted)."""
    if not new or not old or new == old:
        return False
    return old % NS == 0 and new % NS != 0 and abs(new - old) < 5 * NS


def _mark_unavailable(state: HallState, report: ClusterIn) -> None:
    """Nodes the manager cannot give out, allocated nodes no reported job holds, and
    hall nodes the manager does not report (not part of its cluster)."""
    down = np.ones(state.model.n, dtype=bool)
    for x in report.nodes:
        down[x.index] = False
        if x.state != "idle" and not (x.state == "allocated" and state.owner[x.index]):
            down[x.index] = True
    state.unavailable = down


def _drop_invalid_placements(book: JobBook, result: SyncResult) -> None:
    """A placement whose nodes became unavailable is void: its job is placed again."""
    state = book.state
    for job in book.placed():
        if bool(state.unavailable[job.nodes].any()):
            lost = [i for i in job.nodes if state.unavailable[i]]
            log.warning(
                "allocator: job %s: nodes %s became unavailable; placing it again", job.id, lost
            )
            state.release(job.id)
            job.state, job.nodes = "queued", []
            result.changed = True


def _place_waiting(book: JobBook, waiting: list[JobIn], result: SyncResult) -> None:
    """Place the manager's waiting jobs in its order; the first that does not fit blocks."""
    state, allocator = book.state, book.allocator
    present = int(state.model.present.sum())
    book.queue.clear()
    blocked = False
    for r in waiting:
        job = book.jobs.get(r.id)
        if job is None:
            job = Job(r.id, r.size, r.comm_share, r.submit_ns or 0, r.time_limit_s)
            job.name, job.user = r.name, r.user
            book.jobs[job.id] = job
            result.changed = True
        if job.state == "placed":
            result.placements.append(job)
            continue
        if job.state == "running":  # reported pending again (requeued): its nodes are free
            state.release(job.id)
            job.state, job.nodes = "queued", []
        job.size, job.comm_share, job.runtime_s = r.size, r.comm_share, r.time_limit_s
        if not 1 <= r.size <= present:
            result.unplaceable.append((r.id, f"size {r.size}: the hall has {present} nodes"))
            job.waiting_reason = "unplaceable"
            continue
        book.queue.append(job.id)
        if blocked:
            job.waiting_reason = "fcfs"
            result.waiting.append(job)
            continue
        d = allocator.decide(state, r.size, r.comm_share)
        book.decisions.append(d)
        job.decision = d.as_dict()
        if not d.placed or d.choice is None:
            if d.reason == "mttf" and not state.jobs:
                result.unplaceable.append((r.id, "mttf: too hot even on an idle hall"))
                job.waiting_reason = "unplaceable"
                book.queue.remove(job.id)
                continue
            job.waiting_reason = d.reason
            result.waiting.append(job)
            blocked = True
            continue
        book.queue.remove(job.id)
        state.place(job.id, d.choice.nodes, d.choice.node_power_w)
        job.state, job.waiting_reason, job.placed_by = "placed", None, d.policy
        job.nodes, job.node_power_w = d.choice.nodes, d.choice.node_power_w
        log.info("allocator: job %s placed by %s on %s", job.id, d.policy, job.nodes)
        result.placements.append(job)
        result.changed = True
