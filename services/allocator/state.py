"""Which node runs which job, and what every node draws: the hall's occupancy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from services.allocator.model import Float64Array, HallModel, IntArray
from services.common.errors import NotFoundError


class HallState:
    """Occupancy of a hall: per-node owner and power; free present nodes idle, absent nodes off.

    A node the workload manager cannot give out (drained, down, reserved) is
    ``unavailable``: never free, drawing idle power unless a job holds it.
    """

    def __init__(self, model: HallModel) -> None:
        self.model = model
        hall = model.hall
        self.owner: list[str | None] = [None] * model.n
        self.powers_w: Float64Array = np.where(model.present, hall.idle_power_w, 0.0)
        self.busy: npt.NDArray[np.bool_] = np.zeros(model.n, dtype=bool)
        self.jobs: dict[str, IntArray] = {}
        self.unavailable: npt.NDArray[np.bool_] = np.zeros(model.n, dtype=bool)

    @property
    def free(self) -> npt.NDArray[np.bool_]:
        return self.model.present & ~self.busy & ~self.unavailable

    @property
    def free_count(self) -> int:
        return int(self.free.sum())

    @property
    def utilization(self) -> float:
        return float(self.busy.sum() / self.model.present.sum())

    def place(
        self, job_id: str, nodes: npt.ArrayLike, power_w: float, observed: bool = False
    ) -> None:
        """Give ``nodes`` to a job; ``observed``: it already runs there (an unavailable node is fine)."""
        idx = np.asarray(nodes, dtype=np.int64)
        if job_id in self.jobs:
            raise ValueError(f"job {job_id!r} is already placed")
        ok = (self.model.present & ~self.busy) if observed else self.free
        if not bool(ok[idx].all()) or len(np.unique(idx)) != len(idx):
            taken = [int(i) for i in idx if not ok[i]]
            raise ValueError(f"job {job_id!r}: nodes {taken} are not free")
        self.busy[idx] = True
        self.powers_w[idx] = power_w
        for i in idx.tolist():
            self.owner[i] = job_id
        self.jobs[job_id] = idx

    def release(self, job_id: str) -> IntArray:
        try:
            idx = self.jobs.pop(job_id)
        except KeyError:
            raise NotFoundError(f"job {job_id!r} holds no nodes") from None
        self.busy[idx] = False
        self.powers_w[idx] = self.model.hall.idle_power_w
        for i in idx.tolist():
            self.owner[i] = None
        return idx

    def shrink(self, job_id: str, keep: npt.ArrayLike) -> None:
        """A job gives back all its nodes but ``keep`` (Slurm frees a completing job's nodes
        one by one)."""
        held = self.jobs[job_id]
        kept = np.intersect1d(held, np.asarray(keep, dtype=np.int64))
        gone = np.setdiff1d(held, kept)
        self.busy[gone] = False
        self.powers_w[gone] = self.model.hall.idle_power_w
        for i in gone.tolist():
            self.owner[i] = None
        self.jobs[job_id] = kept

    def rebind(self, model: HallModel) -> None:
        """Keep the occupancy, change the model (a recalibrated D over the same layout)."""
        if model.n != self.model.n or not bool((model.present == self.model.present).all()):
            raise ValueError("a new hall model must keep the layout")
        self.model = model
