"""The allocator service end to end over HTTP (and MQTT to a real mosquitto)."""

from __future__ import annotations

import asyncio
import getpass
import json
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import numpy as np
import pytest
import scipy.sparse as sp

from services.allocator import model_wire as wire
from services.allocator.app import AllocatorService, create_service
from services.allocator.engine import Allocator
from services.allocator.jobs import Job
from services.allocator.model import HallModel
from services.allocator.state import HallState
from services.common import codec
from services.common.auth import Role
from services.common.errors import ConfigError
from services.common.halls.hallfile import save_hall
from services.common.settings import Config
from services.common.thermal import reference_hall
from tests.support.auth import headers, with_auth
from tests.support.servers import Mosquitto, free_port, require_binary, wait_port


def _config(state_dir: Path, broker_port: int, profile: str = "run", **allocator: Any) -> Config:
    cfg = Config(overrides=with_auth({}))
    cfg.profile = profile
    values = {
        "host": "127.0.0.1",
        "port": 0,
        "state_dir": str(state_dir),
        "brokers": [f"127.0.0.1:{broker_port}"],
        "policy": "first-fit",
        **allocator,
    }
    for key, value in values.items():
        cfg.set("allocator", key, value)
    return cfg


class Running:
    """A started service plus an HTTP client and a way to await job events."""

    def __init__(self, svc: AllocatorService) -> None:
        self.svc = svc
        self.http = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{svc.port}", timeout=10, headers=headers(Role.ADMIN)
        )

    async def event(self, match: Callable[[str, Job], bool], within_s: float = 10.0) -> Job:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Job] = loop.create_future()

        def listener(event: str, job: Job) -> None:
            if match(event, job) and not fut.done():
                fut.set_result(job)

        self.svc.core.book.listeners.append(listener)
        try:
            return await asyncio.wait_for(fut, within_s)
        finally:
            self.svc.core.book.listeners.remove(listener)

    async def metric(self, name: str) -> float:
        text = (await self.http.get("/metrics")).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"metric {name} not found")

    async def stop(self) -> None:
        await self.http.aclose()
        await self.svc.stop()


async def _start(cfg: Config) -> Running:
    svc = create_service(cfg)
    await svc.start()
    return Running(svc)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Running]:
    running = await _start(_config(tmp_path / "state", free_port()))
    yield running
    await running.stop()


async def test_place_queue_release_and_the_hall_view(service: Running) -> None:
    http = service.http
    r1 = await http.post("/api/v1/jobs", json={"size": 30})
    assert r1.status_code == 201
    first = r1.json()
    assert first["state"] == "running" and first["nodes"] == list(range(30))
    assert first["decision"]["placed"] and "runner_ups" in first["decision"]
    r2 = await http.post("/api/v1/jobs", json={"size": 20, "comm_share": 0.2})
    assert r2.status_code == 202 and r2.json()["waiting_reason"] == "capacity"
    listed = (await http.get("/api/v1/jobs")).json()["jobs"]
    assert [j["state"] for j in listed] == ["running", "queued"]

    hall = (await http.get("/api/v1/hall")).json()
    assert {"name", "rows", "racks", "slots", "nodes", "totals"} <= set(hall)
    assert hall["redline_c"] == 30.0  # the console's colour scale ends there
    assert len(hall["nodes"]) == 40
    node = hall["nodes"][33]
    assert (node["index"], node["row"], node["rack"], node["slot"]) == (33, 1, 3, 1)
    assert isinstance(node["busy"], bool) and isinstance(node["power_w"], float)
    assert isinstance(node["predicted_tin_c"], float)
    assert sum(n["busy"] for n in hall["nodes"]) == 30
    assert all(n["job"] == first["id"] for n in hall["nodes"] if n["busy"])
    totals = hall["totals"]
    for key in ("max_tin_c", "supply_c", "base_supply_c", "cop", "computing_kw", "cooling_kw"):
        assert isinstance(totals[key], float)
    assert totals["max_tin_c"] == pytest.approx(max(n["predicted_tin_c"] for n in hall["nodes"]))
    # base_supply_c is the supply the nodes' inlets are computed at: Tin = supply + D·P ...
    ref = reference_hall()
    powers = np.array([n["power_w"] for n in hall["nodes"]])
    tin = np.array([n["predicted_tin_c"] for n in hall["nodes"]])
    np.testing.assert_allclose(tin, totals["base_supply_c"] + ref.d_matrix @ powers, rtol=1e-9)
    # ... supply_c the raised supply the slack to the redline allows, CoP and cooling at it.
    raised = totals["base_supply_c"] + ref.redline_c - totals["max_tin_c"]
    assert totals["supply_c"] == pytest.approx(raised)
    assert totals["cop"] == pytest.approx(ref.cop(raised))
    assert totals["cooling_kw"] == pytest.approx(totals["computing_kw"] / totals["cop"])
    assert await service.metric("kelvin_allocator_max_inlet_celsius") == pytest.approx(
        totals["max_tin_c"]
    )

    deleted = await http.delete(f"/api/v1/jobs/{first['id']}")
    assert deleted.status_code == 200 and deleted.json()["state"] == "cancelled"
    second = (await http.get(f"/api/v1/jobs/{r2.json()['id']}")).json()
    assert second["state"] == "running" and len(second["nodes"]) == 20
    assert (await http.delete(f"/api/v1/jobs/{first['id']}")).status_code == 409
    assert (await http.delete("/api/v1/jobs/nope")).status_code == 404


