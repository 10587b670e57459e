"""Sensor metadata and job records, as DCDB carries them and Kelvin stores them."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from services.common.names import validate

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _to_bool(v: Any) -> Any:
    if isinstance(v, str):
        low = v.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    return v


def _to_int(v: Any) -> int:
    # pydantic turns only ValueError into a validation error: int() of infinity
    # (OverflowError) or of a list (TypeError) must not escape a decoder.
    try:
        return int(v)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"expected an integer, got {v!r}") from exc


class SensorMetadata(BaseModel):
    """What is known about a sensor beyond its readings.

    Accepts DCDB's camelCase keys (``publicName``, ``ttl``, ``interval``,
    ``isVirtual``) and Kelvin's snake_case ones; values may be strings or
    numbers, as DCDB pushers send either. A NaN or infinite number is refused on
    every path that builds one (MQTT metadata topic, ``PUT /api/v1/metadata``, a
    pusher's configuration): a NaN scale would turn every later reading into null.
    """

    model_config = ConfigDict(
        populate_by_name=True, extra="ignore", frozen=True, allow_inf_nan=False
    )

    name: str
    public_name: str | None = Field(
        None, validation_alias=AliasChoices("public_name", "publicName")
    )
    pattern: str | None = None
    unit: str | None = None
    scale: float = 1.0
    """Multiplier from the integer on the wire to the physical value."""
    ttl_ms: int | None = Field(None, validation_alias=AliasChoices("ttl_ms", "ttl"))
    """Keep readings this long; None or 0 keeps them forever."""
    interval_ms: int | None = Field(None, validation_alias=AliasChoices("interval_ms", "interval"))
    operations: tuple[str, ...] = ()
    integrable: bool = False
    monotonic: bool = False
    delta: bool = False
    is_virtual: bool = Field(False, validation_alias=AliasChoices("is_virtual", "isVirtual"))
    is_operation: bool = Field(False, validation_alias=AliasChoices("is_operation", "isOperation"))

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return validate(v)

    @field_validator(
        "integrable", "monotonic", "delta", "is_virtual", "is_operation", mode="before"
    )
    @classmethod
    def _bools(cls, v: Any) -> Any:
        return _to_bool(v)

    @field_validator("operations", mode="before")
    @classmethod
    def _ops(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(p.strip() for p in v.split(",") if p.strip())
        return v

    @field_validator("ttl_ms", "interval_ms", mode="before")
    @classmethod
    def _ints(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            return None if v == "" else _to_int(float(v))
        if isinstance(v, float):
            return _to_int(v)
        return v

    @field_validator("scale", mode="before")
    @classmethod
    def _scale(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and not v.strip()):
            return 1.0
        return v

    def merged(self, other: SensorMetadata) -> SensorMetadata:
        """``self`` updated with the fields ``other`` sets explicitly."""
        return self.model_copy(update=other.model_dump(exclude_unset=True, exclude={"name"}))


class JobRecord(BaseModel):
    """A job as DCDB's ``/DCDB_JOBDATA/`` topic announces it (times in ns)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    job_id: str = Field(validation_alias=AliasChoices("job_id", "jobid", "jobId"))
    domain_id: str = Field("default", validation_alias=AliasChoices("domain_id", "domainid"))
    user_id: str = Field("", validation_alias=AliasChoices("user_id", "userid", "userId"))
    start_ns: int = Field(
        ge=0, lt=2**63, validation_alias=AliasChoices("start_ns", "starttime", "startTime")
    )
    end_ns: int | None = Field(
        None, ge=0, lt=2**63, validation_alias=AliasChoices("end_ns", "endtime", "endTime")
    )
    """None while the job runs."""
    nodes: tuple[str, ...] = ()

    @field_validator("job_id", "domain_id", "user_id", mode="before")
    @classmethod
    def _str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: Any) -> Any:
        # boost::property_tree (DCDB's dcdbslurmjob) writes an empty node list, as every
        # stop record and a start without nodes carry, as "" rather than [].
        return () if v == "" or v is None else v

    @field_validator("end_ns", mode="before")
    @classmethod
    def _end(cls, v: Any) -> Any:
        # DCDB: endtime 0 or odd marks a job start (still running).
        if v is None:
            return None
        iv = _to_int(v)
        return None if iv == 0 or iv % 2 == 1 else iv

    @property
    def running(self) -> bool:
        return self.end_ns is None
