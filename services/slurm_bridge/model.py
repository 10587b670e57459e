"""Slurm's jobs and nodes as the bridge sees them, parsed from OpenAPI v0.0.38 JSON.

slurmrestd (``GET /slurm/v0.0.38/jobs``, ``/nodes``) and the commands
(``squeue --json``, ``sinfo --json``, Slurm 22.05) answer in the same
schema, so both clients share these parsers. Only the fields the bridge
needs are read; a record missing one of them is an error that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.common.errors import KelvinError
from services.slurm_bridge import hostlist

MARKER = "kelvin"
"""``AdminComment`` prefix the shipped ``job_submit.lua`` gives every job Kelvin places."""
NO_LIMIT = {None, 0xFFFFFFFF, 0xFFFFFFFE}
"""Slurm's INFINITE and NO_VAL: no time limit."""
_COMM = re.compile(r"(?:^|[\s,;:])comm=([0-9]*\.?[0-9]+)")

PENDING = "PENDING"
ACTIVE = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED"})
"""Job states that hold nodes."""


class SlurmDataError(KelvinError, ValueError):
    """Slurm answered with a record the bridge cannot read."""


@dataclass(frozen=True)
class SlurmJob:
    """One job: what placement needs to know about it."""

    id: str
    state: str
    """Slurm's job state, upper case (PENDING, RUNNING, COMPLETED, ...)."""
    reason: str
    managed: bool
    """Marked by the shipped job_submit.lua (or in a partition the bridge manages)."""
    held: bool
    """Priority 0: held (by the Lua at submit, or by the bridge)."""
    size: int
    """Nodes it asks for (pending) or holds."""
    nodes: tuple[str, ...]
    """Nodes it runs on (running) — empty while pending."""
    required: tuple[str, ...]
    """Its ReqNodeList: where it may start."""
    partition: str
    user: str
    name: str
    comment: str
    submit_s: int
    start_s: int | None
    end_s: int | None
    time_limit_s: float | None

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def comm_share(self) -> float:
        """The communication share C from a ``--comment`` like ``kelvin:comm=0.3`` (else 0)."""
        m = _COMM.search(self.comment)
        return min(1.0, float(m.group(1))) if m else 0.0


@dataclass(frozen=True)
class SlurmNode:
    """One node: its state as placement needs it."""

    name: str
    state: str
    """idle, allocated, drained, draining, down, reserved or completing."""
    reason: str


def _get(rec: dict[str, Any], key: str, what: str) -> Any:
    try:
        return rec[key]
    except KeyError:
        raise SlurmDataError(f"Slurm {what} record without {key!r}: {str(rec)[:120]}") from None


def _hosts(value: Any) -> tuple[str, ...]:
    if not value or not isinstance(value, str) or value == "(null)":
        return ()
    return tuple(hostlist.expand(value))


def _seconds(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None


def parse_job(rec: dict[str, Any], partitions: frozenset[str] = frozenset()) -> SlurmJob:
    """A job record of ``/jobs`` or ``squeue --json``."""
    state = str(_get(rec, "job_state", "job")).upper()
    partition = str(rec.get("partition") or "")
    admin = str(rec.get("admin_comment") or "")
    limit = rec.get("time_limit")
    nodes = _hosts(rec.get("nodes")) if state != PENDING else ()
    return SlurmJob(
        id=str(_get(rec, "job_id", "job")),
        state=state,
        reason=str(rec.get("state_reason") or ""),
        managed=admin.startswith(MARKER) or partition in partitions,
        held=state == PENDING and int(rec.get("priority") or 0) == 0,
        size=max(1, int(rec.get("node_count") or 1)),
        nodes=nodes,
        required=_hosts(rec.get("required_nodes")),
        partition=partition,
        user=str(rec.get("user_name") or ""),
        name=str(rec.get("name") or ""),
        comment=str(rec.get("comment") or ""),
        submit_s=int(rec.get("submit_time") or 0),
        start_s=_seconds(rec.get("start_time")) if state != PENDING else None,
        end_s=_seconds(rec.get("end_time")) if state not in ACTIVE and state != PENDING else None,
        time_limit_s=float(limit) * 60.0
        if isinstance(limit, int | float) and limit not in NO_LIMIT
        else None,
    )


_DOWN_FLAGS = {"NOT_RESPONDING", "FAIL", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT"}


def parse_node(rec: dict[str, Any]) -> SlurmNode:
    """A node record of ``/nodes`` or ``sinfo --json``, reduced to what placement needs."""
    base = str(_get(rec, "state", "node")).lower()
    flags = {str(f).upper() for f in rec.get("state_flags") or ()}
    busy = base in ("allocated", "mixed")
    if base in ("down", "error", "future", "unknown") or flags & _DOWN_FLAGS:
        state = "down"
    elif "DRAIN" in flags or "DRAINING" in flags or "DRAINED" in flags:
        state = "draining" if busy else "drained"
    elif "COMPLETING" in flags or base == "completing":
        state = "completing"
    elif busy:
        state = "allocated"
    elif flags & {"RESERVED", "MAINTENANCE"}:
        state = "reserved"
    else:
        state = "idle"
    return SlurmNode(str(_get(rec, "name", "node")), state, str(rec.get("reason") or ""))


def parse_jobs(doc: Any, partitions: frozenset[str] = frozenset()) -> list[SlurmJob]:
    return [parse_job(r, partitions) for r in _records(doc, "jobs")]


def parse_nodes(doc: Any) -> list[SlurmNode]:
    return [parse_node(r) for r in _records(doc, "nodes")]


def _records(doc: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise SlurmDataError(f"Slurm answer without a {key!r} list: {str(doc)[:120]}")
    errors = [e for e in doc.get("errors") or [] if e]
    if errors:
        raise SlurmDataError(f"Slurm reported errors: {errors[:3]}")
    return [r for r in doc[key] if isinstance(r, dict)]