async def test_a_job_with_a_runtime_releases_itself(service: Running) -> None:
    finished = asyncio.ensure_future(service.event(lambda e, j: e == "finished"))
    r = await service.http.post("/api/v1/jobs", json={"size": 5, "runtime_s": 0.2})
    assert r.status_code == 201
    job = await finished
    assert job.id == r.json()["id"]
    hall = (await service.http.get("/api/v1/hall")).json()
    assert not any(n["busy"] for n in hall["nodes"])
    done = (await service.http.get("/api/v1/jobs", params={"state": "finished"})).json()["jobs"]
    assert [j["id"] for j in done] == [job.id]


async def test_state_and_model_survive_a_restart(tmp_path: Path) -> None:
    cfg = _config(tmp_path / "state", free_port())
    first = await _start(cfg)
    a = (await first.http.post("/api/v1/jobs", json={"size": 25})).json()
    b = (await first.http.post("/api/v1/jobs", json={"size": 25})).json()
    await first.http.put("/api/v1/policy", json={"policy": "mc1x1"})
    d2 = (reference_hall().d_matrix * 2).tolist()
    assert (await first.http.put("/api/v1/hall/model", json={"d_matrix": d2})).status_code == 200
    before = (await first.http.get("/api/v1/hall")).json()
    await first.stop()

    second = await _start(cfg)
    try:
        jobs = {j["id"]: j for j in (await second.http.get("/api/v1/jobs")).json()["jobs"]}
        assert jobs[a["id"]]["state"] == "running" and jobs[a["id"]]["nodes"] == a["nodes"]
        assert jobs[b["id"]]["state"] == "queued"
        after = (await second.http.get("/api/v1/hall")).json()
        assert after["policy"] == "mc1x1"
        assert after["totals"]["max_tin_c"] == pytest.approx(before["totals"]["max_tin_c"])
        c = (await second.http.post("/api/v1/jobs", json={"size": 1})).json()
        assert int(c["id"][1:]) == 3  # ids continue
    finally:
        await second.stop()


async def test_reliability_constraint_stalls_then_starts(tmp_path: Path) -> None:
    # thresholds from the model itself: A alone is fine, A and B together are not
    state = HallState(HallModel(reference_hall()))
    alone = Allocator("first-fit").decide(state, 8).choice
    assert alone is not None
    state.place("a", alone.nodes, alone.node_power_w)
    both = Allocator("first-fit").decide(state, 8).choice
    assert both is not None and both.min_mttf_years < alone.min_mttf_years
    limit = (alone.min_mttf_years + both.min_mttf_years) / 2

    running = await _start(_config(tmp_path / "s", free_port(), min_mttf_years=limit))
    try:
        http = running.http
        assert (await http.post("/api/v1/jobs", json={"size": 16})).status_code == 422  # never fits
        a = await http.post("/api/v1/jobs", json={"size": 8})
        assert a.status_code == 201
        b = await http.post("/api/v1/jobs", json={"size": 8})
        assert b.status_code == 202 and b.json()["waiting_reason"] == "mttf"
        assert await running.metric("kelvin_allocator_mttf_stalls_total") >= 1
        await http.delete(f"/api/v1/jobs/{a.json()['id']}")
        assert (await http.get(f"/api/v1/jobs/{b.json()['id']}")).json()["state"] == "running"
    finally:
        await running.stop()


