"""The allocator service: its one door (built from settings, owns its clients)."""

from __future__ import annotations

from fastapi import FastAPI

from services.allocator.settings import Settings
from services.common.http import HttpService, health_router, install_error_handlers
from services.common.metrics import ServiceMetrics
from services.common.settings import Config


def create_app(settings: Settings, metrics: ServiceMetrics) -> FastAPI:
    app = FastAPI(title="Kelvin allocator", version="0.1.0")
    install_error_handlers(app)
    app.include_router(health_router(metrics))
    return app


def create_service(config: Config) -> HttpService:
    settings = config.load(Settings)
    metrics = ServiceMetrics("allocator")
    return HttpService(
        "allocator", create_app(settings, metrics), settings.host, settings.port, "--allocator-port"
    )
