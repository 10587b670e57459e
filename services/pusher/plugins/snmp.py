"""``snmp``: OIDs of SNMP agents (PDUs, UPS, CRAC units, switches), v1, v2c and v3.

One entity and one group per agent; a read is one asynchronous GET (pysnmp's
asyncio API, up to ``max_oids_per_get`` OIDs per PDU) on the event loop, so a
hundred agents cost no threads. Numeric types (Integer, Counter32/64, Gauge32,
TimeTicks, numeric strings) become floats; ``noSuchObject``/``noSuchInstance``
is no reading. An agent that does not answer fails the read (counted as a
read error or timeout), never the plugin.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any, Literal

from services.common.errors import ConfigError, KelvinError
from services.common.schema import Field, field_validator
from services.pusher.plugins.base import (
    Entity,
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
    SensorOptions,
    Values,
)

log = logging.getLogger(__name__)


class OidConfig(SensorOptions):
    name: str
    """Sensor name relative to the agent (``inlet_temp``, ``outlet/3/power``)."""
    oid: str
    """Numeric OID, e.g. ``1.3.6.1.2.1.1.3.0``."""
    unit: str | None = None

    @field_validator("oid")
    @classmethod
    def _numeric(cls, v: str) -> str:
        parts = v.strip().lstrip(".").split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            raise ValueError("expected a numeric OID such as 1.3.6.1.2.1.1.3.0")
        return ".".join(parts)


class AgentConfig(GroupOptions):
    name: str
    host: str
    port: int = Field(161, ge=1, le=65535)
    version: Literal["1", "2c", "3"] = "2c"
    community: str = "public"
    user: str | None = None
    auth_key: str | None = None
    priv_key: str | None = None
    auth_protocol: Literal["md5", "sha", "sha224", "sha256", "sha384", "sha512"] = "sha"
    priv_protocol: Literal["des", "3des", "aes", "aes192", "aes256"] = "aes"
    retries: int = Field(0, ge=0)
    sensors: list[OidConfig] = Field(min_length=1)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v


class SnmpConfig(PluginConfig):
    agents: list[AgentConfig] = Field(min_length=1)
    max_oids_per_get: int = Field(32, ge=1, le=512)


class Agent(Entity):
    """One SNMP agent: credentials and transport, on a shared engine."""

    def __init__(self, cfg: AgentConfig, engine: Any, timeout_s: float) -> None:
        super().__init__(cfg.name)
        self.cfg = cfg
        self.engine = engine
        self.timeout_s = timeout_s
        self.auth: Any = None
        self.target: Any = None

    async def open(self) -> None:
        from pysnmp.hlapi.v3arch import asyncio as h

        c = self.cfg
        if c.version == "3":
            if not c.user:
                raise ConfigError(f"snmp agent {c.name!r}: version 3 needs 'user'")
            auth = {
                "md5": h.usmHMACMD5AuthProtocol,
                "sha": h.usmHMACSHAAuthProtocol,
                "sha224": h.usmHMAC128SHA224AuthProtocol,
                "sha256": h.usmHMAC192SHA256AuthProtocol,
                "sha384": h.usmHMAC256SHA384AuthProtocol,
                "sha512": h.usmHMAC384SHA512AuthProtocol,
            }[c.auth_protocol]
            priv = {
                "des": h.usmDESPrivProtocol,
                "3des": h.usm3DESEDEPrivProtocol,
                "aes": h.usmAesCfb128Protocol,
                "aes192": h.usmAesCfb192Protocol,
                "aes256": h.usmAesCfb256Protocol,
            }[c.priv_protocol]
            self.auth = h.UsmUserData(
                c.user,
                authKey=c.auth_key,
                privKey=c.priv_key,
                authProtocol=auth if c.auth_key else h.usmNoAuthProtocol,
                privProtocol=priv if c.priv_key else h.usmNoPrivProtocol,
            )
        else:
            self.auth = h.CommunityData(c.community, mpModel=0 if c.version == "1" else 1)
        self.target = await h.UdpTransportTarget.create(
            (c.host, c.port), timeout=self.timeout_s, retries=c.retries
        )


def to_float(value: Any) -> float:
    """An SNMP value as a float; NaN for missing objects and non-numbers."""
    cls = type(value).__name__
    if cls in ("NoSuchObject", "NoSuchInstance", "EndOfMibView", "Null"):
        return float("nan")
    try:
        return float(int(value))
    except (TypeError, ValueError):
        pass
    try:
        return float(str(value).strip())
    except ValueError:
        return float("nan")


class AgentGroup(Group):
    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        agent: Agent,
        oids: list[str],
        per_get: int,
    ) -> None:
        super().__init__(name, sensors, options, agent)
        self.agent = agent
        self.oids = oids
        self.per_get = per_get

    async def read_async(self, timestamp_ns: int) -> Values:
        from pysnmp.hlapi.v3arch import asyncio as h

        a = self.agent
        out = array("d", [float("nan")]) * len(self.oids)
        for start in range(0, len(self.oids), self.per_get):
            chunk = self.oids[start : start + self.per_get]
            binds = [h.ObjectType(h.ObjectIdentity(o)) for o in chunk]
            err, status, index, var_binds = await h.get_cmd(
                a.engine, a.auth, a.target, h.ContextData(), *binds
            )
            if err:
                raise KelvinError(f"SNMP agent {a.name} ({a.cfg.host}:{a.cfg.port}): {err}")
            if status:
                bad = chunk[int(index) - 1] if index else "?"
                raise KelvinError(f"SNMP agent {a.name}: {status.prettyPrint()} at OID {bad}")
            for i, (_, value) in enumerate(var_binds):
                out[start + i] = to_float(value)
        return out


class SnmpPlugin(Plugin):
    """OIDs of SNMP agents."""

    Config = SnmpConfig
    description = "SNMP v1/v2c/v3 GET of numeric OIDs (pysnmp, asyncio)"

    async def build(self) -> list[Group]:
        try:
            from pysnmp.hlapi.v3arch import asyncio as h
        except ImportError as exc:
            raise ConfigError(
                "the snmp plugin needs pysnmp: pip install 'kelvin[plugins]' or 'pysnmp>=7.1'"
            ) from exc
        cfg = self.config
        assert isinstance(cfg, SnmpConfig)
        self.engine = h.SnmpEngine()
        groups: list[Group] = []
        for a in cfg.agents:
            opts = self.options_of(a)
            # pysnmp's own timeout stays inside the read timeout, so it reports first.
            agent = Agent(a, self.engine, 0.8 * (opts.timeout_ms or opts.interval_ms) / 1000)
            await agent.open()
            self.entities.append(agent)
            sensors = [
                self.configured_sensor(f"{a.name}/{o.name}", opts, o, o.unit) for o in a.sensors
            ]
            groups.append(
                AgentGroup(
                    a.name, sensors, opts, agent, [o.oid for o in a.sensors], cfg.max_oids_per_get
                )
            )
        return groups

    async def close(self) -> None:
        await super().close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close_dispatcher()
            self.engine = None
