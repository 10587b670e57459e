"""Light models: pydantic's lax coercion and Kelvin's error messages, without pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from services.common.schema import (
    AliasChoices,
    Field,
    Model,
    ModelConfig,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


class Inner(Model):
    model_config = ModelConfig(camel=True)

    queue_size: int = Field(1024, ge=1)
    min_values: int = Field(1, ge=1)

    @field_validator("min_values")
    @classmethod
    def _fits(cls, v: int, info: ValidationInfo) -> int:
        if v > info.data.get("queue_size", v):
            raise ValueError(f"minValues {v} exceeds queueSize {info.data['queue_size']}")
        return v


class Outer(Inner):
    name: str
    count: int = Field(3, validation_alias=AliasChoices("count", "numCount"), le=10)
    ratio: float = 0.5
    on: bool = False
    mode: Literal["a", "b"] = "a"
    qos: Literal[0, 1] = 1
    path: Path | None = None
    tags: list[str] = []
    inner: list[Inner] = Field(default_factory=list)
    extra: dict[str, int] = {}

    @field_validator("name", mode="before")
    @classmethod
    def _strip(cls, v: object) -> object:
        return v.strip() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _either(self) -> Outer:
        if self.on and self.path is None:
            raise ValueError("'on' needs a 'path'")
        return self


def test_lax_coercion_as_pydantic_does_it() -> None:
    o = Outer.model_validate(
        {"name": " n ", "numCount": "7", "ratio": "1e3", "on": "yes", "path": "/x", "qos": "0",
         "queueSize": 5.0, "tags": ("a", "b"), "inner": [{"queue_size": "2", "minValues": 2}],
         "extra": {"k": "3"}}
    )  # fmt: skip
    assert (o.name, o.count, o.ratio, o.on, o.path, o.qos) == ("n", 7, 1000.0, True, Path("/x"), 0)
    assert o.queue_size == 5 and o.tags == ["a", "b"] and o.extra == {"k": 3}
    assert o.inner == [Inner(queue_size=2, min_values=2)]
    assert o.model_fields_set == {"name", "count", "ratio", "on", "path", "qos", "queue_size",
                                  "tags", "inner", "extra"}  # fmt: skip
    assert o.model_dump(exclude_unset=True, include={"count", "inner"}) == {
        "count": 7, "inner": [{"queue_size": 2, "min_values": 2}],
    }  # fmt: skip
    assert Outer(name="x").tags == [] and Outer(name="x").tags is not Outer(name="y").tags
    assert list(Outer.model_fields)[:3] == ["queue_size", "min_values", "name"]


def test_every_error_names_its_key_what_was_expected_and_what_came() -> None:
    with pytest.raises(ValidationError) as err:
        Outer.model_validate(
            {"count": 11, "ratio": "lots", "on": "maybe", "mode": "c", "tags": "a",
             "inner": [{"queueSize": 0}, {"queueSize": 2, "minValues": 3}], "colour": 1,
             "queueSize": 2.5}
        )  # fmt: skip
    text = err.value.explain("k.yaml: x")
    for part in (
        "k.yaml: x.name: required (a string) but not given",
        "x.count: expected an integer, got 11 (Input should be less than or equal to 10)",
        "x.ratio: expected a number, got 'lots'",
        "x.on: expected a boolean (true/false), got 'maybe'",
        "x.mode: expected one of 'a', 'b', got 'c' (Input should be 'a' or 'b')",
        "x.tags: expected a list of a string, got 'a'",
        "x.inner.0.queueSize: expected an integer, got 0 (Input should be greater than or equal to 1)",
        "x.inner.1.minValues: expected an integer, got 3 (Value error, minValues 3 exceeds queueSize 2)",
        "x.colour: unknown key; expected one of count, extra, inner,",
        "x.queueSize: expected an integer, got 2.5 (Input should be a valid integer, got a number with a fractional part)",
    ):
        assert part in text, part
    with pytest.raises(ValidationError, match="'on' needs a 'path'"):
        Outer.model_validate({"name": "n", "on": True})
    with pytest.raises(ValidationError, match="valid dictionary"):
        Outer.model_validate(["not", "a", "mapping"])
