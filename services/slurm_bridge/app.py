"""The Slurm bridge service: its one door (built from settings, owns its clients and the loop)."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import FastAPI

from services.common.auth import Credentials, Role
from services.common.auth_settings import ServiceAuth, service_auth
from services.common.errors import PortInUseError
from services.common.http import HttpService, health_router, install_auth, install_error_handlers
from services.common.net import Listener
from services.common.settings import Config
from services.common.tasks import stop_task
from services.slurm_bridge import api
from services.slurm_bridge.allocator import AllocatorClient
from services.slurm_bridge.client import SlurmClient
from services.slurm_bridge.commands import CommandClient
from services.slurm_bridge.metrics import BridgeMetrics
from services.slurm_bridge.reconcile import Reconciler
from services.slurm_bridge.rest import RestClient
from services.slurm_bridge.settings import Settings
from services.slurm_bridge.tokens import TokenSource


def slurm_client(s: Settings) -> SlurmClient:
    parts = frozenset(s.partitions)
    if s.slurm_api == "commands":
        return CommandClient(s.commands_dir, s.slurm_conf, s.slurm_timeout_s, parts)
    tokens = TokenSource(
        s.jwt_user, s.token, s.token_file, s.jwt_key_file, s.token_command, s.token_lifespan_s
    )
    return RestClient(s.slurmrestd_url, tokens, s.slurmrestd_version, s.slurm_timeout_s, parts)


def with_notify_token(auth: ServiceAuth, token: str | None) -> ServiceAuth:
    """The shared credentials plus ``notify_token`` as one more write credential: the one
    slurmctld's kelvin-notify.sh holds, good for nothing but notifying."""
    if not token:
        return auth
    creds = auth.credentials
    extra = Credentials({**creds.tokens, token: Role.WRITE}, creds.open_roles)
    return dataclasses.replace(auth, credentials=extra)


def create_app(rec: Reconciler, metrics: BridgeMetrics, auth: ServiceAuth | None = None) -> FastAPI:
    """The bridge's ASGI app; without ``auth`` every route that needs a role refuses."""
    app = FastAPI(
        title="Kelvin Slurm bridge",
        version="0.1.0",
        description="Places a Slurm cluster's jobs where Kelvin's allocator chooses.",
    )
    if auth is not None:
        install_auth(app, with_notify_token(auth, rec.settings.notify_token), metrics)
    install_error_handlers(app)

    def ready() -> tuple[bool, str]:
        return bool(rec.status.get("ready")), str(rec.status.get("reason"))

    app.include_router(health_router(metrics, ready))
    app.include_router(api.router(rec))
    return app


class _Wake(asyncio.DatagramProtocol):
    """The job_submit.lua's UDP wake-up: any ``kelvin-wake`` datagram starts a round now.

    Unauthenticated on purpose (the Lua holds no credential): it can only make the
    next round come sooner, which reads Slurm and changes nothing by itself.
    """

    def __init__(self, rec: Reconciler) -> None:
        self.rec = rec

    def datagram_received(self, data: bytes, addr: object) -> None:
        if data.startswith(b"kelvin-wake"):
            self.rec.metrics.events.labels("submit").inc()
            self.rec.wake.set()


class SlurmBridgeService(HttpService):
    """HTTP (health, metrics, notifications) + the UDP wake-up + the reconcile loop."""

    def __init__(self, settings: Settings, auth: ServiceAuth | None = None) -> None:
        self.settings = settings
        self.metrics = BridgeMetrics()
        self.slurm = slurm_client(settings)
        # the allocator's admin credential: the configured one, else the shared auth section's
        token = settings.allocator_token or (auth.token(Role.ADMIN) if auth else None)
        self.allocator = AllocatorClient(settings.allocator_url, token, settings.slurm_timeout_s)
        self.reconciler = Reconciler(settings, self.slurm, self.allocator, self.metrics)
        super().__init__(
            "slurm-bridge",
            create_app(self.reconciler, self.metrics, auth),
            settings.host,
            settings.port,
            "--slurm-bridge-port",
            metrics=self.metrics,
        )
        self._task: asyncio.Task[object] | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self.wake_port: int | None = None

    async def open(self) -> None:
        port = self.settings.wake_port
        if port is not None:
            loop = asyncio.get_running_loop()
            try:
                transport, _ = await loop.create_datagram_endpoint(
                    lambda: _Wake(self.reconciler), local_addr=(self.settings.host, port)
                )
            except OSError as exc:
                raise PortInUseError(
                    f"slurm bridge: cannot bind UDP {self.settings.host}:{port} (wake_port): "
                    f"{exc.strerror}"
                ) from exc
            self._udp = transport
            self.wake_port = int(transport.get_extra_info("sockname")[1])
        self._task = self.watch(asyncio.create_task(self.reconciler.run(), name="slurm-reconcile"))
        self.metrics.up.set(1)

    async def close(self) -> None:
        # A round stopped anywhere is finished by the next one (every step is idempotent).
        self.metrics.up.set(0)
        await stop_task(self._task, what="slurm reconcile loop")
        self._task = None
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        await self.slurm.close()
        await self.allocator.close()


def create_service(config: Config) -> SlurmBridgeService:
    settings = config.load(Settings)
    return SlurmBridgeService(settings, service_auth(config, settings.host, "slurm-bridge"))


def listeners(config: Config) -> list[Listener]:
    """The TCP ports ``kelvin run``/``up`` checks before anything starts (the UDP wake-up
    port is checked when it is bound)."""
    s = config.load(Settings)
    return [Listener(s.host, s.port, "slurm-bridge HTTP", "--slurm-bridge-port")]
