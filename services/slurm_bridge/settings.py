"""Settings of the Slurm bridge (YAML section ``slurm_bridge``, env prefix ``KELVIN_SLURM_BRIDGE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class Settings(SectionSettings):
    """slurm_bridge settings."""

    section: ClassVar[str] = "slurm_bridge"
    model_config = SettingsConfigDict(env_prefix="KELVIN_SLURM_BRIDGE_")

    host: str = "0.0.0.0"
    """HTTP bind address (health, metrics, the prolog/epilog notifications)."""
    port: int = Field(8084, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    allocator_url: str = "http://127.0.0.1:8083"
    """The allocator (``allocator.cluster: external``) that places the jobs."""
    allocator_token: str | None = None
    """The allocator's admin credential (``KELVIN_SLURM_BRIDGE_ALLOCATOR_TOKEN``); None = the
    shared ``auth`` section's admin token."""
    mode: Literal["place", "release", "observe"] = "place"
    """place: Kelvin chooses every managed job's nodes; release: held jobs are released as
    they are, Slurm places them (roll-back, or Slurm's placement to compare with); observe:
    touch no job, only report the cluster to the allocator."""
    slurm_api: Literal["rest", "commands"] = "rest"
    """How to reach Slurm: slurmrestd with JWT, or squeue/sinfo/scontrol on this host."""
    slurmrestd_url: str = "http://127.0.0.1:6820"
    """slurmrestd's address (slurm_api: rest)."""
    slurmrestd_version: str = "v0.0.38"
    """OpenAPI plugin slurmrestd serves (Slurm 22.05: v0.0.38)."""
    jwt_user: str = "slurm"
    """The Slurm user the JWT is for (an operator: root or SlurmUser, who may update any job)."""
    token: str | None = None
    """A JWT (set through ``KELVIN_SLURM_BRIDGE_TOKEN``); prefer one of the renewable sources."""
    token_file: Path | None = None
    """A file holding the JWT (``SLURM_JWT=...`` or bare), read again when it changes."""
    jwt_key_file: Path | None = None
    """Slurm's JWT signing key: the bridge signs and renews its own tokens."""
    token_command: list[str] | None = None
    """A command printing a JWT, run again before the token expires (``[scontrol, token, lifespan=3600]``)."""
    token_lifespan_s: int = Field(3600, ge=60)
    """Lifespan of tokens the bridge signs or asks for."""
    commands_dir: str | None = None
    """Directory of squeue/sinfo/scontrol (slurm_api: commands); None = PATH."""
    slurm_conf: str | None = None
    """SLURM_CONF for the commands (None = their default, /etc/slurm/slurm.conf)."""
    slurm_timeout_s: float = Field(10.0, gt=0)
    """Longest wait for one Slurm or allocator request."""
    partitions: list[str] = []
    """Jobs in these partitions are Kelvin's even without the Lua's mark (the bridge holds them
    when it sees them); the shipped job_submit.lua's KELVIN_PARTITIONS should list the same."""
    node_names: str | None = None
    """Slurm host list naming the hall's present nodes in index order, e.g. ``n[01-40]``."""
    node_map: dict[str, Any] | None = None
    """Or explicitly: {slurm node: hall index or ``rowR/rackK/slotS``}."""
    poll_interval_s: float = Field(2.0, gt=0)
    """Reconcile at least this often (the prolog/epilog notifications wake it at once)."""
    wake_port: int | None = Field(None, ge=0, le=65535)
    """UDP port the shipped job_submit.lua sends a wake-up datagram to at every submit, so a
    new job is placed at once rather than at the next poll (None = off; 0 = any free port)."""
    notify_token: str | None = None
    """One more write credential, for the shipped PrologSlurmctld/EpilogSlurmctld script on the
    controller (so it needs no shared token); the bridge's routes take the shared ``auth``
    section's tokens too."""
