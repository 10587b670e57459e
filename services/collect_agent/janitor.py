"""The spool janitor: a drain Job for every retained spool claim a scale-down left behind.

A StatefulSet scale-down (``kubectl scale``, an HPA) keeps the removed ordinals' spool
claims (``whenScaled: Retain``); what their agents could not drain in the grace period
waits there. The chart's CronJob runs ``kelvin spool orphans`` every few minutes: it
reads the StatefulSet's live ``spec.replicas`` (and ``spec.ordinals.start``), finds the
claims ``<template>-<statefulset>-<ordinal>`` of ordinals it does not run that no live
pod mounts, and creates for each the chart's drain Job (``kelvin spool drain`` on that
claim; :func:`drain_job` fills the claim into the Job the chart rendered).

Races, and why each is harmless:

- The ordinal comes back while its drain Job runs: the agent waits for the spool's lock
  and asks for it (``want``), the drain hands it back and exits non-zero, and its retry
  finds the agent holding the lock and exits 0; the agent replays the rest. (A
  ReadWriteOnce claim the Job's pod holds on another node keeps the agent's pod waiting
  to attach until the drain is done.) The StatefulSet is read again just before each
  Job is created, so an ordinal already back gets none.
- Two janitor runs at once: Job names are deterministic (``<sts>-drain-<ordinal>-g<the
  StatefulSet's generation>``), so the second create is a 409 and counts as done.
- A Job per generation: replicas changing bumps the generation, so an ordinal that
  returned and left again gets a new Job (a drain of an empty spool exits 0 at once).
  An unfinished drain Job of any generation for the claim (the Helm hook's included) or
  a live pod mounting it (the agent still draining on SIGTERM) means none is made; a
  Job that failed is followed by another (``-r<n>``).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from services.collect_agent.kube_api import Conflict, KubeApi

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MANAGED_BY = "kelvin-spool-janitor"
CLAIM_ANNOTATION = "kelvin.io/spool-claim"


@dataclass(frozen=True, slots=True)
class Action:
    """What one run did (or would do) about one retained claim."""

    claim: str
    ordinal: int
    outcome: str
    """``created``, ``exists`` (a Job of this name), ``draining`` (an unfinished drain Job),
    ``mounted`` (a live pod uses the claim), ``returned`` (the ordinal runs again)."""
    job: str = ""


def job_name(statefulset: str, ordinal: int, generation: int, retry: int = 0) -> str:
    """``<sts>-drain-<ordinal>-g<generation>`` (``-r<retry>`` after failed ones), shortened
    (with a hash) to a DNS label."""
    tail = f"-drain-{ordinal}-g{generation}" + (f"-r{retry}" if retry else "")
    name = statefulset + tail
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(statefulset.encode()).hexdigest()[:8]
    return f"{statefulset[: 63 - len(tail) - 9].rstrip('-')}-{digest}{tail}"


def drain_job(template: Obj, name: str, claim: str) -> Obj:
    """The chart's drain Job for ``claim`` under ``name`` (its ``spool`` volume filled in)."""
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    meta["name"] = name
    meta.pop("namespace", None)
    meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = MANAGED_BY
    meta.setdefault("annotations", {})[CLAIM_ANNOTATION] = claim
    volumes = job["spec"]["template"]["spec"]["volumes"]
    (spool,) = [v for v in volumes if v["name"] == "spool"]
    spool["persistentVolumeClaim"] = {"claimName": claim}
    return job


def _claims_of(spec: Obj) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in spec.get("volumes") or []
        if v.get("persistentVolumeClaim")
    }


def _condition(job: Obj) -> str:
    """``Complete``, ``Failed`` or "" (still running)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return ""


class Janitor:
    """One pass over a StatefulSet's retained spool claims (:meth:`run`)."""

    def __init__(
        self, api: KubeApi, statefulset: str, template: Obj, claim_template: str = "spool"
    ) -> None:
        self.api = api
        self.statefulset = statefulset
        self.template = template
        self.claim_re = re.compile(rf"^{re.escape(claim_template)}-{re.escape(statefulset)}-(\d+)$")

    def _live(self) -> tuple[range, int]:
        """The ordinals the StatefulSet runs now (``spec.ordinals.start`` on), its generation."""
        sts = self.api.get("apps/v1", "statefulsets", self.statefulset)
        spec = sts.get("spec") or {}
        replicas = 1 if spec.get("replicas") is None else int(spec["replicas"])
        start = int((spec.get("ordinals") or {}).get("start", 0))
        return range(start, start + replicas), int(sts["metadata"].get("generation", 0))

    def _drain_jobs(self) -> list[Obj]:
        labels = (self.template.get("metadata") or {}).get("labels") or {}
        keys = ("app.kubernetes.io/instance", "app.kubernetes.io/component")
        selector = ",".join(f"{k}={labels[k]}" for k in keys if k in labels)
        return self.api.list("batch/v1", "jobs", selector)

    def run(self, dry_run: bool = False) -> list[Action]:
        """Create the drain Jobs that are missing; what was done about each orphaned claim."""
        live, _ = self._live()
        orphans = sorted(
            (int(m.group(1)), name)
            for pvc in self.api.list("", "persistentvolumeclaims")
            if (m := self.claim_re.match(name := pvc["metadata"]["name"]))
            and int(m.group(1)) not in live
            and not pvc["metadata"].get("deletionTimestamp")
        )
        if not orphans:
            return []
        mounted: set[str] = set()
        for pod in self.api.list("", "pods"):
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                mounted |= _claims_of(pod.get("spec") or {})
        jobs = {j["metadata"]["name"]: j for j in self._drain_jobs()}
        draining: set[str] = set()
        for j in jobs.values():
            if not _condition(j):
                draining |= _claims_of(j["spec"]["template"]["spec"])
        out: list[Action] = []
        for ordinal, claim in orphans:
            if claim in mounted:
                out.append(Action(claim, ordinal, "mounted"))
            elif claim in draining:
                out.append(Action(claim, ordinal, "draining"))
            else:
                out.append(self._create(ordinal, claim, jobs, dry_run))
        return out

    def _create(self, ordinal: int, claim: str, jobs: dict[str, Obj], dry_run: bool) -> Action:
        # Read again right before: an HPA or kubectl may have brought the ordinal back.
        live, generation = self._live()
        if ordinal in live:
            return Action(claim, ordinal, "returned")
        retry = 0  # a Job that failed (its retries spent) is followed by another
        while True:
            name = job_name(self.statefulset, ordinal, generation, retry)
            if name not in jobs:
                break
            if _condition(jobs[name]) != "Failed":
                return Action(claim, ordinal, "exists", name)  # drained in this generation
            retry += 1
        if dry_run:
            return Action(claim, ordinal, "would create", name)
        try:
            self.api.create("batch/v1", "jobs", drain_job(self.template, name, claim))
        except Conflict:
            return Action(claim, ordinal, "exists", name)  # another run made it just now
        log.warning(
            "spool claim %s of removed ordinal %d: created the drain Job %s", claim, ordinal, name
        )
        return Action(claim, ordinal, "created", name)
