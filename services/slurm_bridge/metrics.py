"""Prometheus metrics of the Slurm bridge (``kelvin_slurm_bridge_*``)."""

from __future__ import annotations

from services.common.metrics import ServiceMetrics


class BridgeMetrics(ServiceMetrics):
    """Reconcile rounds, side effects on Slurm, notifications, managed jobs."""

    def __init__(self) -> None:
        super().__init__("slurm_bridge")
        self.rounds = self.counter("reconciles_total", "Reconcile rounds by outcome", ["outcome"])
        self.round_seconds = self.histogram(
            "reconcile_seconds",
            "Time of one reconcile round (read Slurm, sync the allocator, act)",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
        )
        self.actions = self.counter(
            "actions_total", "Changes made to Slurm jobs", ["action", "outcome"]
        )
        self.placements = self.counter(
            "placements_total", "Jobs released onto the nodes Kelvin chose"
        )
        self.replacements = self.counter(
            "replacements_total", "Released jobs held again to move them to new nodes"
        )
        self.events = self.counter(
            "notifications_total", "Prolog/epilog notifications received", ["event"]
        )
        self.managed = self.gauge("managed_jobs", "Kelvin's jobs by state", ["state"])
        self.last_round = self.gauge(
            "last_reconcile_timestamp_seconds", "When the last successful round ended"
        )
        self.slurm_up = self.gauge("slurm_up", "1 while Slurm answered the last round")
        self.allocator_up = self.gauge(
            "allocator_up", "1 while the allocator answered the last round"
        )
