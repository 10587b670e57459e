"""The reconcile loop: Slurm's jobs and nodes (observed) against the allocator's placements (desired).

One round reads Slurm, reports what it saw to the allocator
(``POST /api/v1/cluster/sync``), and makes every managed pending job agree
with the placement that comes back:

=========================  ================================  =============================
job in Slurm               allocator says                    the bridge does
=========================  ================================  =============================
held                       nodes N                           set ReqNodeList=N, release
held                       wait                              nothing (it stays held)
released, ReqNodeList = N  nodes N                           nothing (Slurm starts it)
released, ReqNodeList != N nodes N (placed again)            hold, set N, release
released or never held     wait                              hold
=========================  ================================  =============================

Every step is idempotent and decided from what Slurm shows *now*, so a
round can stop anywhere (crash, SIGTERM, kill -9) and the next one, in this
process or a restarted one, finishes the job without doing anything twice:
the allocator's placement for a job id stands until its nodes become
unavailable, and Slurm's own state says which steps are done. The bridge
keeps no state of its own beyond the notification times below.

Rounds run every ``poll_interval_s`` and at once when the shipped
PrologSlurmctld/EpilogSlurmctld script reports a job start or end (which
also gives the start and end to the nanosecond, where Slurm keeps seconds)
or the shipped job_submit.lua's UDP datagram says a job was submitted.
When Slurm or the allocator does not answer, the round ends and the jobs
stay as they are (held jobs stay held): nothing blocks slurmctld, nothing
is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from services.common.logs import RateLimitedLog
from services.common.tasks import wait_event
from services.slurm_bridge.allocator import AllocatorClient, AllocatorError
from services.slurm_bridge.client import SlurmClient, SlurmError, Snapshot
from services.slurm_bridge.metrics import BridgeMetrics
from services.slurm_bridge.model import SlurmJob
from services.slurm_bridge.nodemap import HallLayout, NodeMap
from services.slurm_bridge.settings import Settings

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, period_s=30)

NS = 1_000_000_000
NOTIFIED_KEEP = 10_000
"""Notification times kept (oldest forgotten first)."""
NOTIFY_MATCH_NS = 5 * NS
MIN_ROUND_GAP_S = 0.02
END_GRACE_NS = 2 * NS
"""How long after Slurm's (whole-second) end an ended job waits for the epilog's exact time."""
"""A notification this close to Slurm's (whole-second) start or end time gives its exact time."""


def _order(job: SlurmJob) -> tuple[int, int, str]:
    """First come, first served: submit time, then job id."""
    return (job.submit_s, int(job.id) if job.id.isdigit() else 0, job.id)


