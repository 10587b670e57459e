"""REST control: start, stop, load, unload, reload a plugin; reload the file; bearer auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from services.pusher.app import PusherService
from tests.pusher.conftest import Collector, make_config, running
from tests.support.servers import Mosquitto

TOKEN = "s3cret-token"


def client(svc: PusherService, token: str | None = TOKEN) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}", headers=headers)


def write(path: Path, pusher: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["pusher"].update(pusher)
    path.write_text(yaml.safe_dump(doc))


async def test_control_calls_need_the_token_and_reads_do_not(
    tmp_path: Path, mosquitto_broker: Mosquitto
) -> None:
    cfg = make_config(
        tmp_path,
        {"prefix": "/a", "token": TOKEN, "plugins": {"tester": {"sensors": 2, "interval": 100}}},
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg) as svc, client(svc, None) as anon, client(svc, "wrong") as bad:
        assert (await anon.get("/api/v1/plugins")).status_code == 200
        r = await anon.post("/api/v1/plugins/tester/stop")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert (await bad.post("/api/v1/config/reload")).status_code == 401
        assert svc.manager.get("tester").state == "running"
        svc.settings.auth_reads = True
        assert (await anon.get("/api/v1/sensors")).status_code == 401
        async with client(svc) as ok:
            assert (await ok.get("/api/v1/sensors")).status_code == 200


async def test_stop_start_unload_load_reload(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    cfg = make_config(
        tmp_path,
        {"prefix": "/c", "token": TOKEN, "plugins": {"tester": {"sensors": 2, "interval": 100}}},
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg) as svc, client(svc) as http:
        sampling = list(svc.manager.get("tester").tasks)
        assert sampling and not any(t.done() for t in sampling)
        r = await http.post("/api/v1/plugins/tester/stop")
        assert r.json()["state"] == "stopped"
        assert all(t.done() for t in sampling) and not svc.manager.get("tester").tasks
        r = await http.post("/api/v1/plugins/tester/start")
        assert r.json()["state"] == "running"
        await collector.wait_for(lambda: "/c/tester/s0001" in collector.readings)

        # Load a second instance from the request body; its section is validated.
        bad = await http.post("/api/v1/plugins/more/load", json={"plugin": "tester", "sensors": -1})
        assert bad.status_code == 400 and "pusher.plugins.more.sensors" in bad.json()["detail"]
        r = await http.post(
            "/api/v1/plugins/more/load", json={"plugin": "tester", "sensors": 3, "interval": 100}
        )
        assert r.status_code == 200 and r.json()["sensors"] == 3
        await collector.wait_for(lambda: "/c/more/s0002" in collector.readings)
        clash = await http.post(
            "/api/v1/plugins/again/load",
            json={"plugin": "tester", "sensors": 1, "prefix": "/c/more"},
        )
        assert clash.status_code == 400 and "already published by plugin 'more'" in clash.text

        # Reload with a new section: more sensors, same name.
        r = await http.post("/api/v1/plugins/more/reload", json={"plugin": "tester", "sensors": 5})
        assert r.json()["sensors"] == 5
        assert "/c/more/s0004" in (await http.get("/api/v1/sensors?plugin=more")).json()

        r = await http.post("/api/v1/plugins/more/unload")
        assert r.status_code == 200
        assert (await http.get("/api/v1/plugins/more")).status_code == 404
        assert "/c/more/s0000" not in svc.cache
        listed = [p["name"] for p in (await http.get("/api/v1/plugins")).json()]
        assert listed == ["tester"]


async def test_reload_the_configuration_file_without_a_restart(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    cfg = make_config(
        tmp_path,
        {"prefix": "/r", "token": TOKEN, "plugins": {"tester": {"sensors": 1, "interval": 100}}},
        broker_port=mosquitto_broker.port,
    )
    path = cfg.path
    assert path is not None
    async with running(cfg) as svc, client(svc) as http:
        await collector.wait_for(lambda: "/r/tester/s0000" in collector.readings)
        write(
            path,
            {
                "format": "dcdb",
                "plugins": {
                    "tester": {"sensors": 2, "interval": 100},
                    "procfs": {"root": str(Path(__file__).parent.parent / "fixtures/pusher/proc"),
                               "files": ["meminfo"], "interval": 100},
                },
            },
        )  # fmt: skip
        r = await http.post("/api/v1/config/reload")
        assert r.status_code == 200, r.text
        assert r.json() == {
            "loaded": ["procfs"], "unloaded": [], "reloaded": ["tester"], "restart_needed": ["format"],
        }  # fmt: skip
        await collector.wait_for(
            lambda: (
                "/r/tester/s0001" in collector.readings
                and "/r/procfs/meminfo/MemFree" in collector.readings
            )
        )
        # A broken file changes nothing and says where it is broken.
        write(path, {"plugins": {"tester": {"sensors": 2, "intervall": 100}}})
        r = await http.post("/api/v1/config/reload")
        assert r.status_code == 400
        assert f"{path}: pusher.plugins.tester.intervall: unknown key" in r.json()["detail"]
        assert sorted(svc.manager.instances) == ["procfs", "tester"]
        # Reload one plugin from the file as it is now (fixed again).
        write(path, {"plugins": {"tester": {"sensors": 4, "interval": 100}}})
        r = await http.post("/api/v1/plugins/tester/reload")
        assert r.status_code == 200 and r.json()["sensors"] == 4


async def test_status_and_openapi(tmp_path: Path, mosquitto_broker: Mosquitto) -> None:
    cfg = make_config(
        tmp_path,
        {"prefix": "/s", "plugins": {"tester": {"sensors": 1}}},
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg) as svc, client(svc, None) as http:
        status = (await http.get("/api/v1/status")).json()
        spec = (await http.get("/openapi.json")).json()
        metrics = (await http.get("/metrics")).text
    assert status["prefix"] == "/s" and status["publisher"]["format"] == "kvb1"
    assert "/api/v1/plugins/{name}/reload" in spec["paths"]
    assert "kelvin_pusher_readings_sent_total" in metrics