async def test_reliability_constants_come_from_the_settings(tmp_path: Path) -> None:
    # The default model, then one calibrated to twice the lifetime at 60 °C (and a
    # hotter idle processor, which a full hall never has): MTTF scales with the
    # calibration, so the full hall's minimum doubles.
    plain = await _start(_config(tmp_path / "a", free_port()))
    tuned = await _start(
        _config(
            tmp_path / "b",
            free_port(),
            reliability={"calib_mttf_years": 10.0, "idle_proc_power_w": 120.0},
        )
    )
    try:
        for running in (plain, tuned):
            assert (await running.http.post("/api/v1/jobs", json={"size": 40})).status_code == 201
        base = (await plain.http.get("/api/v1/hall")).json()["totals"]["min_mttf_years"]
        got = (await tuned.http.get("/api/v1/hall")).json()["totals"]["min_mttf_years"]
        # all nodes busy: every processor is active, so only the calibration differs
        assert got == pytest.approx(2 * base, rel=1e-9)
    finally:
        await plain.stop()
        await tuned.stop()
    cfg = _config(tmp_path / "c", free_port(), reliability={"calib_mttf_years": 0})
    with pytest.raises(ConfigError, match=r"allocator.reliability.calib_mttf_years"):
        create_service(cfg)


async def test_decisions_are_published_as_sensors(
    tmp_path: Path, mosquitto_broker: Mosquitto
) -> None:
    running = await _start(_config(tmp_path / "s", mosquitto_broker.port, publish_interval_s=3600))
    try:
        async with aiomqtt.Client("127.0.0.1", mosquitto_broker.port) as sub:
            await sub.subscribe("/KELVIN_BATCH/#", qos=1)
            await sub.subscribe("/DCDB_JOBDATA/", qos=1)
            r = await running.http.post("/api/v1/jobs", json={"size": 6})
            assert r.status_code == 201
            totals = (await running.http.get("/api/v1/hall")).json()["totals"]
            got_batch, got_job = None, None
            async with asyncio.timeout(10):
                async for msg in sub.messages:
                    topic = msg.topic.value
                    payload = bytes(msg.payload)  # type: ignore[arg-type]
                    if topic.startswith(codec.BATCH_PREFIX):
                        _, prefix = codec.classify(topic)
                        batch = codec.decode_batch(prefix, payload)
                        values = {s.sensor: float(s.values[-1]) for s in batch}
                        if values.get("/kelvin/allocator/utilization") == pytest.approx(0.15):
                            got_batch = values
                    elif topic.startswith("/DCDB_JOBDATA"):
                        got_job = json.loads(payload)
                    if got_batch and got_job:
                        break
        assert got_batch["/kelvin/allocator/max_tin_c"] == pytest.approx(totals["max_tin_c"])
        assert got_batch["/kelvin/allocator/cooling_kw"] == pytest.approx(totals["cooling_kw"])
        raised = got_batch["/kelvin/allocator/supply_c"]
        assert raised == pytest.approx(totals["supply_c"])
        # Temperatures carry the unit the pushers use (pint reads it as degree Celsius).
        units = {m.name: m.unit for m in running.svc.core.publisher.metadata}
        assert units["/kelvin/allocator/max_tin_c"] == "°C"
        assert units["/kelvin/allocator/supply_c"] == "°C"
        assert units["/hall/row0/rack0/node0/predicted_inlet_temp"] == "°C"
        assert got_job["jobid"] == r.json()["id"] and got_job["endtime"] == 0
        assert got_job["nodes"][0] == "/hall/row0/rack0/node0"
    finally:
        await running.stop()


