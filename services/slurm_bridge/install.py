"""The files a site puts next to slurm.conf, with its values filled in.

``job_submit.lua`` (holds and marks Kelvin's jobs, refuses users' changes to
them), ``kelvin-notify.sh`` (PrologSlurmctld/EpilogSlurmctld) and its
``kelvin-notify.conf``; :data:`SLURM_CONF_LINES` are the slurm.conf
additions (docs/slurm.md explains each).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from services.common.errors import ConfigError

SLURM_CONF_LINES = (
    "JobSubmitPlugins=lua",
    "PrologSlurmctld={dir}/kelvin-notify.sh",
    "EpilogSlurmctld={dir}/kelvin-notify.sh",
    "SchedulerParameters=batch_sched_delay=0  # merged with the site's own parameters",
    "AuthAltTypes=auth/jwt",
    "AuthAltParameters=jwt_key={dir}/jwt_hs256.key",
)
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _text(name: str) -> str:
    return resources.files("services.slurm_bridge.files").joinpath(name).read_text("utf-8")


def render_lua(
    partitions: Sequence[str],
    default_partition: str,
    operators: Sequence[int],
    wake: tuple[str, int] | None = None,
) -> str:
    """``job_submit.lua`` for these partitions ([] = all), operator uids and the bridge's UDP
    wake-up address (an IP address: the Lua must never wait for a name lookup)."""
    for p in [*partitions, default_partition]:
        if p and not _NAME.match(p):
            raise ConfigError(f"partition name {p!r}: expected letters, digits, '_', '.', '-'")
    host, port = wake or ("", 0)
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"wake host {host!r}: expected an IP address") from None
    parts = ", ".join(f'"{p}"' for p in partitions)
    ops = ", ".join(str(int(u)) for u in sorted(set(operators)))
    return (
        _text("job_submit.lua")
        .replace("@PARTITIONS@", parts)
        .replace("@DEFAULT_PARTITION@", default_partition)
        .replace("@OPERATORS@", ops)
        .replace("@WAKE_HOST@", host)
        .replace("@WAKE_PORT@", str(int(port)))
    )


def write_files(
    directory: Path,
    bridge_url: str,
    partitions: Sequence[str] = (),
    default_partition: str = "",
    operators: Sequence[int] = (0,),
    token_file: Path | None = None,
    wake: tuple[str, int] | None = None,
) -> list[Path]:
    """Write the three files into ``directory``; returns their paths."""
    if not bridge_url.startswith(("http://", "https://")) or any(c in bridge_url for c in "\n'\""):
        raise ConfigError(f"bridge URL {bridge_url!r}: expected http://host:port")
    directory.mkdir(parents=True, exist_ok=True)
    lua = directory / "job_submit.lua"
    lua.write_text(render_lua(partitions, default_partition, operators, wake), encoding="utf-8")
    script = directory / "kelvin-notify.sh"
    script.write_text(_text("kelvin-notify.sh"), encoding="utf-8")
    os.chmod(script, 0o755)
    conf = directory / "kelvin-notify.conf"
    lines = [f"KELVIN_BRIDGE_URL={bridge_url.rstrip('/')}"]
    if token_file is not None:
        lines.append(f"KELVIN_TOKEN_FILE={token_file}")
    conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.chmod(conf, 0o644)
    return [lua, script, conf]
