"""Prometheus rule files: groups of recording and alerting rules, read and checked at load.

The format is Prometheus' own (``groups: [{name, interval, limit, rules: [{record |
alert, expr, for, keep_firing_for, labels, annotations}]}]``), so one file serves
Kelvin, a Prometheus and vmalert alike. Every problem is reported with the file,
the group and the rule, before anything is evaluated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.common.errors import ConfigError
from services.query_api.promql import PromQLError, parse, parse_duration_ns
from services.query_api.promql.ast import Expr, ValueType
from services.query_api.rules.template import Template, TemplateError

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


@dataclass
class Rule:
    name: str
    expr: Expr
    query: str
    alerting: bool
    for_ns: int = 0
    keep_firing_for_ns: int = 0
    labels: dict[str, Template] = field(default_factory=dict)
    annotations: dict[str, Template] = field(default_factory=dict)


@dataclass
class Group:
    name: str
    file: str
    interval_ns: int
    limit: int
    rules: list[Rule]


def _duration(text: Any, where: str) -> int:
    try:
        return parse_duration_ns(str(text)) if str(text) not in ("0", "0s") else 0
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _templates(raw: Any, where: str, labels: bool) -> dict[str, Template]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of names to strings")
    out = {}
    for k, v in raw.items():
        if labels and (not _LABEL.fullmatch(str(k)) or str(k) == "__name__"):
            raise ConfigError(f"{where}: invalid label name {k!r}")
        try:
            out[str(k)] = Template(str(v))
        except TemplateError as exc:
            raise ConfigError(f"{where}.{k}: {exc}") from None
    return out


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a rule is a mapping")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    record, alert = raw.get("record"), raw.get("alert")
    if bool(record) == bool(alert):
        raise ConfigError(f"{where}: a rule has exactly one of 'record' and 'alert'")
    name = str(record or alert)
    where = f"{where} ({name})"
    if record and not _METRIC.fullmatch(name):
        raise ConfigError(f"{where}: invalid recording rule name {name!r}")
    query = str(raw.get("expr") or "")
    if not query:
        raise ConfigError(f"{where}: field 'expr' must be set")
    try:
        expr = parse(query)
    except PromQLError as exc:
        raise ConfigError(f"{where}: could not parse expression: {exc}") from None
    if expr.type not in (ValueType.VECTOR, ValueType.SCALAR):
        raise ConfigError(f"{where}: the expression is a {expr.type.documented}, not a vector")
    if record and ("for" in raw or "annotations" in raw or "keep_firing_for" in raw):
        raise ConfigError(f"{where}: 'for', 'keep_firing_for' and 'annotations' are for alerts")
    return Rule(
        name=name,
        expr=expr,
        query=query,
        alerting=bool(alert),
        for_ns=_duration(raw.get("for", "0"), where),
        keep_firing_for_ns=_duration(raw.get("keep_firing_for", "0"), where),
        labels=_templates(raw.get("labels"), f"{where}: labels", labels=True),
        annotations=_templates(raw.get("annotations"), f"{where}: annotations", labels=False),
    )


def parse_groups(text: str, file: str, default_interval_ns: int) -> list[Group]:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"rule file {file}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups", []), list):
        raise ConfigError(f"rule file {file}: expected 'groups:' with a list of groups")
    groups: list[Group] = []
    seen: set[str] = set()
    for i, g in enumerate(doc.get("groups") or []):
        if not isinstance(g, dict) or not g.get("name"):
            raise ConfigError(f"rule file {file}: group {i + 1} has no name")
        name = str(g["name"])
        if name in seen:
            raise ConfigError(f"rule file {file}: group name {name!r} is repeated")
        seen.add(name)
        where = f"rule file {file}, group {name}"
        interval = _duration(g["interval"], where) if g.get("interval") else default_interval_ns
        rules = [_rule(r, f"{where}, rule {j + 1}") for j, r in enumerate(g.get("rules") or [])]
        groups.append(
            Group(name, file, interval or default_interval_ns, int(g.get("limit") or 0), rules)
        )
    return groups


def load(paths: list[Path], default_interval_ns: int) -> list[Group]:
    out: list[Group] = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"rule file {p}: cannot be read: {exc}") from None
        out.extend(parse_groups(text, str(p), default_interval_ns))
    return out
