"""How the bridge talks to Slurm: read jobs and nodes, set a job's nodes, hold, release.

Two implementations answer the same five calls: :mod:`.rest` (slurmrestd
with JWT) and :mod:`.commands` (``squeue``/``sinfo``/``scontrol`` on a host
with munge). Every call is idempotent: setting the nodes a job already has,
holding a held job or releasing a released one changes nothing, so the
reconcile loop may repeat any step after a crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from services.common.errors import KelvinError
from services.slurm_bridge.model import SlurmJob, SlurmNode


class SlurmError(KelvinError):
    """Slurm refused a request or could not be reached."""


class SlurmUnavailable(SlurmError):
    """Slurm (slurmctld or slurmrestd) did not answer: try again later."""


@dataclass(frozen=True)
class Snapshot:
    """Slurm's jobs and nodes, read together."""

    jobs: list[SlurmJob]
    nodes: list[SlurmNode]


class SlurmClient(ABC):
    """The bridge's five calls to Slurm."""

    name: str

    @abstractmethod
    async def snapshot(self) -> Snapshot:
        """Every job Slurm still knows (pending, running, recently ended) and every node."""

    @abstractmethod
    async def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        """Make a pending job need exactly ``nodes`` (``NumNodes=n-n ReqNodeList=...``)."""

    @abstractmethod
    async def hold(self, job_id: str) -> None: ...

    @abstractmethod
    async def release(self, job_id: str) -> None: ...

    async def close(self) -> None:
        """Release connections (idempotent)."""
        return None
