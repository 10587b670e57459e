"""Settings precedence (defaults < YAML < env < flags) and error messages."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel
from pydantic_settings import SettingsConfigDict

from services.common.errors import ConfigError
from services.common.settings import Config, SectionSettings


class _Inner(BaseModel):
    depth: int = 1


class _Demo(SectionSettings):
    section: ClassVar[str] = "demo_svc"
    model_config = SettingsConfigDict(env_prefix="KELVIN_DEMO_SVC_")

    port: int = 1
    name: str = "default"
    ratio: float = 0.5
    inner: _Inner = _Inner()


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kelvin.yaml"
    p.write_text(text)
    return p


def test_precedence_defaults_yaml_env_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _yaml(tmp_path, "demo_svc:\n  port: 2\n  name: from-yaml\n  ratio: 0.7\n")
    assert Config().load(_Demo).port == 1
    assert Config(path).load(_Demo).model_dump() == {
        "port": 2, "name": "from-yaml", "ratio": 0.7, "inner": {"depth": 1},
    }  # fmt: skip
    monkeypatch.setenv("KELVIN_DEMO_SVC_PORT", "3")
    monkeypatch.setenv("KELVIN_DEMO_SVC_INNER__DEPTH", "9")
    s = Config(path).load(_Demo)
    assert (s.port, s.name, s.inner.depth) == (3, "from-yaml", 9)
    cfg = Config(path)
    cfg.set("demo_svc", "port", 4, "--port")
    assert cfg.load(_Demo).port == 4


def test_wrong_type_in_yaml_names_file_key_and_type(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "demo_svc:\n  inner:\n    depth: deep\n")
    with pytest.raises(ConfigError) as info:
        Config(path).load(_Demo)
    msg = str(info.value)
    assert (
        str(path) in msg
        and "demo_svc.inner.depth" in msg
        and "expected an integer" in msg
        and "'deep'" in msg
    )


def test_wrong_type_in_env_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KELVIN_DEMO_SVC_RATIO", "lots")
    with pytest.raises(
        ConfigError, match=r"environment variable KELVIN_DEMO_SVC_RATIO.*expected a number"
    ):
        Config().load(_Demo)


def test_wrong_type_in_flag_names_the_flag() -> None:
    cfg = Config()
    cfg.set("demo_svc", "port", "eighty", "--demo-port")
    with pytest.raises(
        ConfigError, match=r"command-line flag --demo-port: demo_svc.port: expected an integer"
    ):
        cfg.load(_Demo)


def test_unknown_key_lists_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"demo_svc.prot: unknown key; expected one of inner, name, port, ratio"
    ):
        Config(_yaml(tmp_path, "demo_svc:\n  prot: 5\n")).load(_Demo)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("demo_svc: [1, 2]\n", "expected a mapping"),
        ("- a\n- b\n", "mapping of sections"),
        ("demo_svc:\n  port: [unclosed\n", "not valid YAML"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Config(_yaml(tmp_path, text))


def test_missing_file_and_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config(tmp_path / "nope.yaml")
    cfg = Config(_yaml(tmp_path, "demo_svc: {}\ntypo_section: {}\n"))
    with pytest.raises(ConfigError, match=r"unknown section.*typo_section"):
        cfg.check_sections({"demo_svc"})