@pytest.fixture
def broker_with_login(tmp_path: Path) -> Iterator[int]:
    """A real mosquitto that refuses anonymous clients; user ``alloc``, password ``pw``."""
    binary = require_binary("mosquitto", "mosquitto")
    passwd = require_binary("mosquitto_passwd", "mosquitto")
    port = free_port()
    users = tmp_path / "users"
    subprocess.run([passwd, "-b", "-c", str(users), "alloc", "pw"], check=True)
    conf = tmp_path / "mosquitto-login.conf"
    # Started as root, mosquitto would drop to user "mosquitto", who cannot read tmp_path.
    conf.write_text(
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous false\n"
        f"password_file {users}\npersistence false\n"
    )
    with open(tmp_path / "mosquitto-login.log", "wb") as log:
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_port(port, proc=proc)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)


async def test_decisions_reach_a_broker_that_requires_a_login(
    tmp_path: Path, broker_with_login: int
) -> None:
    running = await _start(
        _config(
            tmp_path / "s",
            broker_with_login,
            publish_interval_s=3600,
            mqtt_username="alloc",
            mqtt_password="pw",
        )
    )
    try:
        async with aiomqtt.Client(
            "127.0.0.1", broker_with_login, username="alloc", password="pw"
        ) as sub:
            await sub.subscribe("/DCDB_JOBDATA/", qos=1)
            r = await running.http.post("/api/v1/jobs", json={"size": 2})
            assert r.status_code == 201
            async with asyncio.timeout(10):
                msg = await anext(aiter(sub.messages))
        assert json.loads(bytes(msg.payload))["jobid"] == r.json()["id"]  # type: ignore[arg-type]
        assert await running.metric("kelvin_allocator_mqtt_connected") == 1
    finally:
        await running.stop()


async def test_the_hall_names_each_nodes_measured_sensors(tmp_path: Path) -> None:
    """The console reads measured inlets under these names: the sensor map's, else the default."""
    site = {"inlet_temp": "/dc/r{row}/k{rack}/n{slot}/tin"}
    running = await _start(_config(tmp_path / "s", free_port(), sensor_map=site))
    try:
        node = (await running.http.get("/api/v1/hall")).json()["nodes"][34]
        assert node["inlet_sensor"] == "/dc/r1/k3/n2/tin"
        assert node["power_sensor"] == "/hall/row1/rack3/node2/power"
    finally:
        await running.stop()
    with pytest.raises(ConfigError, match="sensor map: power: expected a template string"):
        create_service(_config(tmp_path / "t", free_port(), sensor_map={"power": 7}))


async def test_absent_nodes_get_no_predicted_inlet_sensor(tmp_path: Path) -> None:
    present = np.ones(40, bool)
    present[39] = False
    hall_file = save_hall(reference_hall().replace(present=present), tmp_path / "hall.yaml")
    running = await _start(_config(tmp_path / "s", free_port(), hall_file=str(hall_file)))
    try:
        publisher = running.svc.core.publisher
        meta = {m.name for m in publisher.metadata if m.name.startswith("/hall/")}
        published: set[str] = set()
        for topic, payload in publisher.buffer:  # no broker: the snapshot waits here
            if topic.startswith(codec.BATCH_PREFIX) and codec.classify(topic)[1] == "/hall":
                published |= {s.sensor for s in codec.decode_batch("/hall", payload)}
        absent = "/hall/row1/rack4/node3/predicted_inlet_temp"
        assert len(meta) == 39 and absent not in meta
        assert published == meta
    finally:
        await running.stop()


async def test_broker_down_never_blocks_placement(tmp_path: Path) -> None:
    running = await _start(_config(tmp_path / "s", free_port(), publish_buffer=3))
    try:
        for _ in range(4):
            assert (await running.http.post("/api/v1/jobs", json={"size": 2})).status_code == 201
        assert await running.metric("kelvin_allocator_mqtt_connected") == 0
        assert await running.metric("kelvin_allocator_publish_dropped_total") > 0
        assert await running.metric("kelvin_allocator_publish_buffer_messages") == 3
    finally:
        await running.stop()