class Reconciler:
    """Observed Slurm state against desired placements, one idempotent round at a time."""

    def __init__(
        self,
        settings: Settings,
        slurm: SlurmClient,
        allocator: AllocatorClient,
        metrics: BridgeMetrics,
    ) -> None:
        self.settings = settings
        self.slurm = slurm
        self.allocator = allocator
        self.metrics = metrics
        self.nodemap: NodeMap | None = None
        self.wake = asyncio.Event()
        self.notified: OrderedDict[str, dict[str, int]] = OrderedDict()
        self.status: dict[str, Any] = {"ready": False, "reason": "starting"}
        self.rounds = 0

    # ------------------------------------------------------------ notifications

    def notify(self, event: str, job_id: str, ts_ns: int | None = None) -> None:
        """A job started or ended (PrologSlurmctld/EpilogSlurmctld): remember when, wake up."""
        times = self.notified.setdefault(job_id, {})
        times.setdefault(event, ts_ns or time.time_ns())
        self.notified.move_to_end(job_id)
        while len(self.notified) > NOTIFIED_KEEP:
            self.notified.popitem(last=False)
        self.metrics.events.labels(event).inc()
        self.wake.set()

    def _when(self, job: SlurmJob, event: str, slurm_s: int | None) -> int | None:
        exact = self.notified.get(job.id, {}).get(event)
        if slurm_s is None:
            return exact
        if exact is not None and abs(exact - slurm_s * NS) < NOTIFY_MATCH_NS:
            return exact
        return slurm_s * NS

    # ------------------------------------------------------------ the loop

    async def prepare(self) -> NodeMap:
        """Validate the hall <-> Slurm mapping against both (retried until both answer)."""
        s = self.settings
        layout = HallLayout.from_doc(await self.allocator.hall())
        nodemap = NodeMap.build(layout, s.node_names, s.node_map)
        snap = await self.slurm.snapshot()
        unmapped = nodemap.check_slurm(n.name for n in snap.nodes)
        log.info(
            "slurm bridge: hall %r: %d Slurm nodes mapped; %d Slurm nodes outside the hall%s",
            layout.name,
            len(nodemap.index_of),
            len(unmapped),
            f" ({', '.join(unmapped[:5])}{' ...' if len(unmapped) > 5 else ''})"
            if unmapped
            else "",
        )
        self.nodemap = nodemap
        return nodemap

    async def run(self) -> None:
        """Prepare (until Slurm and the allocator answer), then reconcile forever."""
        while self.nodemap is None:
            try:
                await self.prepare()
            except (SlurmError, AllocatorError) as exc:
                self.status = {"ready": False, "reason": f"waiting: {exc}"}
                _rlog.warning("prepare", "slurm bridge: not ready yet: %s", exc)
                await self._sleep()
        while True:
            self.wake.clear()
            await self.round()
            # woken by a flood of notifications, still leave the event loop (and slurmctld) room
            await asyncio.sleep(MIN_ROUND_GAP_S)
            await self._sleep()

    async def _sleep(self) -> None:
        await wait_event(self.wake, self.settings.poll_interval_s)

    async def round(self) -> bool:
        """One reconcile round; False when Slurm or the allocator did not answer."""
        started = time.perf_counter()
        try:
            snap = await self.slurm.snapshot()
            self.metrics.slurm_up.set(1)
        except SlurmError as exc:
            return self._failed("slurm", exc)
        report = self.report(snap)
        try:
            answer = await self.allocator.sync(report)
            self.metrics.allocator_up.set(1)
        except AllocatorError as exc:
            return self._failed("allocator", exc)
        if self.settings.mode != "observe":
            await self.apply(snap, answer)
        self.rounds += 1
        self.metrics.rounds.labels("ok").inc()
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        self.metrics.last_round.set(time.time())
        self.status = {
            "ready": True,
            "reason": "reconciling",
            "rounds": self.rounds,
            "last_round_s": time.time(),
            "placements": answer.get("placements", []),
            "waiting": answer.get("waiting", []),
            "unplaceable": answer.get("unplaceable", []),
        }
        return True

    def _failed(self, what: str, exc: Exception) -> bool:
        (self.metrics.slurm_up if what == "slurm" else self.metrics.allocator_up).set(0)
        self.metrics.rounds.labels(f"{what}_error").inc()
        self.status = {**self.status, "reason": f"{what} unavailable: {exc}"}
        _rlog.warning(what, "slurm bridge: %s did not answer, jobs stay as they are: %s", what, exc)
        return False

    # ------------------------------------------------------------ observed -> report

    def report(self, snap: Snapshot) -> dict[str, Any]:
        """What Slurm shows, in the allocator's terms (hall indices)."""
        nm = self.nodemap
        assert nm is not None
        placing = self.settings.mode == "place"
        nodes = [
            {"index": nm.index_of[n.name], "state": n.state, "reason": n.reason[:400] or None}
            for n in snap.nodes
            if n.name in nm.index_of
        ]
        jobs: list[dict[str, Any]] = []
        now_ns = time.time_ns()
        for j in snap.jobs:
            idx = nm.indices(j.nodes)
            if not idx or j.pending:
                continue
            doc = self._job_doc(j, placing)
            if j.active or self._end_due(j, now_ns):
                jobs.append(
                    {
                        **doc,
                        "state": "running",
                        "nodes": idx,
                        "start_ns": self._when(j, "start", j.start_s),
                    }
                )
            else:
                jobs.append(
                    {**doc, "state": "ended", "nodes": idx, "end_ns": self._when(j, "end", j.end_s)}
                )
        if placing:
            for j in sorted((j for j in snap.jobs if j.pending and j.managed), key=_order):
                jobs.append({**self._job_doc(j, True), "state": "pending", "size": j.size})
        return {"source": "slurm", "nodes": nodes, "jobs": jobs}

    def _end_due(self, j: SlurmJob, now_ns: int) -> bool:
        """An ended job whose exact end (the epilog's notification) may still be on its way:
        reported running a moment longer, rather than ended at Slurm's whole second."""
        if j.end_s is None or "end" in self.notified.get(j.id, {}):
            return False
        return now_ns - j.end_s * NS < END_GRACE_NS

    @staticmethod
    def _job_doc(j: SlurmJob, placing: bool) -> dict[str, Any]:
        return {
            "id": j.id,
            "managed": j.managed and placing,
            "comm_share": j.comm_share,
            "time_limit_s": j.time_limit_s,
            "submit_ns": j.submit_s * NS if j.submit_s else None,
            "user": j.user[:200] or None,
            "name": j.name[:200] or None,
        }

    # ------------------------------------------------------------ desired -> Slurm

    async def apply(self, snap: Snapshot, answer: dict[str, Any]) -> None:
        """Make every managed pending job agree with its placement (see the module's table)."""
        nm = self.nodemap
        assert nm is not None
        wanted = {str(p["id"]): p for p in answer.get("placements", [])}
        counts = {"held": 0, "released": 0, "running": 0}
        for j in snap.jobs:
            if j.managed and j.active:
                counts["running"] += 1
        for j in sorted((j for j in snap.jobs if j.pending and j.managed), key=_order):
            counts["held" if j.held else "released"] += 1
            try:
                if self.settings.mode == "release":
                    if j.held:
                        await self._act("release", j)
                    continue
                p = wanted.get(j.id)
                if p is None:
                    if not j.held:
                        await self._act("hold", j, "no placement yet")
                    continue
                want = nm.names(p["nodes"])
                same = set(j.required) == set(want)
                if j.held:
                    if not same:
                        await self._act("set_nodes", j, f"{p.get('policy')}", want)
                    await self._act("release", j)
                    self.metrics.placements.inc()
                elif not same:
                    self.metrics.replacements.inc()
                    await self._act("hold", j, f"placed again (was {','.join(j.required)})")
                    await self._act("set_nodes", j, f"{p.get('policy')}", want)
                    await self._act("release", j)
                    self.metrics.placements.inc()
            except SlurmError as exc:
                _rlog.warning(f"job:{j.id}", "slurm bridge: job %s: %s", j.id, exc)
        for state, k in counts.items():
            self.metrics.managed.labels(state).set(k)

    async def _act(
        self, action: str, job: SlurmJob, why: str = "", nodes: list[str] | None = None
    ) -> None:
        try:
            if action == "set_nodes":
                assert nodes is not None
                await self.slurm.set_nodes(job.id, nodes)
            elif action == "hold":
                await self.slurm.hold(job.id)
            else:
                await self.slurm.release(job.id)
        except SlurmError:
            self.metrics.actions.labels(action, "error").inc()
            raise
        self.metrics.actions.labels(action, "ok").inc()
        what = f"{action} {','.join(nodes)}" if nodes else action
        log.info("slurm bridge: job %s: %s%s", job.id, what, f" ({why})" if why else "")
