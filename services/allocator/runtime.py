"""The running allocator: job book + persistence + metrics + MQTT, and its background tasks.

Every mutation goes through :meth:`AllocatorCore.commit`, which persists the
state atomically, updates the metrics and publishes a snapshot, so the three
never disagree. The background tasks release jobs when their time is up and
republish the hall periodically.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from services.allocator.closed_loop import sensor_names
from services.allocator.cluster import ClusterIn, ModeError, SyncResult, sync
from services.allocator.engine import Allocator, current
from services.allocator.jobs import Job, JobBook
from services.allocator.metrics import AllocatorMetrics
from services.allocator.model import HallModel, Thermal
from services.allocator.policies import PolicyOptions
from services.allocator.publisher import DecisionPublisher
from services.allocator.reliability import ReliabilityModel
from services.allocator.settings import Settings
from services.allocator.store import StateStore
from services.common.errors import ConfigError
from services.common.mqtt_credentials import client_tls, read_password
from services.common.tasks import wait_event
from services.common.thermal import HALL_SENSOR_PREFIX, Hall, node_sensor, reference_hall

log = logging.getLogger(__name__)


def load_hall(settings: Settings) -> Hall:
    if settings.hall_file is None:
        return reference_hall()
    from services.common.halls.hallfile import load_hall as load

    return load(settings.hall_file)


def node_name(hall: Hall, i: int) -> str:
    """The node as DCDB job records name it: ``/hall/row0/rack3/node2``."""
    return node_sensor(hall, i, "x").rsplit("/", 1)[0]


class AllocatorCore:
    """Everything the HTTP API and the background tasks share."""

    def __init__(self, settings: Settings, metrics: AllocatorMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = StateStore(settings.state_dir)
        self.base_hall = load_hall(settings)
        self.model_meta: dict[str, Any] = {
            "source": "hall file" if settings.hall_file else "reference"
        }
        hall = self._saved_model(self.base_hall)
        options = PolicyOptions(
            seed=settings.demo_seed,
            mpit_exact_max_free=settings.mpit_exact_max_free,
            mpit_time_limit_s=settings.mpit_time_limit_s,
            joint_max_centres=settings.joint_max_centres,
        )
        saved = self.store.load_state()
        policy = settings.policy
        if saved and saved.get("configured_policy") == settings.policy and saved.get("policy"):
            # set through the API since; the configuration is unchanged
            policy = str(saved["policy"])
        self.allocator = Allocator(policy, options, settings.min_mttf_years, settings.runner_ups)
        reliability = ReliabilityModel.for_hall(
            hall.idle_power_w, hall.busy_power_w, **settings.reliability.model_dump()
        )
        self.external = settings.cluster == "external"
        self.book = JobBook(
            HallModel(hall, reliability), self.allocator, settings.history, self.external
        )
        self._placed_ns = 0
        self.last_sync_ns: int | None = None
        """When the workload manager last reported (external mode)."""
        self.book.listeners.append(self._on_job)
        self.publisher = DecisionPublisher(
            settings.brokers,
            settings.sensor_prefix,
            metrics,
            settings.publish_buffer,
            settings.mqtt_qos,
            settings.mqtt_username,
            read_password(
                settings.mqtt_password, settings.mqtt_password_file, "allocator.mqtt_password_file"
            ),
            client_tls(settings.mqtt_tls, settings.mqtt_tls_ca, "allocator.mqtt_tls_ca"),
        )
        # Every present node's predicted inlet (absent nodes have none); the layout is fixed.
        self.node_indices: list[int] = np.flatnonzero(hall.present_mask).tolist()
        # Its measured power and inlet sensors (sensor_map), for the console and calibration.
        self.measured = sensor_names(hall, settings.sensor_map)
        self.node_sensors = [
            node_sensor(hall, i, "predicted_inlet_temp") for i in self.node_indices
        ]
        if settings.publish_nodes:
            self.publisher.add_metadata(self.node_sensors, "°C")
        self.changed = asyncio.Event()
        self._saved = saved

    def load(self) -> None:
        """Take the saved jobs back (releasing those whose time ran out while down)."""
        model = self.book.model
        _ = model.cc_min, model.d_csc, model.d_csr  # once now, not per request
        if self._saved:
            try:
                self.book.restore(self._saved, time.time_ns())
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ConfigError(
                    f"{self.store.state_path}: saved jobs do not fit hall "
                    f"{self.book.model.hall.name!r} ({exc}); restore the hall file that matches "
                    "or move the state file away"
                ) from exc
            self._saved = None
        self.commit()

    def _saved_model(self, hall: Hall) -> Hall:
        saved = self.store.load_model()
        if saved is None:
            return hall
        d, meta = saved
        try:
            fitted = hall.replace(d_matrix=d)
        except ValueError as exc:
            log.error(
                "allocator: saved model does not fit hall %s (%s); using the hall's D",
                hall.name,
                exc,
            )
            self.store.clear_model()
            return hall
        self.model_meta = meta
        return fitted

    # ---------------------------------------------------------------- mutations

    def submit(
        self,
        size: int,
        runtime_s: float | None,
        comm_share: float,
        stretch: bool = False,
        name: str | None = None,
    ) -> Job:
        job = self.book.submit(size, time.time_ns(), runtime_s, comm_share, stretch, name)
        self.metrics.jobs.labels("submitted").inc()
        self.commit()
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.book.cancel(job_id, time.time_ns())
        self.commit()
        return job

    def set_policy(self, name: str) -> None:
        self.allocator.set_policy(name)
        self.book.start_queued(time.time_ns())
        self.commit()

    def set_model(self, d: np.ndarray | sp.csr_matrix, meta: dict[str, Any]) -> None:
        """Make a fitted D live (dense or sparse, validated against the layout), persist it,
        re-plan the queue."""
        hall = self.base_hall.replace(d_matrix=d if sp.issparse(d) else np.asarray(d, float))
        self.book.set_model(self.book.model.with_hall(hall))
        self.store.save_model(hall.d_matrix, meta)
        self.model_meta = meta
        self.metrics.model_updates.inc()
        self.book.start_queued(time.time_ns())
        self.commit()

    def reset_model(self) -> None:
        self.book.set_model(self.book.model.with_hall(self.base_hall))
        self.store.clear_model()
        self.model_meta = {"source": "hall file" if self.settings.hall_file else "reference"}
        self.metrics.model_updates.inc()
        self.commit()

    def sync(self, report: ClusterIn) -> SyncResult:
        """The workload manager's view in, placements for its waiting jobs out (external mode)."""
        if not self.external:
            raise ModeError(
                "the allocator runs its own jobs (allocator.cluster: internal); set "
                "allocator.cluster: external to follow a workload manager"
            )
        result = sync(self.book, report, time.time_ns())
        self.last_sync_ns = time.time_ns()
        self.metrics.syncs.inc()
        if result.changed or self.book.decisions:
            self.commit()
        return result

    def commit(self) -> None:
        """Persist, account and publish after any change."""
        doc = self.book.snapshot()
        doc["configured_policy"] = self.settings.policy
        self.store.save_state(doc)
        for d in self.book.decisions:
            self.metrics.decision(d)
        self.book.decisions.clear()
        self.publish_snapshot()
        self.changed.set()

    def _on_job(self, event: str, job: Job) -> None:
        if event == "start_time":  # a more exact start: the job record again, nothing else
            nodes = [node_name(self.book.model.hall, i) for i in job.nodes]
            self.publisher.offer_job(job.id, job.started_ns or 0, 0, nodes, job.user)
            return
        self.metrics.jobs.labels(event).inc()
        if event == "started" or job.started_ns is not None:
            hall = self.book.model.hall
            end = 0 if event == "started" else (job.finished_ns or 0)
            end += end & 1  # DCDB reads an odd end time as "still running"
            nodes = [node_name(hall, i) for i in job.nodes]
            self.publisher.offer_job(job.id, job.started_ns or 0, end, nodes, job.user)
        if event == "started":
            # Which policy placed which job, as a sensor per policy whose value is the job's
            # number, so the query API can tell (``kelvin jobs report``); Slurm's own: "slurm".
            number = re.sub(r"\D", "", job.id)
            if number and len(number) <= 15:  # exact in a float64
                by = job.placed_by or "unknown"
                # at the moment it is announced, not at the job's start: two jobs starting in
                # the same (whole) second must not overwrite each other's reading
                self._placed_ns = max(time.time_ns(), self._placed_ns + 1)
                self.publisher.offer_values(
                    self._placed_ns, {by: float(number)}, f"{self.settings.sensor_prefix}/placed"
                )

    # ---------------------------------------------------------------- views

    def _totals(self, th: Thermal) -> dict[str, float]:
        return {
            **th.hall_totals(),
            "utilization": self.book.state.utilization,
            "running_jobs": len(self.book.running()),
            "queued_jobs": len(self.book.queue),
        }

    def publish_snapshot(self) -> None:
        th = current(self.book.state)
        state = self.book.state
        totals = self._totals(th)
        self.metrics.hall(
            th,
            int(state.busy.sum()),
            state.utilization,
            totals["running_jobs"],
            totals["queued_jobs"],
        )
        now = time.time_ns()
        self.publisher.offer_values(now, totals)
        if self.settings.publish_nodes:
            rel = {
                name[len(HALL_SENSOR_PREFIX) + 1 :]: float(th.inlet_c[i])
                for i, name in zip(self.node_indices, self.node_sensors, strict=True)
            }
            self.publisher.offer_values(now, rel, HALL_SENSOR_PREFIX)

    def hall_doc(self) -> dict[str, Any]:
        state = self.book.state
        hall = state.model.hall
        th = current(state)
        inlet = dict(zip(self.node_indices, self.measured["inlet_temp"], strict=True))
        power = dict(zip(self.node_indices, self.measured["power"], strict=True))
        jobs = self.book.jobs
        nodes = [
            {
                "index": i,
                "row": int(p[0]),
                "rack": int(p[1]),
                "slot": int(p[2]),
                "present": bool(state.model.present[i]),
                "busy": bool(state.busy[i]),
                "available": not bool(state.unavailable[i]),
                "state": _node_state(state.owner[i], jobs, bool(state.unavailable[i])),
                "job": state.owner[i],
                "power_w": float(state.powers_w[i]),
                "predicted_tin_c": float(th.inlet_c[i]),
                "inlet_sensor": inlet.get(i),
                "power_sensor": power.get(i),
            }
            for i, p in enumerate(state.model.pos.tolist())
        ]
        return {
            "name": hall.name,
            "rows": hall.rows,
            "racks": hall.racks,
            "slots": hall.slots,
            "redline_c": hall.redline_c,
            "policy": self.allocator.policy_name,
            "cluster": self.settings.cluster,
            "mttf_bound_years": self.allocator.min_mttf_years,
            "model": self.model_meta,
            "nodes": nodes,
            "totals": self._totals(th),
        }

    # ---------------------------------------------------------------- tasks

    async def run_timer(self) -> None:
        """Release jobs when their runtime is up (and start what then fits)."""
        while True:
            nxt = self.book.next_end_ns()
            delay = None if nxt is None else max(0.0, (nxt - time.time_ns()) / 1e9)
            await wait_event(self.changed, delay)
            self.changed.clear()
            if self.book.expire(time.time_ns()):
                self.commit()

    async def run_periodic(self) -> None:
        while True:
            await asyncio.sleep(self.settings.publish_interval_s)
            self.publish_snapshot()


def _node_state(owner: str | None, jobs: dict[str, Job], unavailable: bool) -> str:
    """idle, placed (chosen for a job its manager has not started yet), running or unavailable."""
    if owner is not None:
        job = jobs.get(owner)
        return "placed" if job is not None and job.state == "placed" else "running"
    return "unavailable" if unavailable else "idle"
