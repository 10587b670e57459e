"""Evaluates rule groups on Kelvin's PromQL at their interval, keeps alert state, notifies.

Per group, at each multiple of its interval: every rule is evaluated as an
instant query at that time. A recording rule's result is written to storage as
sensors (``<rules_record_prefix>/<name>/<label>=<value>/...``, so later rules and
dashboards can query it by its name). An alerting rule's result becomes alerts:
pending, then firing once ``for`` has passed, kept firing ``keep_firing_for`` after
the condition ended, then resolved (and sent as resolved for 15 minutes). A rule
whose evaluation fails keeps its alerts as they were (health ``err``), as in
Prometheus. Rules that read only Kelvin's own metrics (``kelvin_*``, ``up``) are
evaluated on the scraped samples alone, so they work while storage is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from services.common.errors import KelvinError
from services.common.metrics import ServiceMetrics
from services.common.promnames import Labels, sensor_name
from services.common.readings import Batch
from services.common.tasks import stop_task
from services.query_api.promql import Engine, to_string
from services.query_api.promql import ast as pq
from services.query_api.promql.printer import go_format_e
from services.query_api.promql.source import KelvinSource, Source
from services.query_api.promql.values import Scalar, Vector
from services.query_api.rules.notifier import Notifier
from services.query_api.rules.rulefile import Group, Rule, load
from services.query_api.rules.selfmetrics import CombinedSource, MemorySeries, Scraper
from services.query_api.rules.template import Data, TemplateError

log = logging.getLogger(__name__)
BUILTIN_RULES = Path(__file__).resolve().parent / "hall.yaml"
RESOLVED_RETENTION_NS = 15 * 60 * 10**9
SELF_METRIC_PREFIXES = ("kelvin_",)


def rfc3339(ns: int) -> str:
    """Go's time.Time JSON form (RFC 3339, nanoseconds, no trailing zeros)."""
    dt = datetime.fromtimestamp(ns // 10**9, tz=UTC)
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


@dataclass
class Alert:
    labels: Labels
    annotations: dict[str, str]
    value: float
    active_at: int
    state: str = "pending"  # pending, firing, inactive (resolved)
    fired_at: int = 0
    resolved_at: int = 0
    last_seen: int = 0
    last_sent: int = 0
    valid_until: int = 0
    keep_since: int = 0


@dataclass
class RuleState:
    rule: Rule
    self_only: bool
    health: str = "unknown"
    last_error: str = ""
    last_eval: int = 0
    eval_seconds: float = 0.0
    alerts: dict[Labels, Alert] = field(default_factory=dict)


@dataclass
class GroupState:
    group: Group
    rules: list[RuleState]
    last_eval: int = 0
    eval_seconds: float = 0.0


def _self_only(expr: pq.Expr) -> bool:
    """Whether every selector of ``expr`` names one of Kelvin's own metrics."""
    stack = [expr]
    found = False
    while stack:
        e = stack.pop()
        if isinstance(e, pq.VectorSelector):
            names = [m.value for m in e.matchers if m.name == "__name__" and m.op == "="]
            if not names or not (names[0] == "up" or names[0].startswith(SELF_METRIC_PREFIXES)):
                return False
            found = True
        stack.extend(pq.children(e))
    return found


class RuleManager:
    def __init__(self, ctx: Any, rule_files: list[Path], builtin: bool) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.settings = s
        paths = ([BUILTIN_RULES] if builtin else []) + list(rule_files)
        self.groups = [
            GroupState(g, [RuleState(r, _self_only(r.expr)) for r in g.rules])
            for g in load(paths, round(s.rule_interval_s * 1e9))
        ]
        m: ServiceMetrics = ctx.metrics.registry
        self.memory = MemorySeries(round(s.self_metrics_retention_s * 1e9))
        self.scraper = Scraper(self.memory, s.collect_agent_url or None, m.registry)
        self.notifier = Notifier(list(s.alertmanager_urls), m)
        self.m_evals = m.counter("rule_evaluations_total", "Rule evaluations", ["rule_group"])
        self.m_failures = m.counter(
            "rule_evaluation_failures_total", "Rule evaluations that failed", ["rule_group"]
        )
        self.m_duration = m.gauge(
            "rule_group_last_duration_seconds",
            "Duration of the last evaluation of a group",
            ["rule_group"],
        )
        self.m_last = m.gauge(
            "rule_group_last_evaluation_timestamp_seconds",
            "When a group was last evaluated",
            ["rule_group"],
        )
        self.m_missed = m.counter(
            "rule_group_iterations_missed_total",
            "Evaluations skipped because the previous ran late",
            ["rule_group"],
        )
        self.m_alerts = m.gauge("alerts", "Active alerts by state", ["state"])
        self.m_alerts.labels("firing").set_function(lambda: self._count("firing"))
        self.m_alerts.labels("pending").set_function(lambda: self._count("pending"))
        self._tasks: list[asyncio.Task[None]] = []
        self._last_scrape = 0

    def _count(self, state: str) -> int:
        return sum(
            1 for g in self.groups for r in g.rules for a in r.alerts.values() if a.state == state
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.notifier.start()
        for g in self.groups:
            self._tasks.append(asyncio.create_task(self._loop(g), name=f"rules-{g.group.name}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            await stop_task(t, what=f"rule group task {t.get_name()}")
        self._tasks.clear()
        await self.notifier.aclose()
        await self.scraper.aclose()

    async def _loop(self, g: GroupState) -> None:
        interval = g.group.interval_ns
        while True:
            now = time.time_ns()
            tick = (now // interval + 1) * interval
            await asyncio.sleep((tick - now) / 1e9)
            late = time.time_ns() - tick
            if late > interval:
                self.m_missed.labels(g.group.name).inc(late // interval)
            try:
                await self.evaluate(g, tick // 1_000_000 * 1_000_000)
            except Exception:  # one bad evaluation must not stop the group for good
                log.exception("rule group %s: evaluation failed", g.group.name)

    # ------------------------------------------------------------------ evaluation
    async def evaluate(self, g: GroupState, ts: int) -> None:
        started = time.perf_counter()
        if ts - self._last_scrape >= g.group.interval_ns // 2 or ts < self._last_scrape:
            self._last_scrape = ts
            await self.scraper.scrape(ts)
        to_send: list[dict[str, Any]] = []
        for rs in g.rules:
            t0 = time.perf_counter()
            self.m_evals.labels(g.group.name).inc()
            try:
                vector = await self._query(rs, ts)
                if rs.rule.alerting:
                    to_send.extend(self._alerts(g, rs, vector, ts))
                else:
                    await self._record(g, rs, vector, ts)
                rs.health, rs.last_error = "ok", ""
            except (KelvinError, TemplateError, ValueError) as exc:
                self.m_failures.labels(g.group.name).inc()
                rs.health, rs.last_error = "err", str(exc)
            rs.last_eval = ts
            rs.eval_seconds = time.perf_counter() - t0
        g.last_eval = ts
        g.eval_seconds = time.perf_counter() - started
        self.m_duration.labels(g.group.name).set(g.eval_seconds)
        self.m_last.labels(g.group.name).set(ts / 1e9)
        self.notifier.send(to_send)

    def _source(self, rs: RuleState) -> Source:
        if rs.self_only:
            return _MemoryOnly(self.memory)
        sensors = KelvinSource(self.ctx.reader, self.settings.prometheus_max_series)
        return CombinedSource(sensors, self.memory)

    async def _query(self, rs: RuleState, ts: int) -> Vector:
        s = self.settings
        engine = Engine(
            self._source(rs), round(s.prometheus_lookback_s * 1e9), s.prometheus_max_samples
        )
        value = await engine.instant(rs.rule.expr, ts)
        if isinstance(value, Scalar):
            return Vector([()], value.values[None, :], np.ones((1, 1), dtype=bool))
        assert isinstance(value, Vector)
        return value

    async def _record(self, g: GroupState, rs: RuleState, v: Vector, ts: int) -> None:
        static = {
            k: t.render(Data({}, 0.0, self.settings.external_labels))
            for k, t in rs.rule.labels.items()
        }
        sensors: list[str] = []
        values: list[float] = []
        seen: set[Labels] = set()
        for i, lab in enumerate(v.labels):
            if not v.present[i, 0]:
                continue
            out = (
                {k: val for k, val in lab if k != "__name__"} | static | {"__name__": rs.rule.name}
            )
            key = tuple(sorted((k, val) for k, val in out.items() if val))
            if key in seen:
                raise KelvinError(
                    "vector contains metrics with the same labelset after applying rule labels"
                )
            seen.add(key)
            sensors.append(sensor_name(dict(key), self.settings.rules_record_prefix))
            values.append(float(v.values[i, 0]))
        if g.group.limit and len(sensors) > g.group.limit:
            raise KelvinError(f"exceeded limit of {g.group.limit} with {len(sensors)} series")
        if sensors:
            batch = Batch.from_rows(sensors, np.full(len(sensors), ts, dtype=np.int64), values)
            await self.ctx.storage.write(batch)

    def _alerts(self, g: GroupState, rs: RuleState, v: Vector, ts: int) -> list[dict[str, Any]]:
        rule = rs.rule
        ext = self.settings.external_labels
        seen: set[Labels] = set()
        for i, lab in enumerate(v.labels):
            if not v.present[i, 0]:
                continue
            value = float(v.values[i, 0])
            data = Data(dict(lab), value, ext)
            labels = {k: val for k, val in lab if k != "__name__"}
            for k, t in rule.labels.items():
                labels[k] = t.render(data)
            labels["alertname"] = rule.name
            key = tuple(sorted((k, val) for k, val in labels.items() if val))
            if key in seen:
                raise KelvinError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            seen.add(key)
            annotations = {k: t.render(data) for k, t in rule.annotations.items()}
            a = rs.alerts.get(key)
            if a is None or a.state == "inactive":
                a = rs.alerts[key] = Alert(key, annotations, value, active_at=ts)
            a.value, a.annotations, a.last_seen = value, annotations, ts
        if g.group.limit and len(seen) > g.group.limit:
            rs.alerts.clear()
            raise KelvinError(f"exceeded limit of {g.group.limit} with {len(seen)} alerts")
        for key, a in list(rs.alerts.items()):
            if key not in seen:  # the condition no longer holds (Prometheus' order of checks)
                keep = False
                if a.state == "firing" and rule.keep_firing_for_ns > 0:
                    a.keep_since = a.keep_since or ts
                    keep = ts - a.keep_since < rule.keep_firing_for_ns
                if a.state == "pending" or (
                    a.resolved_at and ts - a.resolved_at > RESOLVED_RETENTION_NS
                ):
                    del rs.alerts[key]
                if a.state != "inactive" and not keep:
                    a.state, a.resolved_at = "inactive", ts
                if not keep:
                    continue
            else:
                a.keep_since = 0
            if a.state == "pending" and ts - a.active_at >= rule.for_ns:
                a.state, a.fired_at = "firing", ts
        return self._due(g, rs, ts)

    def _due(self, g: GroupState, rs: RuleState, ts: int) -> list[dict[str, Any]]:
        resend = round(self.settings.alert_resend_delay_s * 1e9)
        delta = max(resend, g.group.interval_ns)
        out = []
        for a in rs.alerts.values():
            if a.state == "pending":
                continue
            if not (a.resolved_at > a.last_sent or a.last_sent + resend < ts):
                continue
            a.last_sent = ts
            a.valid_until = ts + 4 * delta
            end = a.resolved_at if a.state == "inactive" else a.valid_until
            out.append(
                {
                    "labels": {**self.settings.external_labels, **dict(a.labels)},
                    "annotations": a.annotations,
                    "startsAt": rfc3339(a.fired_at or a.active_at),
                    "endsAt": rfc3339(end),
                    "generatorURL": f"{self.settings.external_url.rstrip('/')}/prometheus/graph?g0.expr="
                    + _quote(to_string(rs.rule.expr)),
                }
            )
        return out

    # ------------------------------------------------------------------ API views
    def rules_api(self, kind: str | None) -> dict[str, Any]:
        groups = []
        for g in self.groups:
            rules = []
            for rs in g.rules:
                r = rs.rule
                if (kind == "alert" and not r.alerting) or (kind == "record" and r.alerting):
                    continue
                common = {
                    "name": r.name,
                    "query": to_string(r.expr),
                    "labels": {k: t.source for k, t in r.labels.items()},
                    "health": rs.health,
                    "evaluationTime": rs.eval_seconds,
                    "lastEvaluation": rfc3339(rs.last_eval)
                    if rs.last_eval
                    else "0001-01-01T00:00:00Z",
                }
                if rs.last_error:
                    common["lastError"] = rs.last_error
                if r.alerting:
                    active = [a for a in rs.alerts.values() if a.state != "inactive"]
                    state = (
                        "firing"
                        if any(a.state == "firing" for a in active)
                        else ("pending" if active else "inactive")
                    )
                    rules.append({
                        "state": state, **common, "duration": r.for_ns / 1e9,
                        "keepFiringFor": r.keep_firing_for_ns / 1e9,
                        "annotations": {k: t.source for k, t in r.annotations.items()},
                        "alerts": [self._alert_api(a) for a in active], "type": "alerting",
                    })  # fmt: skip
                else:
                    if not common["labels"]:
                        del common["labels"]  # omitted when empty, as Prometheus does
                    rules.append({**common, "type": "recording"})
            groups.append({
                "name": g.group.name, "file": g.group.file, "rules": rules,
                "interval": g.group.interval_ns / 1e9, "limit": g.group.limit,
                "evaluationTime": g.eval_seconds,
                "lastEvaluation": rfc3339(g.last_eval) if g.last_eval else "0001-01-01T00:00:00Z",
            })  # fmt: skip
        return {"groups": groups}

    @staticmethod
    def _alert_api(a: Alert) -> dict[str, Any]:
        return {"labels": dict(a.labels), "annotations": a.annotations, "state": a.state,
                "activeAt": rfc3339(a.active_at), "value": go_format_e(a.value)}  # fmt: skip

    def alerts_api(self) -> list[dict[str, Any]]:
        return [
            self._alert_api(a)
            for g in self.groups
            for rs in g.rules
            for a in rs.alerts.values()
            if a.state != "inactive"
        ]


class _MemoryOnly:
    def __init__(self, memory: MemorySeries) -> None:
        self.memory = memory

    async def select(self, matchers: Any, start_ns: int, end_ns: int) -> Any:
        return self.memory.select(matchers, start_ns, end_ns)

    async def names(self, matchers: Any) -> list[Labels]:
        return [s.labels for s in self.memory.select(matchers, -(2**62), 2**62)]


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
