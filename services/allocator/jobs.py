"""The online job book: submit, queue (FCFS), start, finish, cancel, snapshot/restore.

Pure logic with explicit clock arguments (``now_ns``), so the service, the
tests and a restart all drive it the same way. A job whose ``runtime_s`` is
set ends by itself at ``started + runtime`` (stretched by Lf when
``stretch``); without one it runs until deleted. The queue head blocks
everyone behind it (no backfilling). A head stalled by the reliability
constraint while nothing runs can never start and is rejected.

With ``external`` set, a workload manager owns the jobs: nothing is
submitted or timed here, and :mod:`services.allocator.cluster` places,
starts and ends jobs as the manager reports them.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from services.allocator.communication import runtime_stretch
from services.allocator.engine import Allocator, Decision
from services.allocator.model import HallModel
from services.allocator.state import HallState
from services.common.errors import KelvinError, NotFoundError

NS = 1_000_000_000
ENDED_KEPT = 10_000
MAX_RUNTIME_S = 1e9
"""Longest runtime a job may ask for (~31 years); past ~1e299 s its end in ns is not finite."""


@dataclass
class Job:
    """One job as the service tracks it."""

    id: str
    size: int
    comm_share: float
    submitted_ns: int
    runtime_s: float | None = None
    stretch: bool = False
    name: str | None = None
    state: str = "queued"
    """queued, placed (nodes chosen, waiting for the workload manager to start it), running,
    finished, cancelled or rejected."""
    waiting_reason: str | None = None
    started_ns: int | None = None
    ends_ns: int | None = None
    finished_ns: int | None = None
    nodes: list[int] = field(default_factory=list)
    node_power_w: float | None = None
    decision: dict[str, Any] | None = None
    placed_by: str | None = None
    """The policy that chose the nodes; ``slurm`` for a job its workload manager placed."""
    user: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Job:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


class ExternalJobsError(KelvinError):
    """A job was submitted to an allocator whose jobs come from a workload manager."""

    http_status = 409


Listener = Callable[[str, Job], None]
"""Called with ("started" | "finished" | "cancelled" | "rejected", job), and "start_time" when
a workload manager reports a running job's start more exactly."""


