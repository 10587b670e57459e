"""bacnet against a real BACnet/IP device: a bacpypes3 device application on a loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.common.errors import ConfigError
from tests.pusher.conftest import build_plugin
from tests.support.servers import free_port


@pytest.fixture
async def device() -> AsyncIterator[tuple[str, object]]:
    from bacpypes3.app import Application
    from bacpypes3.argparse import SimpleArgumentParser
    from bacpypes3.local.analog import AnalogValueObject
    from bacpypes3.local.binary import BinaryValueObject

    port = free_port()  # a free TCP port number is almost surely free for UDP too
    args = SimpleArgumentParser().parse_args(
        ["--address", f"127.0.0.1/32:{port}", "--instance", "4001", "--name", "crac1"]
    )
    app = Application.from_args(args)
    supply = AnalogValueObject(
        objectIdentifier=("analog-value", 1), objectName="supply", presentValue=18.5,
        statusFlags=[0, 0, 0, 0],
    )  # fmt: skip
    fan = BinaryValueObject(
        objectIdentifier=("binary-value", 2), objectName="fan", presentValue="active",
        statusFlags=[0, 0, 0, 0],
    )  # fmt: skip
    app.add_object(supply)
    app.add_object(fan)
    try:
        yield f"127.0.0.1:{port}", supply
    finally:
        app.close()


def _section(address: str) -> dict[str, object]:
    return {
        "address": f"127.0.0.1/32:{free_port()}",
        "timeout_ms": 2000,
        "devices": [
            {
                "name": "crac1",
                "address": address,
                "objects": [
                    {"name": "supply_temp", "object": "analog-value,1", "unit": "°C"},
                    {"name": "fan", "object": "binary-value, 2"},
                    {"name": "missing", "object": "analog-input,9"},
                ],
            }
        ],
    }


async def test_reads_present_values_of_a_real_device(device: tuple[str, object]) -> None:
    address, supply = device
    plugin, (group,) = await build_plugin("bacnet", _section(address))
    assert [s.name for s in group.sensors] == [
        "/t/bacnet/crac1/supply_temp", "/t/bacnet/crac1/fan", "/t/bacnet/crac1/missing",
    ]  # fmt: skip
    values = await group.read_async(0)
    assert values[0] == 18.5 and values[1] == 1.0 and np.isnan(values[2])
    supply.presentValue = 19.25  # type: ignore[attr-defined]
    assert (await group.read_async(0))[0] == 19.25
    assert group.options.interval_ms == 10_000 and group.sensors[0].unit == "°C"
    await plugin.close()


async def test_bad_object_identifier_is_a_config_error() -> None:
    bad = {
        "devices": [
            {"name": "d", "address": "10.0.0.1", "objects": [{"name": "x", "object": "ai1"}]}
        ]
    }
    with pytest.raises(ConfigError, match=r"devices\.0\.objects\.0\.object"):
        await build_plugin("bacnet", bad)