async def test_policy_and_model_endpoints_validate(service: Running) -> None:
    http = service.http
    got = (await http.get("/api/v1/policy")).json()
    assert got["policy"] == "first-fit" and set(got["available"]) >= {"mpit", "joint"}
    bad = await http.put("/api/v1/policy", json={"policy": "coolest"})
    assert bad.status_code == 422 and "mpit" in bad.json()["detail"]
    assert (await http.put("/api/v1/policy", json={"policy": "mpit"})).json()["policy"] == "mpit"

    base = (await http.get("/api/v1/hall")).json()["totals"]["max_tin_c"]
    d2 = (reference_hall().d_matrix * 2).tolist()
    assert (
        await http.put("/api/v1/hall/model", json={"d_matrix": d2, "source": "t"})
    ).status_code == 200
    doubled = (await http.get("/api/v1/hall")).json()
    assert doubled["totals"]["max_tin_c"] - 15 == pytest.approx(2 * (base - 15))
    assert doubled["model"]["source"] == "t"
    small = await http.put("/api/v1/hall/model", json={"d_matrix": [[0.0]]})
    assert small.status_code == 422 and "40x40" in small.json()["detail"]
    negative = np.array(d2)
    negative[0, 0] = -1
    neg = await http.put("/api/v1/hall/model", json={"d_matrix": negative.tolist()})
    assert neg.status_code == 422 and "non-negative" in neg.json()["detail"]
    await http.delete("/api/v1/hall/model")
    assert (await http.get("/api/v1/hall")).json()["totals"]["max_tin_c"] == pytest.approx(base)
    assert await service.metric('kelvin_allocator_rejected_requests_total{reason="model"}') == 2


