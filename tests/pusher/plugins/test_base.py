"""The plugin model's options: what a configuration may and may not combine."""

from __future__ import annotations

import pytest

from services.common.errors import ConfigError
from services.pusher.config import validate_section


def test_min_values_beyond_the_queue_size_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"k\.yaml: pusher\.plugins\.tester\.minValues: .*"
                       r"minValues 10 exceeds queueSize 5"):  # fmt: skip
        validate_section("tester", {"queueSize": 5, "minValues": 10}, "k.yaml")
    _, cfg = validate_section("tester", {"queueSize": 5, "minValues": 5}, "k.yaml")
    assert (cfg.queue_size, cfg.min_values) == (5, 5)


@pytest.mark.parametrize("scale", ["nan", "inf", "-Infinity", float("nan")])
def test_a_nan_or_infinite_scale_is_a_config_error(scale: object) -> None:
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.tester\.metadata\.scale: .*finite"):
        validate_section("tester", {"metadata": {"scale": scale}}, "k.yaml")