class JobBook:
    """Jobs, queue and hall occupancy of the online allocator."""

    def __init__(
        self, model: HallModel, allocator: Allocator, history: int = 200, external: bool = False
    ) -> None:
        self.external = external
        self.state = HallState(model)
        self.allocator = allocator
        self.jobs: dict[str, Job] = {}
        self.queue: deque[str] = deque()
        self.history: deque[Job] = deque(maxlen=max(history, 1))
        self.next_id = 1
        self.listeners: list[Listener] = []
        self.ended: OrderedDict[str, float] = OrderedDict()
        """Jobs that ended recently, with when (monotonic s): a late report of one is stale."""
        self.decisions: list[Decision] = []
        """Decisions since the caller last cleared the list (for metrics)."""

    @property
    def model(self) -> HallModel:
        return self.state.model

    def running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state == "running"]

    def placed(self) -> list[Job]:
        """Jobs whose nodes are chosen and held for them until their manager starts them."""
        return [j for j in self.jobs.values() if j.state == "placed"]

    def queued(self) -> list[Job]:
        return [self.jobs[i] for i in self.queue]

    def get(self, job_id: str) -> Job:
        if job_id in self.jobs:
            return self.jobs[job_id]
        for j in self.history:
            if j.id == job_id:
                return j
        raise NotFoundError(f"no job {job_id!r}")

    def submit(
        self,
        size: int,
        now_ns: int,
        runtime_s: float | None = None,
        comm_share: float = 0.0,
        stretch: bool = False,
        name: str | None = None,
    ) -> Job:
        """Queue a job and start what can start; ValueError if it can never fit the hall."""
        if self.external:
            raise ExternalJobsError(
                "the allocator follows a workload manager (allocator.cluster: external): "
                "submit jobs there (e.g. sbatch), not to the allocator"
            )
        present = int(self.model.present.sum())
        if not 1 <= size <= present:
            raise ValueError(
                f"size {size}: expected 1..{present} (nodes in hall {self.model.hall.name!r})"
            )
        if runtime_s is not None and not 0 < runtime_s <= MAX_RUNTIME_S:
            raise ValueError(f"runtime_s {runtime_s}: expected seconds in (0, {MAX_RUNTIME_S:g}]")
        job = Job(f"j{self.next_id}", size, comm_share, now_ns, runtime_s, stretch, name)
        self.next_id += 1
        self.jobs[job.id] = job
        self.queue.append(job.id)
        self.start_queued(now_ns)
        return job

    def dry_run(self, size: int, comm_share: float = 0.0) -> Decision:
        """What the policy would decide now, without placing anything."""
        return self.allocator.decide(self.state, size, comm_share)

    def start_queued(self, now_ns: int) -> list[Job]:
        started: list[Job] = []
        while self.queue and not self.external:
            job = self.jobs[self.queue[0]]
            d = self.allocator.decide(self.state, job.size, job.comm_share)
            self.decisions.append(d)
            job.decision = d.as_dict()
            if not d.placed:
                job.waiting_reason = d.reason
                if d.reason == "mttf" and not self.state.jobs:
                    self.queue.popleft()
                    self._close(job, "rejected", now_ns)
                    continue
                break
            assert d.choice is not None
            self.queue.popleft()
            self.state.place(job.id, d.choice.nodes, d.choice.node_power_w)
            job.state, job.waiting_reason, job.started_ns = "running", None, now_ns
            job.placed_by = d.policy
            job.nodes, job.node_power_w = d.choice.nodes, d.choice.node_power_w
            if job.runtime_s is not None:
                factor = runtime_stretch(job.comm_share, d.choice.lf) if job.stretch else 1.0
                job.ends_ns = now_ns + round(job.runtime_s * factor * NS)
            started.append(job)
            self._emit("started", job)
        return started

    def cancel(self, job_id: str, now_ns: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            self.get(job_id)  # NotFoundError for unknown ids
            raise ValueError(f"job {job_id!r} already ended ({self.get(job_id).state})")
        if job.state == "running":
            self.state.release(job.id)
        else:
            self.queue.remove(job.id)
        self._close(job, "cancelled", now_ns)
        self.start_queued(now_ns)
        return job

    def expire(self, now_ns: int) -> list[Job]:
        """Finish every running job whose time is up, then start what can start.

        A job ends at its ``ends_ns`` (also when the service was down then), not
        when this runs: its record and the job data published say when it ended.
        """
        done = [j for j in self.running() if j.ends_ns is not None and j.ends_ns <= now_ns]
        for job in sorted(done, key=lambda j: (j.ends_ns or 0, j.id)):
            self.state.release(job.id)
            self._close(job, "finished", job.ends_ns or now_ns)
        if done:
            self.start_queued(now_ns)
        return done

    def next_end_ns(self) -> int | None:
        ends = [j.ends_ns for j in self.running() if j.ends_ns is not None]
        return min(ends) if ends else None

    def set_model(self, model: HallModel) -> None:
        self.state.rebind(model)

    def close(self, job: Job, how: str, now_ns: int) -> None:
        """End ``job`` (its nodes already released): ``finished``, ``cancelled`` or ``rejected``."""
        self._close(job, how, now_ns)

    def emit(self, event: str, job: Job) -> None:
        self._emit(event, job)

    def _close(self, job: Job, how: str, now_ns: int) -> None:
        job.state, job.finished_ns = how, now_ns
        self.jobs.pop(job.id, None)
        self.history.append(job)
        self.ended[job.id] = time.monotonic()
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        self._emit(how, job)

    def ended_within(self, job_id: str, seconds: float) -> bool:
        """Whether ``job_id`` ended here less than ``seconds`` ago (by this process's clock)."""
        at = self.ended.get(job_id)
        return at is not None and time.monotonic() - at < seconds

    def _emit(self, event: str, job: Job) -> None:
        for listener in self.listeners:
            listener(event, job)

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": 1,
            "next_id": self.next_id,
            "policy": self.allocator.policy_name,
            "jobs": [self.jobs[i].to_dict() for i in self._order()],
            "history": [j.to_dict() for j in self.history],
        }

    def _order(self) -> list[str]:
        holding = [j for j in self.jobs.values() if j.state in ("running", "placed")]
        running = sorted(holding, key=lambda j: (j.started_ns or j.submitted_ns, j.id))
        return [j.id for j in running] + list(self.queue)

    def restore(self, doc: dict[str, Any], now_ns: int) -> None:
        """Rebuild from :meth:`snapshot`: running jobs take their nodes back, the queue its order."""
        self.next_id = int(doc.get("next_id", 1))
        for raw in doc.get("history", []):
            self.history.append(Job.from_dict(raw))
        for raw in doc.get("jobs", []):
            job = Job.from_dict(raw)
            self.jobs[job.id] = job
            if job.state in ("running", "placed"):
                power = float(job.node_power_w or 0.0)
                self.state.place(job.id, job.nodes, power, observed=job.state == "running")
            else:
                self.queue.append(job.id)
        self.expire(now_ns)
        self.start_queued(now_ns)
