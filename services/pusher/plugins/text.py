"""Sources that print text (a command or a file) and a group that parses it per read.

Shared by the plugins whose data comes from tools (``ipmitool``, ``mmpmon``,
``perfquery``) or from counter files. A command runs as an asyncio subprocess
in its own session: when the read times out, the whole session is killed, so
a hung tool never outlives its read. Files are read in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path

from services.common.errors import KelvinError
from services.pusher.plugins.base import Entity, Group, GroupOptions, Sensor, Values

Parser = Callable[[str], Mapping[str, float]]


async def run_command(
    argv: list[str], stdin: bytes | None = None, env: Mapping[str, str] | None = None
) -> str:
    """stdout of ``argv``; KelvinError with its last stderr line if it fails.

    ``env`` adds variables to the current environment (secrets go here, not in argv).
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **env} if env else None,
            start_new_session=True,  # so that a timeout kills whatever it started, too
        )
    except OSError as exc:
        raise KelvinError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    try:
        out, err = await proc.communicate(stdin)
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise KelvinError(
            f"{Path(argv[0]).name} exited with {proc.returncode}: "
            f"{lines[-1] if lines else 'no message'}"
        )
    return out.decode(errors="replace")


class TextSource(Entity):
    """A command (argv, optional stdin) or a file whose text is parsed on every read."""

    def __init__(
        self,
        name: str,
        argv: list[str] | None = None,
        path: Path | None = None,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name)
        if (argv is None) == (path is None):
            raise ValueError("a text source is either a command or a file")
        self.argv = argv
        self.path = path
        self.stdin = stdin.encode() if stdin is not None else None
        self.env = env

    async def text(self) -> str:
        if self.argv is not None:
            return await run_command(self.argv, self.stdin, self.env)
        assert self.path is not None
        try:
            return await asyncio.to_thread(self.path.read_text, encoding="utf-8", errors="replace")
        except OSError as exc:
            raise KelvinError(f"cannot read {self.path}: {exc.strerror}") from exc


class ParsedGroup(Group):
    """Sensors whose values are keys of what ``parser`` makes of the source's text."""

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        source: TextSource,
        parser: Parser,
        keys: list[str],
        multipliers: list[float] | None = None,
    ) -> None:
        super().__init__(name, sensors, options, source)
        self.source = source
        self.parser = parser
        self.keys = keys
        self.mult = None if multipliers is None else [float(m) for m in multipliers]

    async def read_async(self, timestamp_ns: int) -> Values:
        found = self.parser(await self.source.text())
        nan = float("nan")
        if self.mult is None:
            return array("d", [found.get(k, nan) for k in self.keys])
        return array(
            "d", [found.get(k, nan) * m for k, m in zip(self.keys, self.mult, strict=True)]
        )
