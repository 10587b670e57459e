"""DCDB job records through the agent into storage, as dcdbslurmjob publishes them."""

from __future__ import annotations

import aiomqtt

from services.collect_agent.app import CollectAgent
from tests.common.test_codec import DCDBSLURMJOB_START, DCDBSLURMJOB_STOP
from tests.support.auth import MQTT_LOGIN


async def test_a_dcdbslurmjob_stop_record_ends_the_stored_job(agent: CollectAgent) -> None:
    assert agent.mqtt_port and agent.storage is not None
    async with aiomqtt.Client("127.0.0.1", agent.mqtt_port, **MQTT_LOGIN) as client:
        await client.publish("/DCDB_JOBDATA/", DCDBSLURMJOB_START, qos=1)
        await agent.spool.wait_empty()
        (running,) = await agent.storage.jobs()
        assert running.running and running.nodes == ("n01", "n02")
        await client.publish("/DCDB_JOBDATA/", DCDBSLURMJOB_STOP, qos=1)
    await agent.spool.wait_empty()
    assert agent.ingestor.rejected == {}
    (job,) = await agent.storage.jobs()
    assert (job.job_id, job.user_id, job.start_ns, job.end_ns, job.nodes) == (
        "4711",
        "alice",
        1_764_500_000_000_000_000,
        1_764_500_360_000_000_000,
        ("n01", "n02"),
    )
