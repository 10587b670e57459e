"""InfluxDB line protocol (HTTP ``/write``, Telegraf-compatible) to Kelvin readings.

A line ``cpu,host=n1,core=0 user=1.5,idle=97i 1764500000000000000`` becomes
one reading per numeric field, on the sensor ``<prefix>/<tag values>/<field>``
where ``<prefix>`` is the measurement's configured prefix (default
``<influx_prefix>/<measurement>``): here ``/influx/cpu/n1/0/user`` and
``/influx/cpu/n1/0/idle``. Tag values keep their order on the line (Telegraf
sorts tags by key). Booleans become 1/0; string fields carry no reading and are
counted. Bad lines are skipped and reported; the good
ones are kept (InfluxDB's "partial write").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.common import names
from services.common.errors import SensorNameError
from services.common.readings import Batch

PRECISION_NS = {
    "n": 1, "ns": 1, "u": 1_000, "us": 1_000, "µ": 1_000, "ms": 1_000_000,
    "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000,
}  # fmt: skip
_TRUE = {"t", "T", "true", "True", "TRUE"}
_FALSE = {"f", "F", "false", "False", "FALSE"}
_LEVEL_UNSAFE = str.maketrans({"/": "_", "+": "_", "#": "_", "\x00": "_"})


@dataclass
class ParseResult:
    batch: Batch
    lines: int = 0
    """Non-empty, non-comment lines seen."""
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    """(line number, reason, message) for each rejected line."""
    string_fields: int = 0
    """String fields seen (valid line protocol, but no reading)."""


class LineProtocolError(ValueError):
    def __init__(self, message: str, reason: str = "bad_line") -> None:
        super().__init__(message)
        self.reason = reason


def _split(text: str, sep: str, quotes: bool = False) -> list[str]:
    """Split on ``sep`` outside backslash escapes (and, for fields, outside quotes)."""
    if "\\" not in text and (not quotes or '"' not in text):
        return text.split(sep)
    out: list[str] = []
    cur: list[str] = []
    i, n, quoted = 0, len(text), False
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            cur.append(text[i : i + 2])
            i += 2
            continue
        if quotes and ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            out.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(ch)
        i += 1
    if quoted:
        raise LineProtocolError("unterminated string field value")
    out.append("".join(cur))
    return out


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    for a, b in (("\\,", ","), ("\\=", "="), ("\\ ", " "), ('\\"', '"'), ("\\\\", "\\")):
        text = text.replace(a, b)
    return text


def _level(text: str) -> str:
    return _unescape(text).translate(_LEVEL_UNSAFE)


def _value(raw: str) -> float | None:
    """A field value as a float; None for a string field."""
    if raw.startswith('"'):
        return None
    if raw[-1:] in ("i", "u") and raw[:-1].lstrip("-").isdecimal():
        return float(int(raw[:-1]))
    if raw in _TRUE:
        return 1.0
    if raw in _FALSE:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise LineProtocolError(f"field value {raw[:40]!r} is not a number", "bad_field") from None


def parse(
    body: str,
    precision: str,
    received_ns: int,
    prefix_of: dict[str, str],
    default_prefix: str,
) -> ParseResult:
    """Parse a ``/write`` body (see the module docstring)."""
    scale = PRECISION_NS.get(precision)
    if scale is None:
        raise LineProtocolError(
            f"precision {precision!r} is not one of {', '.join(PRECISION_NS)}", "bad_precision"
        )
    sensors: list[str] = []
    stamps: list[int] = []
    values: list[float] = []
    res = ParseResult(Batch.empty())
    base = "" if default_prefix in ("", "/") else default_prefix.rstrip("/")
    for no, line in enumerate(body.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        res.lines += 1
        try:
            parts = _split(line, " ", quotes=True)
            parts = [p for p in parts if p]
            if len(parts) not in (2, 3):
                raise LineProtocolError("expected 'measurement[,tags] fields [timestamp]'")
            key = _split(parts[0], ",")
            measurement = _unescape(key[0])
            if not measurement:
                raise LineProtocolError("empty measurement name")
            levels = []
            for tag in key[1:]:
                k, eq, v = tag.partition("=")
                if not eq or not k:
                    raise LineProtocolError(f"tag {tag[:40]!r} is not key=value")
                if v:
                    levels.append(_level(v))
            ts = received_ns
            if len(parts) == 3:
                # isdecimal, not isdigit: int() refuses digits such as '²'.
                if not parts[2].lstrip("-").isdecimal():
                    raise LineProtocolError(
                        f"timestamp {parts[2][:30]!r} is not an integer", "bad_timestamp"
                    )
                ts = int(parts[2]) * scale
                if not 0 <= ts < 2**63:
                    raise LineProtocolError(
                        f"timestamp {parts[2][:30]} is out of range", "bad_timestamp"
                    )
            prefix = prefix_of.get(measurement) or f"{base}/{_level(measurement)}"
            head = "/".join([prefix.rstrip("/"), *levels])
            line_sensors: list[str] = []
            line_values: list[float] = []
            strings = 0
            for fld in _split(parts[1], ",", quotes=True):
                k, eq, raw = fld.partition("=")
                if not eq or not k or not raw:
                    raise LineProtocolError(f"field {fld[:40]!r} is not key=value")
                value = _value(raw)
                if value is None:
                    strings += 1
                    continue
                line_sensors.append(names.validate(f"{head}/{_level(k)}"))
                line_values.append(value)
            # A line is all or nothing, as in InfluxDB.
            sensors += line_sensors
            values += line_values
            stamps += [ts] * len(line_sensors)
            res.string_fields += strings
        except LineProtocolError as exc:
            res.errors.append((no, exc.reason, str(exc)))
        except SensorNameError as exc:
            res.errors.append((no, "bad_topic", str(exc)))
    if sensors:
        res.batch = Batch.from_rows(
            sensors, np.asarray(stamps, dtype=np.int64), np.asarray(values, dtype=np.float64)
        )
    return res
