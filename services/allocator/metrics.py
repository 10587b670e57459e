"""Prometheus metrics of the allocator (``kelvin_allocator_*``)."""

from __future__ import annotations

from services.allocator.engine import Decision
from services.allocator.model import Thermal
from services.common.metrics import ServiceMetrics


class AllocatorMetrics(ServiceMetrics):
    """Decisions, jobs, the hall's predicted state and the MQTT side channel."""

    def __init__(self) -> None:
        super().__init__("allocator")
        self.decisions = self.counter(
            "decisions_total", "Placement decisions by policy and outcome", ["policy", "outcome"]
        )
        self.decision_seconds = self.histogram(
            "decision_seconds",
            "Time to decide one placement",
            ["policy"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
        )
        self.jobs = self.counter("jobs_total", "Jobs by how they ended or started", ["event"])
        self.rejected_requests = self.counter(
            "rejected_requests_total", "Requests refused as bad input", ["reason"]
        )
        self.running = self.gauge("running_jobs", "Jobs holding nodes")
        self.queued = self.gauge("queued_jobs", "Jobs waiting (FCFS)")
        self.busy_nodes = self.gauge("busy_nodes", "Nodes running a job")
        self.utilization = self.gauge("utilization_ratio", "Busy share of present nodes")
        self.max_inlet = self.gauge("max_inlet_celsius", "Predicted peak inlet temperature")
        self.supply = self.gauge("supply_celsius", "Raised CRAC supply temperature Tsup'")
        self.cop = self.gauge("cop_ratio", "CRAC coefficient of performance at Tsup'")
        self.computing = self.gauge("computing_watts", "Predicted computing power")
        self.cooling = self.gauge("cooling_watts", "Predicted cooling power")
        self.min_mttf = self.gauge("min_mttf_years", "Shortest predicted processor MTTF")
        self.mttf_stalls = self.counter(
            "mttf_stalls_total", "Times the queue head waited for the reliability constraint"
        )
        self.model_updates = self.counter("model_updates_total", "Hall models applied at run time")
        self.published = self.counter("published_messages_total", "MQTT messages published")
        self.publish_dropped = self.counter(
            "publish_dropped_total", "MQTT messages dropped because the buffer was full"
        )
        self.publish_buffer = self.gauge("publish_buffer_messages", "MQTT messages waiting")
        self.mqtt_connected = self.gauge("mqtt_connected", "1 while connected to a broker")
        self.syncs = self.counter(
            "cluster_syncs_total", "Reports of a workload manager's nodes and jobs taken in"
        )

    def decision(self, d: Decision) -> None:
        self.decisions.labels(d.policy, d.reason).inc()
        self.decision_seconds.labels(d.policy).observe(d.elapsed_ms / 1e3)
        if d.reason == "mttf":
            self.mttf_stalls.inc()

    def hall(
        self, th: Thermal, busy: int, utilization: float, running: float, queued: float
    ) -> None:
        self.running.set(running)
        self.queued.set(queued)
        self.busy_nodes.set(busy)
        self.utilization.set(utilization)
        self.max_inlet.set(th.max_tin_c)
        self.supply.set(th.supply_c)
        self.cop.set(th.cop)
        self.computing.set(th.computing_kw * 1e3)
        self.cooling.set(th.cooling_kw * 1e3)
        self.min_mttf.set(th.min_mttf_years)
