"""The `kelvin` command: help everywhere, exit codes, clear errors."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.cli import HTTP_SECTIONS, _announce, build_config, build_parser, main, prepare_auth
from services.common.settings import Config
from tests.support.servers import free_port


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_commands(sub, (*prefix, name)))
    return found


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _commands(build_parser())
    assert ("run",) in commands and ("up",) in commands
    for cmd in commands:
        with pytest.raises(SystemExit) as info:
            main([*cmd, "--help"])
        assert info.value.code == 0, cmd
        out = capsys.readouterr().out
        assert out.startswith("usage: kelvin"), (cmd, out[:200])


def test_run_requires_a_known_service(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "toaster"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_config_with_wrong_type_exits_2_naming_file_key_type(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("collect_agent:\n  mqtt_port: eighteen-eighty-three\n")
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "up", "--config", str(cfg), "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert str(cfg) in proc.stderr
    assert "collect_agent.mqtt_port" in proc.stderr
    assert "expected an integer" in proc.stderr


def test_unknown_config_section_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("colect_agent:\n  mqtt_port: 1\n")
    assert main(["run", "allocator", "--config", str(cfg)]) == 2


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable, "-m", "services.cli", "up", "--data-dir", str(tmp_path),
                "--query-api-port", str(taken), "--mqtt-port", str(free_port()),
                "--collect-agent-port", str(free_port()), "--pusher-port", str(free_port()),
                "--allocator-port", str(free_port()),
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"port {taken} on 127.0.0.1 is already in use" in proc.stderr
    assert "--query-api-port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_announce_names_the_address_each_service_bound(capsys: pytest.CaptureFixture[str]) -> None:
    def svc(name: str, host: str, port: int | None) -> Any:
        return SimpleNamespace(name=name, port=port, http=SimpleNamespace(host=host))

    cfg = Config()
    cfg.profile = "up"
    _announce(
        [
            svc("collect-agent", "192.0.2.7", 8081),
            svc("query-api", "192.0.2.7", 8080),
            svc("allocator", "0.0.0.0", 8083),
            svc("pusher", "::1", None),
        ],
        cfg,
    )
    assert capsys.readouterr().out.splitlines() == [
        "kelvin up: every service is running.",
        "  console        http://192.0.2.7:8080/",
        "  collect-agent  http://192.0.2.7:8081/",
        "  allocator      http://127.0.0.1:8083/",
        "Stop with Ctrl-C.",
    ]


def _hosts(cfg: Config) -> set[str]:
    return {str(cfg.overrides.get(sec, {}).get("host", "<default>")) for sec in HTTP_SECTIONS}


def test_run_binds_everywhere_only_with_auth_on(tmp_path: Path) -> None:
    parser = build_parser(tools=False)
    on = build_config(parser.parse_args(["run", "query-api", "--data-dir", str(tmp_path)]), "run")
    assert _hosts(on) == {"<default>"}, "the services' own default, 0.0.0.0"
    assert on.overrides["auth"]["token_file"] == str(tmp_path / "auth" / "tokens.json")
    off = build_config(parser.parse_args(["run", "query-api", "--insecure"]), "run")
    assert _hosts(off) == {"127.0.0.1"} and off.overrides["auth"]["mode"] == "none"
    chosen = build_config(
        parser.parse_args(["run", "query-api", "--insecure", "--host", "0.0.0.0"]), "run"
    )
    assert _hosts(chosen) == {"0.0.0.0"}, "an explicit bind address is kept (with a warning)"
    up = build_config(parser.parse_args(["up"]), "up")
    assert _hosts(up) == {"127.0.0.1"}


def test_announce_prints_generated_tokens_once_then_their_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    svc = SimpleNamespace(name="query-api", port=8080, http=SimpleNamespace(host="127.0.0.1"))
    cfg = Config()
    cfg.profile = "up"
    cfg.set("auth", "token_file", str(tmp_path / "tokens.json"))
    first = prepare_auth(cfg, ["query-api"])
    assert first is not None and first.generated
    _announce([svc], cfg, first)  # type: ignore[list-item]
    out = capsys.readouterr().out
    assert all(tok in out for tok in first.by_role.values())
    again = prepare_auth(cfg, ["query-api"])
    _announce([svc], cfg, again)  # type: ignore[list-item]
    out = capsys.readouterr().out
    assert f"tokens in {tmp_path / 'tokens.json'}" in out
    assert not any(tok in out for tok in first.by_role.values())
