"""``datacenter``: a simulated hall measured as if it were real.

On every read the plugin asks the allocator for the current placement
(``GET {allocator_url}/api/v1/hall``): which nodes are busy, with which job,
and each node's average power (``power_w``, the phase-weighted power of its
job; without it busy -> the hall's busy power, idle -> idle power). When the
allocator follows Slurm (``allocator.cluster: external``) these are Slurm's
running jobs; nodes chosen for a job Slurm has not started yet (``state:
placed``) stay idle. What a
node draws at the sampled instant comes from
:mod:`services.pusher.plugins.datacenter_load`: busy nodes alternate compute
(3500 W) and communication (2700 W) phases whose time average is the
allocator's figure, and every node's utilisation jitters. The hall answers
through :mod:`services.common.hall_physics`: each node's heat output follows
its power with the hall's thermal lag (``time_constant_s``), the inlets are
``Tsup + D·Q`` (:mod:`services.common.thermal`), and a CRAC moves its supply
temperature at a bounded rate to keep the hottest inlet ``margin_c`` under
the redline. Sensor noise is added and the plugin publishes:

* ``/hall/row<r>/rack<k>/node<s>/power`` (W), ``.../inlet_temp`` and
  ``.../outlet_temp`` (°C) per node, the names
  :func:`services.common.thermal.node_sensor` defines (the allocator's
  calibration reads power and inlet);
* ``/hall/power`` (W, all nodes), ``/hall/cooling_power`` (W, the CRAC's
  power: the heat the air carries back over the CoP at the supply) and
  ``/hall/supply_temp`` (°C, the CRAC's supply air) with ``totals: true``;
* ``/hall/policy/<policy>/...`` every 5 s with ``ledger: true``: what the
  hall drew and spent under each placement policy
  (:mod:`services.pusher.plugins.datacenter_ledger`).

The hall is the reference hall or a hall file (``hall_file``), i.e. the "true"
physics; the allocator may hold a calibrated model of it. When the allocator
cannot be reached, or answers with a different hall, the last known placement
is kept (all idle at first), the error is counted
(``kelvin_pusher_plugin_errors_total{plugin, reason}``) and noted in the status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.errors import ConfigError, KelvinError
from services.common.hall_physics import HallPhysics, Physics
from services.common.logs import RateLimitedLog
from services.common.readings import Float64Array
from services.common.schema import Field
from services.common.thermal import HALL_SENSOR_PREFIX, Hall, node_sensor, reference_hall
from services.pusher.plugins import datacenter_ledger as ledger
from services.pusher.plugins.base import (
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
    interval_field,
)
from services.pusher.plugins.datacenter_load import (
    COMM_POWER_W,
    LoadSettings,
    NodeLoad,
    PhaseMode,
)

log = logging.getLogger(__name__)
_rlog = RateLimitedLog(log, period_s=60)


class DatacenterConfig(PluginConfig):
    interval_ms: int = interval_field(250)
    """Sampling interval (ms): four samples a second, each a new power vector."""
    hall_file: str | None = None
    """Hall file (YAML/JSON + matrix, see services/common/halls/hallfile.py); None = reference."""
    allocator_url: str | None = None
    """Allocator base URL (default: the pusher's ``allocator_url``)."""
    noise_power_w: float = Field(10.0, ge=0)
    """Standard deviation of the power meters' noise (W; 0.3-1 % of a node's reading)."""
    noise_temp_c: float = Field(0.1, ge=0)
    """Standard deviation of the inlet sensors' noise (°C)."""
    phases: PhaseMode = "node"
    """Busy nodes alternate compute/communication phases: each on its own clock (``node``),
    a job's nodes in lock-step (``job``), or not at all (``off``: the average power)."""
    phase_period_s: float = Field(2.0, gt=0)
    """Mean length of one compute + communication cycle (s)."""
    comm_power_w: float = Field(COMM_POWER_W, ge=0)
    """A busy node's power while communicating (W); computing draws the hall's busy power."""
    busy_jitter: float = Field(0.05, ge=0, le=1)
    """Standard deviation of a busy node's utilisation, as a fraction of busy - idle power."""
    idle_jitter: float = Field(0.02, ge=0, le=1)
    """The same for an idle node."""
    seed: int | None = None
    """Noise seed (None = a fresh one per start)."""
    totals: bool = True
    outlets: bool = True
    """Also publish every node's outlet temperature."""
    ledger: bool = True
    """Book IT and cooling energy and time over the redline per placement policy, kept in
    the pusher's state directory (``/hall/policy/<policy>/...``, every ``ledger_interval_ms``)."""
    ledger_interval_ms: int = Field(5000, ge=250)
    """How often the per-policy totals are published and saved (ms)."""
    time_constant_s: float = Field(Physics.time_constant_s, ge=0)
    """Thermal lag: a node's heat output follows its power with this time constant (s; 0 = none)."""
    supply_min_c: float = Physics.supply_min_c
    """The CRAC's lowest supply temperature (°C)."""
    supply_max_c: float = Physics.supply_max_c
    """The CRAC's highest supply temperature (°C)."""
    supply_rate_c_per_min: float = Field(Physics.supply_rate_c_per_s * 60, gt=0)
    """Fastest change of the CRAC's supply temperature (°C per minute)."""
    margin_c: float = Field(Physics.margin_c, ge=0)
    """The CRAC aims the hottest inlet this far under the hall's redline (°C)."""

    def load(self, hall: Hall) -> LoadSettings:
        """How the hall's nodes draw power around the allocator's averages."""
        return LoadSettings(
            compute_w=hall.busy_power_w,
            comm_w=self.comm_power_w,
            idle_w=hall.idle_power_w,
            phases=self.phases,
            phase_period_s=self.phase_period_s,
            busy_jitter=self.busy_jitter,
            idle_jitter=self.idle_jitter,
        )

    def physics(self) -> Physics:
        return Physics(
            time_constant_s=self.time_constant_s,
            supply_min_c=self.supply_min_c,
            supply_max_c=self.supply_max_c,
            supply_rate_c_per_s=self.supply_rate_c_per_min / 60,
            margin_c=self.margin_c,
        )


@dataclass(frozen=True)
class Placement:
    """What the allocator says about every node."""

    powers_w: Float64Array
    """Average power (W); 0 for absent nodes."""
    present: npt.NDArray[np.bool_]
    busy: npt.NDArray[np.bool_]
    jobs: list[str | None]
    policy: str | None = None
    """The allocator's placement policy."""

    @classmethod
    def idle(cls, hall: Hall) -> Placement:
        present = hall.present_mask.copy()
        busy = np.zeros(hall.n_nodes, dtype=bool)
        return cls(hall.powers_w(busy), present, busy, [None] * hall.n_nodes)


def parse_placement(hall: Hall, doc: Any) -> Placement:
    """Node powers, presence, busy flags and jobs from the allocator's ``/api/v1/hall`` document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise KelvinError("allocator hall document has no 'nodes' list")
    nodes = doc["nodes"]
    n = hall.n_nodes
    if len(nodes) != n:
        raise KelvinError(
            f"allocator hall {doc.get('name')!r} has {len(nodes)} nodes; "
            f"this plugin simulates {hall.name!r} with {n}"
        )
    power = np.full(n, np.nan)
    busy = np.zeros(n, dtype=bool)
    jobs: list[str | None] = [None] * n
    present = np.ones(n, dtype=bool) if hall.present is None else hall.present.copy()
    for node in nodes:
        try:
            i = int(node["index"])
            if not 0 <= i < n:
                raise KelvinError(f"allocator node index {i} outside 0..{n - 1}")
            # A job placed but not yet started by its workload manager does not heat anything.
            if node.get("state") == "placed":
                continue
            busy[i] = bool(node.get("busy", False))
            if node.get("job") is not None:
                jobs[i] = str(node["job"])
            if node.get("power_w") is not None:
                power[i] = float(node["power_w"])
            if node.get("present") is False:
                present[i] = False
        except (KeyError, TypeError, ValueError) as exc:
            raise KelvinError(f"allocator hall document: bad node entry {node!r}") from exc
    powers = np.where(np.isnan(power), hall.powers_w(busy), power)
    policy = doc.get("policy")
    return Placement(
        np.where(present, powers, 0.0),
        present,
        busy & present,
        jobs,
        policy if isinstance(policy, str) else None,
    )


class HallGroup(Group):
    """Every node's power and inlet temperature, plus the hall totals."""

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        plugin: DatacenterPlugin,
    ) -> None:
        super().__init__(name, sensors, options)
        self.p = plugin

    async def read_async(self, timestamp_ns: int) -> Float64Array:
        p = self.p
        try:
            r = await p.client.get(p.url)
            if r.status_code != 200:
                raise KelvinError(f"{p.url} answered HTTP {r.status_code}")
            p.placement = parse_placement(p.hall, r.json())
            p.notes[:] = [n for n in p.notes if not n.startswith("allocator")]
        except Exception as exc:  # any failure: keep the last placement, count it
            reason = "hall_mismatch" if "simulates" in str(exc) else "allocator_unreachable"
            p.context.count_error(reason)
            msg = f"allocator: {type(exc).__name__}: {exc}; using the last known placement"
            p.notes[:] = [n for n in p.notes if not n.startswith("allocator")] + [msg]
            _rlog.warning(
                f"datacenter:{p.context.instance}", "datacenter %s: %s", p.context.instance, msg
            )
        return p.measure(timestamp_ns)


