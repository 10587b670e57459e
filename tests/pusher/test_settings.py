"""The pusher's settings: broker addresses, the light loader's precedence and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.auth_settings import AuthSettings
from services.common.config import Config
from services.common.errors import ConfigError
from services.pusher.settings import Settings, parse_broker


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("broker:1884", ("broker", 1884)),
        ("broker", ("broker", 1883)),
        ("10.0.0.7:8883", ("10.0.0.7", 8883)),
        ("::1", ("::1", 1883)),  # a bare IPv6 address: its colons are not a port
        ("fd00::17", ("fd00::17", 1883)),
        ("[fd00::17]:8883", ("fd00::17", 8883)),
        ("[::1]", ("::1", 1883)),
        (":1884", ("127.0.0.1", 1884)),
    ],
)
def test_broker_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_broker(text) == want


@pytest.mark.parametrize("text", ["broker:0", "broker:http", "[::1]x", "[::1", "no:t:v6"])
def test_bad_broker_addresses_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="broker"):
        parse_broker(text)


def test_yaml_env_and_flags_in_that_order_with_the_origin_in_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kelvin.yaml"
    path.write_text("pusher:\n  port: 9000\n  qos: 0\n  plugins: {procfs: {root: /x}}\n")
    assert Config(path).load(Settings).port == 9000
    monkeypatch.setenv("KELVIN_PUSHER_PORT", "9001")
    monkeypatch.setenv("KELVIN_PUSHER_BROKERS", '["[::1]:1884", "b:1"]')
    monkeypatch.setenv("KELVIN_PUSHER_PLUGINS__PROCFS__ROOT", "/host/proc")
    s = Config(path).load(Settings)
    assert (s.port, s.qos, s.broker_list()) == (9001, 0, [("::1", 1884), ("b", 1)])
    assert s.plugins == {"procfs": {"root": "/host/proc"}}, "env nests into the YAML mapping"
    cfg = Config(path)
    cfg.set("pusher", "port", 9002, "--pusher-port")
    assert cfg.load(Settings).port == 9002
    cfg.set("pusher", "port", "lots", "--pusher-port")
    with pytest.raises(
        ConfigError,
        match=r"command-line flag --pusher-port: pusher\.port: expected an integer, got 'lots'",
    ):
        cfg.load(Settings)
    monkeypatch.setenv("KELVIN_PUSHER_QOS", "2")
    with pytest.raises(
        ConfigError,
        match=r"environment variable KELVIN_PUSHER_QOS: pusher\.qos: expected one of 0, 1",
    ):
        Config(path).load(Settings)
    monkeypatch.delenv("KELVIN_PUSHER_QOS")
    path.write_text("pusher:\n  brokers: ['h:99999']\n  colour: red\n")
    with pytest.raises(ConfigError) as err:
        Config(path).load(Settings)
    msg = str(err.value)
    assert f"{path}: pusher.colour: unknown key; expected one of" in msg
    monkeypatch.delenv("KELVIN_PUSHER_BROKERS")
    with pytest.raises(ConfigError, match=r"pusher\.brokers: .*port in 1\.\.65535"):
        Config(path).load(Settings)


def test_the_shared_auth_section_has_the_other_services_checks(tmp_path: Path) -> None:
    path = tmp_path / "kelvin.yaml"
    path.write_text("auth:\n  admin_token: short\n")
    with pytest.raises(ConfigError, match=r"auth\.admin_token: expected a string"):
        Config(path).load(AuthSettings)
    path.write_text("auth:\n  mode: none\n  allowed_hosts: [kelvin.example]\n")
    auth = Config(path).load(AuthSettings).to_config()
    assert auth.insecure and auth.allowed_hosts == ("kelvin.example",)
