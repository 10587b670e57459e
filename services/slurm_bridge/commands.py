"""Slurm through its commands (``squeue``/``sinfo --json``, ``scontrol``), on a host with munge.

For a bridge next to slurmctld (or any host with Slurm's client commands
and the cluster's munge key). Each call runs one command with a timeout;
a command that cannot be run, or times out, is :class:`SlurmUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any

from services.common.tasks import wait_for
from services.slurm_bridge.client import SlurmClient, SlurmError, SlurmUnavailable, Snapshot
from services.slurm_bridge.model import parse_jobs, parse_nodes


class CommandClient(SlurmClient):
    """``squeue``, ``sinfo`` and ``scontrol`` as subprocesses."""

    name = "commands"

    def __init__(
        self,
        bin_dir: str | None = None,
        slurm_conf: str | None = None,
        timeout_s: float = 10.0,
        partitions: frozenset[str] = frozenset(),
    ) -> None:
        self.bin_dir = bin_dir
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self.timeout_s = timeout_s
        self.partitions = partitions

    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    async def _run(self, args: Sequence[str]) -> bytes:
        try:
            proc = await asyncio.create_subprocess_exec(
                self._cmd(args[0]),
                *args[1:],
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
                env=self.env,
            )
        except OSError as exc:
            raise SlurmUnavailable(f"cannot run {args[0]}: {exc.strerror or exc}") from exc
        try:
            out, err = await wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SlurmUnavailable(f"{' '.join(args)}: no answer in {self.timeout_s} s") from None
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            cls = SlurmUnavailable if "Unable to contact slurm controller" in text else SlurmError
            raise cls(f"{' '.join(args)}: exit {proc.returncode}: {text[:300]}")
        return out

    async def _json(self, args: Sequence[str]) -> Any:
        out = await self._run(args)
        try:
            return json.loads(out)
        except ValueError as exc:
            raise SlurmError(f"{' '.join(args)}: not JSON: {out[:120]!r}") from exc

    async def snapshot(self) -> Snapshot:
        jobs, nodes = await asyncio.gather(
            self._json(["squeue", "--json", "--states=all"]), self._json(["sinfo", "--json"])
        )
        return Snapshot(parse_jobs(jobs, self.partitions), parse_nodes(nodes))

    async def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        n = len(nodes)
        await self._run(
            [
                "scontrol",
                "update",
                f"JobId={job_id}",
                f"NumNodes={n}-{n}",
                f"ReqNodeList={','.join(nodes)}",
            ]
        )

    async def hold(self, job_id: str) -> None:
        await self._run(["scontrol", "hold", job_id])

    async def release(self, job_id: str) -> None:
        await self._run(["scontrol", "release", job_id])
