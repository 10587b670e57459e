"""Sensor-name rules (names = MQTT topics)."""

from __future__ import annotations

import pytest

from services.common import names
from services.common.errors import SensorNameError


@pytest.mark.parametrize(
    "name",
    [
        "/a",
        "/dc/row0/rack3/node2/power",
        "/ünïcode/温度",
        "/a b/c-d_e.f",
        "/" + "/".join(["x"] * names.MAX_LEVELS),
    ],
)
def test_valid_names_pass_unchanged(name: str) -> None:
    assert names.validate(name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("a/b", "must start with '/'"),
        ("", "must start with '/'"),
        ("/", "no levels"),
        ("/a//b", "empty level at position 2"),
        ("/a/b/", "empty level"),
        ("/a/+/c", "wildcard '+'"),
        ("/a/#", "wildcard '#'"),
        ("/a/\x00", "NUL"),
        ("/" + "/".join(["x"] * (names.MAX_LEVELS + 1)), "levels"),
        ("/" + "x" * (names.MAX_LEVEL_CHARS + 1), "longer than"),
        ("/" + "/".join(["y" * 200] * 6), "longer than"),
        ("/bad\udcff", "UTF-8"),
    ],
)
def test_invalid_names_say_why(name: str, fragment: str) -> None:
    with pytest.raises(SensorNameError, match=None) as info:
        names.validate(name)
    assert fragment in str(info.value)


def test_hierarchy_helpers() -> None:
    assert names.parent("/a/b/c") == "/a/b"
    assert names.parent("/a") == "/"
    assert names.levels("/a/b") == ["a", "b"]
    assert names.join("/", "a", "b") == "/a/b"
    assert names.join("/x/", "/y/") == "/x/y"
    assert names.is_under("/a/b", "/a") and names.is_under("/a", "/a") and names.is_under("/q", "/")
    assert not names.is_under("/ab", "/a")
    assert names.child_of("/a/b/c", "/a") == "/a/b"
    assert names.child_of("/a/b", "/") == "/a"
    assert names.child_of("/a", "/a") is None
    assert names.child_of("/b/c", "/a") is None
    assert names.validate_prefix("/a/b/") == "/a/b"
    assert names.validate_prefix("") == "/"
