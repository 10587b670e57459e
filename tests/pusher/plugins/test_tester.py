"""tester: names, groups and the three modes."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.errors import ConfigError
from tests.pusher.conftest import build_plugin


async def test_names_are_zero_padded_and_split_into_groups() -> None:
    _, groups = await build_plugin("tester", {"numSensors": 12345, "groups": 4})  # DCDB's key
    assert [len(g.sensors) for g in groups] == [3087, 3087, 3087, 3084]
    assert groups[0].sensors[0].name == "/t/tester/s00000"
    assert groups[-1].sensors[-1].name == "/t/tester/s12344"


async def test_counter_sine_and_random_modes() -> None:
    _, (counter,) = await build_plugin("tester", {"sensors": 3, "start_value": 10})
    assert counter.read(0).tolist() == [11.0, 11.0, 11.0]
    assert counter.read(0).tolist() == [12.0, 12.0, 12.0]
    _, (sine,) = await build_plugin("tester", {"sensors": 50, "mode": "sine", "period_s": 10})
    a, b = sine.read(0), sine.read(2_500_000_000)
    assert np.all(np.abs(a) <= 1) and not np.allclose(a, b)
    _, (rand,) = await build_plugin("tester", {"sensors": 1000, "mode": "random"})
    r = rand.read(0)
    assert r.min() >= 0 and r.max() < 1 and r.std() > 0.2


async def test_bad_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.tester\.mode: expected one of"):
        await build_plugin("tester", {"mode": "square"})
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.tester\.colour: unknown key"):
        await build_plugin("tester", {"colour": "red"})
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.tester\.prefix: .*wildcard"):
        await build_plugin("tester", {"prefix": "/a/+/b"})