async def test_a_sparse_model_goes_live_and_comes_back_in_every_form(
    service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    http = service.http
    d = sp.csr_matrix(reference_hall().d_matrix * 2)
    base = (await http.get("/api/v1/hall")).json()["totals"]["max_tin_c"]
    for form in ("coo", "npz"):
        put = await http.put("/api/v1/hall/model", json={**wire.encode(d, form), "source": form})
        assert put.status_code == 200, put.text
        live = service.svc.core.book.model.hall.d_matrix
        assert sp.issparse(live) and (live != d).nnz == 0
        doubled = (await http.get("/api/v1/hall")).json()
        assert doubled["totals"]["max_tin_c"] - 15 == pytest.approx(2 * (base - 15))
    got = (await http.get("/api/v1/hall/model")).json()  # sparse: triplets by default
    assert got["source"] == "npz" and set(got) >= {"d_coo", "updated_ns"}
    for form in ("coo", "npz", "dense"):
        doc = (await http.get("/api/v1/hall/model", params={"form": form})).json()
        back = wire.decode(wire.ModelIn(**{k: v for k, v in doc.items() if k[:2] == "d_"}), 40)
        assert np.array_equal(back.toarray() if sp.issparse(back) else back, d.toarray())
    bad = d.copy()
    bad.data[0] = np.nan
    nan = await http.put("/api/v1/hall/model", json=wire.encode(bad, "npz"))
    assert nan.status_code == 422 and "non-finite" in nan.json()["detail"]
    bad.data[0] = -1.0
    negative = await http.put("/api/v1/hall/model", json=wire.encode(bad, "coo"))
    assert negative.status_code == 422 and "non-negative" in negative.json()["detail"]
    both = await http.put("/api/v1/hall/model", json={"d_matrix": [[0.0]], "d_npz": ""})
    assert both.status_code == 422 and "exactly one form" in both.json()["detail"]
    monkeypatch.setattr(wire, "MAX_BODY_BYTES", 1000)
    big = await http.put("/api/v1/hall/model", json=wire.encode(d, "coo"))
    assert big.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the stream is cut off
        for _ in range(10):
            yield b" " * 500

    streamed = await http.put("/api/v1/hall/model", content=chunks())
    assert streamed.status_code == 413
    assert (live != d).nnz == 0 and service.svc.core.book.model.hall.d_matrix is live
    assert await service.metric('kelvin_allocator_rejected_requests_total{reason="model"}') == 4
    assert (
        await service.metric('kelvin_allocator_rejected_requests_total{reason="validation"}') == 1
    )


async def test_bad_requests_are_precise_and_counted(service: Running) -> None:
    r = await service.http.post("/api/v1/jobs", json={"size": 0, "comm_share": 2})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "body.size" in detail and "body.comm_share" in detail
    r = await service.http.post("/api/v1/jobs", json={"size": 2, "colour": "red"})
    assert r.status_code == 422 and "colour" in r.json()["detail"]
    # A runtime whose end is no finite time (JSON's Infinity, 1e300 s) is refused up front.
    for runtime in (b"Infinity", b"1e300"):
        r = await service.http.post(
            "/api/v1/jobs",
            content=b'{"size": 1, "runtime_s": ' + runtime + b"}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422 and "body.runtime_s" in r.json()["detail"]
    assert (
        await service.metric('kelvin_allocator_rejected_requests_total{reason="validation"}') == 4
    )
    dry = await service.http.post("/api/v1/jobs", params={"dry_run": "true"}, json={"size": 3})
    assert dry.status_code == 200 and dry.json()["decision"]["placed"]
    assert (await service.http.get("/api/v1/jobs")).json()["jobs"] == []


async def test_jobs_and_configuration_need_the_admin_token(tmp_path: Path) -> None:
    running = await _start(_config(tmp_path / "s", free_port()))
    try:
        anonymous = {"Authorization": ""}
        job = {"size": 1}
        assert (
            await running.http.post("/api/v1/jobs", json=job, headers=anonymous)
        ).status_code == 401
        # a pusher's write token places no job: through the bridge it would be a Slurm placement
        low = await running.http.post("/api/v1/jobs", json=job, headers=headers(Role.WRITE))
        assert low.status_code == 403
        assert (await running.http.post("/api/v1/jobs", json=job)).status_code == 201
        assert (await running.http.get("/api/v1/hall", headers=anonymous)).status_code == 200
    finally:
        await running.stop()


async def test_a_corrupt_state_file_is_set_aside(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "state.json").write_text("{not json")
    running = await _start(_config(state, free_port()))
    try:
        assert (await running.http.get("/api/v1/jobs")).json()["jobs"] == []
        assert list(state.glob("state.json.corrupt-*"))
    finally:
        await running.stop()


async def test_demo_profile_runs_the_seeded_job_stream(tmp_path: Path) -> None:
    stream = {"mean_interval_s": 0.02, "runtime_s": [0.05, 0.1], "sizes": [2, 4]}
    running = await _start(_config(tmp_path / "s", free_port(), "demo", job_stream=stream))
    try:
        job = await running.event(lambda e, j: e == "finished" and j.name == "demo")
        assert 2 <= job.size <= 4 and job.ends_ns is not None
    finally:
        await running.stop()


async def test_following_a_workload_manager_over_http(tmp_path: Path) -> None:
    running = await _start(_config(tmp_path / "state", free_port(), cluster="external"))
    http = running.http
    try:
        nodes = [{"index": i, "state": "idle"} for i in range(40)]
        nodes[5]["state"] = "drained"
        report = {
            "nodes": nodes,
            "jobs": [
                {"id": "71", "state": "running", "nodes": [0, 1], "user": "bob"},
                {"id": "72", "state": "pending", "managed": True, "size": 3},
            ],
        }
        r = await http.post("/api/v1/cluster/sync", json=report)
        assert r.status_code == 200, r.text
        (placed,) = r.json()["placements"]
        assert placed["id"] == "72" and placed["policy"] == "first-fit"
        assert placed["nodes"] == [2, 3, 4]  # 0-1 run Slurm's job, 5 is drained
        again = (await http.post("/api/v1/cluster/sync", json=report)).json()
        assert again["placements"][0]["nodes"] == [2, 3, 4]
        status = (await http.get("/api/v1/cluster")).json()
        assert status["cluster"] == "external" and status["unavailable_nodes"] == [5]
        assert [j["id"] for j in status["placed"]] == ["72"]
        hall = (await http.get("/api/v1/hall")).json()
        assert hall["nodes"][0]["job"] == "71" and hall["nodes"][0]["state"] == "running"
        assert hall["nodes"][2]["state"] == "placed" and not hall["nodes"][5]["available"]
        # its own jobs: refused, the manager has them
        own = await http.post("/api/v1/jobs", json={"size": 2})
        assert own.status_code == 409 and "sbatch" in own.text
        bad = await http.post(
            "/api/v1/cluster/sync", json={"nodes": [{"index": 40, "state": "idle"}]}
        )
        assert bad.status_code == 422 and "outside the hall" in bad.text
        assert await running.metric("kelvin_allocator_cluster_syncs_total") == 2
    finally:
        await running.stop()


async def test_an_allocator_running_its_own_jobs_refuses_a_report(service: Running) -> None:
    r = await service.http.post("/api/v1/cluster/sync", json={"nodes": []})
    assert r.status_code == 409 and "allocator.cluster: external" in r.text
