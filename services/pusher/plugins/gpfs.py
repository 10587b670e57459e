"""``gpfs``: IBM Storage Scale (GPFS) I/O counters from ``mmpmon``, per file system.

By default every read runs ``mmpmon -p -s`` with the request ``fs_io_s`` on
stdin (machine-readable output, one line per mounted file system); ``file``
reads the same output from a file instead (e.g. written by a site's cron job).
Sensors ``<prefix>/<fs>/<counter>``: ``bytes_read``, ``bytes_written`` (B),
``opens``, ``closes``, ``reads``, ``writes``, ``readdirs``, ``inode_updates``;
all monotonic counters (set ``delta: true`` for per-interval amounts). With
``request: io_s`` the counters are the node's totals under ``<prefix>/all/...``.
"""

from __future__ import annotations

import contextlib
from typing import Literal

from services.common.errors import ConfigError
from services.common.schema import model_validator
from services.pusher.plugins.base import Group, Plugin, PluginConfig
from services.pusher.plugins.text import ParsedGroup, TextSource

COUNTERS = {
    "br": ("bytes_read", "B"),
    "bw": ("bytes_written", "B"),
    "oc": ("opens", None),
    "cc": ("closes", None),
    "rdc": ("reads", None),
    "wc": ("writes", None),
    "dir": ("readdirs", None),
    "iu": ("inode_updates", None),
}


MMPMON = ["/usr/lpp/mmfs/bin/mmpmon", "-p", "-s"]
"""The default command (the only one a section loaded over REST may run)."""


class GpfsConfig(PluginConfig):
    command: list[str] | None = None
    """The mmpmon command (default ``/usr/lpp/mmfs/bin/mmpmon -p -s``)."""
    file: str | None = None
    """Read mmpmon -p output from this file instead of running mmpmon."""
    request: Literal["fs_io_s", "io_s"] = "fs_io_s"
    filesystems: list[str] | None = None
    """File systems to publish (default all that mmpmon reports at load)."""

    @model_validator(mode="after")
    def _one_source(self) -> GpfsConfig:
        if self.command is not None and self.file is not None:
            raise ValueError("give either 'command' or 'file', not both")
        return self


def parse_mmpmon(text: str) -> dict[str, float]:
    """``_fs_io_s_ ... _fs_ gpfs0 ... _br_ 123 ...`` lines -> {``gpfs0/br``: 123.0, ...}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("_fs_io_s_", "_io_s_"):
            continue
        fields = dict(zip(parts[1::2], parts[2::2], strict=False))
        if fields.get("_rc_", "0") != "0":
            continue
        fs = fields.get("_fs_", "all") if parts[0] == "_fs_io_s_" else "all"
        for key in COUNTERS:
            raw = fields.get(f"_{key}_")
            if raw is not None:
                with contextlib.suppress(ValueError):
                    out[f"{fs}/{key}"] = float(raw)
    return out


class GpfsPlugin(Plugin):
    """GPFS I/O counters."""

    Config = GpfsConfig
    description = "GPFS/Storage Scale I/O counters (mmpmon, or its output in a file)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, GpfsConfig)
        if cfg.file is not None:
            source = TextSource("mmpmon", path=self.context.path(cfg.file))
        else:
            argv = self.context.command(cfg.command or MMPMON, MMPMON)
            source = TextSource("mmpmon", argv=argv, stdin=cfg.request + "\n")
        self.entities.append(source)
        found = parse_mmpmon(await source.text())
        fss = sorted({k.split("/")[0] for k in found})
        if cfg.filesystems is not None:
            missing = sorted(set(cfg.filesystems) - set(fss))
            if missing:
                raise ConfigError(
                    f"gpfs plugin {self.context.instance!r}: mmpmon reports no file system "
                    f"{', '.join(missing)}; it reports {', '.join(fss) or 'none'}"
                )
            fss = list(cfg.filesystems)
        opts = self.group_options()
        keys = [f"{fs}/{c}" for fs in fss for c in COUNTERS if f"{fs}/{c}" in found]
        sensors = [
            self.sensor(
                f"{k.split('/')[0]}/{COUNTERS[k.split('/')[1]][0]}",
                opts,
                COUNTERS[k.split("/")[1]][1],
                monotonic=True,
            )
            for k in keys
        ]
        return [ParsedGroup("mmpmon", sensors, opts, source, parse_mmpmon, keys)]
