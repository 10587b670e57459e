"""Logs and error answers never carry the credentials of a URL."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi import FastAPI

from services.common import logs
from services.common.errors import RetryableStorageError
from services.common.http import install_error_handlers
from services.common.logs import mask_url

URL = "http://kelvin:s3cr3t-pw@influx.example.org:8086"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (
            f"influxdb {URL} is not open",
            "influxdb http://kelvin:***@influx.example.org:8086 is not open",
        ),
        ("https://t0ken@clickhouse:8443/?q=1", "https://***@clickhouse:8443/?q=1"),
        ("mqtt://u:p@b:1883, http://a:b@c", "mqtt://u:***@b:1883, http://a:***@c"),
        ("http://host:8086/path?user=a@b", "http://host:8086/path?user=a@b"),
        ("alice@example.org wrote", "alice@example.org wrote"),
    ],
)
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked


@pytest.mark.parametrize("json_format", [False, True])
def test_log_lines_and_tracebacks_are_masked(
    json_format: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    logs.setup("INFO", json_format)
    try:
        log = logging.getLogger("kelvin.test")
        log.warning("storage %s unreachable", URL)
        try:
            raise RetryableStorageError(f"influxdb {URL}: write failed")
        except RetryableStorageError:
            log.exception("writer stopped")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "s3cr3t-pw" not in err and "kelvin:***@influx.example.org" in err
    if json_format:
        assert all(json.loads(line) for line in err.splitlines())


async def test_storage_errors_answered_to_clients_are_masked() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/down")
    async def down() -> None:
        raise RetryableStorageError(f"influxdb {URL} is not open")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/down")
    assert r.status_code == 503 and "s3cr3t-pw" not in r.text and "kelvin:***@" in r.text
