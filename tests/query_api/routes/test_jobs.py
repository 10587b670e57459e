"""``/api/v1/jobs/{id}``: one job's accounting, found by its key in the job data."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.sensors import JobRecord
from tests.query_api.conftest import T0, Api, S

NODE = "/hall/row0/rack0/node0"


async def test_one_job_is_found_by_its_key_not_by_reading_every_job(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.write(f"{NODE}/power", np.arange(-40, 101, 10), np.full(15, 2000.0), unit="W")
    await api.storage.put_job(JobRecord(job_id="9", start_ns=T0, end_ns=T0 + 50 * S, nodes=(NODE,)))
    await api.storage.put_job(JobRecord(job_id="9", domain_id="other", start_ns=T0 + 5 * S))

    async def every_job(*_: object) -> list[JobRecord]:
        raise AssertionError("GET /api/v1/jobs/{id} read every job record")

    monkeypatch.setattr(api.storage, "jobs", every_job)
    r = await api.client.get("/api/v1/jobs/9")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["job_id"] == "9" and doc["nodes"] == [NODE]
    assert doc["it_energy_j"] == pytest.approx(2000.0 * 50)
    other = (await api.client.get("/api/v1/jobs/9", params={"domain": "other"})).json()
    assert other["start_ns"] == T0 + 5 * S and other["end_ns"] is None
    missing = await api.client.get("/api/v1/jobs/10")
    assert missing.status_code == 404 and "no job '10'" in missing.json()["detail"]