class DatacenterPlugin(Plugin):
    """The simulated hall."""

    Config = DatacenterConfig
    description = "simulated hall: node power and inlet temperature for the allocator's placement"

    async def build(self) -> list[Group]:
        import httpx  # only the simulated hall needs an HTTP client in the pusher

        cfg = self.config
        assert isinstance(cfg, DatacenterConfig)
        if cfg.hall_file:
            from services.common.halls.hallfile import load_hall

            self.hall = load_hall(self.context.path(cfg.hall_file))
        else:
            self.hall = reference_hall()
        hall = self.hall
        base = (cfg.allocator_url or self.context.allocator_url).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ConfigError(
                f"datacenter plugin {self.context.instance!r}: allocator_url {base!r} "
                "must start with http:// or https://"
            )
        self.url = base + "/api/v1/hall"
        opts = self.group_options()
        self.client: Any = httpx.AsyncClient(
            timeout=0.8 * (opts.timeout_ms or opts.interval_ms) / 1000
        )
        self.rng = np.random.default_rng(cfg.seed)
        self.placement = Placement.idle(hall)
        try:
            self.physics = HallPhysics(hall, cfg.physics())
        except ValueError as exc:
            raise ConfigError(f"datacenter plugin {self.context.instance!r}: {exc}") from exc
        self.load = NodeLoad(cfg.load(hall), self.rng)
        prefix = cfg.prefix or HALL_SENSOR_PREFIX
        sopts = self.sensor_options(opts)
        sensors = [
            Sensor(node_sensor(hall, i, "power", prefix), sopts, "W", integrable=True)
            for i in range(hall.n_nodes)
        ]
        sensors += [
            Sensor(node_sensor(hall, i, "inlet_temp", prefix), sopts, "°C")
            for i in range(hall.n_nodes)
        ]
        if cfg.outlets:
            sensors += [
                Sensor(node_sensor(hall, i, "outlet_temp", prefix), sopts, "°C")
                for i in range(hall.n_nodes)
            ]
        if cfg.totals:
            sensors += [
                Sensor(f"{prefix}/power", sopts, "W", integrable=True),
                Sensor(f"{prefix}/cooling_power", sopts, "W", integrable=True),
                Sensor(f"{prefix}/supply_temp", sopts, "°C"),
            ]
        groups: list[Group] = [HallGroup("hall", sensors, opts, self)]
        self.ledger: ledger.Ledger | None = None
        self.last_s: float | None = None
        if cfg.ledger:
            self.ledger = ledger.Ledger(
                self.context.state_dir / f"{self.context.instance}-ledger.json"
            )
            lopts = self.group_options(interval_ms=cfg.ledger_interval_ms, timeout_ms=None)
            books = ledger.sensors(prefix, self.sensor_options(lopts))
            groups.append(ledger.LedgerGroup("ledger", books, lopts, self.ledger))
        return groups

    def measure(self, timestamp_ns: int) -> Float64Array:
        """One noisy measurement of the hall at ``timestamp_ns`` for the current placement."""
        cfg = self.config
        assert isinstance(cfg, DatacenterConfig)
        n, pl = self.hall.n_nodes, self.placement
        now_s = timestamp_ns / 1e9
        true_w = self.load.powers_w(now_s, pl.powers_w, pl.busy, pl.jobs)
        hall = self.physics.step(now_s, true_w)
        power, inlet, outlet = true_w, hall.inlet_c, hall.outlet_c
        if cfg.noise_power_w:
            power = np.maximum(power + self.rng.normal(0.0, cfg.noise_power_w, n), 0.0)
        if cfg.noise_temp_c:
            inlet = inlet + self.rng.normal(0.0, cfg.noise_temp_c, n)
            if cfg.outlets:
                outlet = outlet + self.rng.normal(0.0, cfg.noise_temp_c, n)
        if self.ledger is not None:
            over = int((hall.inlet_c[pl.present] > self.hall.redline_c).sum())
            dt = 0.0 if self.last_s is None else now_s - self.last_s
            self.ledger.add(pl.policy, dt, float(true_w.sum()), hall.cooling_w, over)
        self.last_s = now_s if self.last_s is None else max(self.last_s, now_s)
        absent = ~pl.present
        parts = [np.where(absent, np.nan, power), np.where(absent, np.nan, inlet)]
        if cfg.outlets:
            parts.append(np.where(absent, np.nan, outlet))
        if cfg.totals:
            parts.append(np.array([float(true_w.sum()), hall.cooling_w, hall.supply_c]))
        return np.concatenate(parts)

    async def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            await client.aclose()
            self.client = None
        await super().close()
