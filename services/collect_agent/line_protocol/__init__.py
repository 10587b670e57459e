"""InfluxDB line protocol (HTTP ``/write``, Telegraf-compatible) to Kelvin readings.

A line ``cpu,host=n1,core=0 user=1.5,idle=97i 1764500000000000000`` becomes
one reading per numeric field, on ``/influx/cpu/n1/0/user`` and
``/influx/cpu/n1/0/idle`` (:mod:`.naming`). Booleans become 1/0; string
fields carry no reading and are counted.

Which lines are taken and which are refused is InfluxDB 1.6's decision, rule
for rule (:mod:`.scan`; the tests compare with a real ``influxd``): a quoted
string may hold newlines, an unterminated one runs to the end of the body,
``\\r\\n`` line ends are refused, and so on. Bad lines are skipped, counted and
reported, the good ones kept (InfluxDB's partial write). Deliberate
differences, each because Kelvin stores something else:

- unsigned integers (``5u``) are taken, as InfluxDB 2 takes them (1.x OSS refuses);
- times before 1970 are refused (Kelvin's storage keeps times from the epoch on);
- a line whose sensor name breaks Kelvin's naming rules (deeper than 32 levels,
  a level over 255 characters, a name over 1024 bytes) is refused (``bad_topic``);
- the same field as a float on one line and an integer on the next is no
  conflict (every reading is a float), where InfluxDB refuses the second;
- an unknown ``precision`` is a 400 (InfluxDB 1.x reads it as ns), and a body
  that is not UTF-8 is refused whole (by the route).

:meth:`LineProtocol.parse` runs the vectorised parser (:mod:`.fast`) and
hands the lines it does not take to the reference; :meth:`LineProtocol.parse_reference`
runs the reference alone (the tests hold the two to the same answers).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from services.collect_agent.line_protocol import scan
from services.collect_agent.line_protocol.fast import FastParser
from services.collect_agent.line_protocol.naming import Naming
from services.collect_agent.line_protocol.scan import LineProtocolError
from services.common.errors import SensorNameError
from services.common.readings import Batch

__all__ = ["PRECISION_NS", "LineProtocol", "LineProtocolError", "Naming", "ParseResult"]

PRECISION_NS = {
    "n": 1, "ns": 1, "u": 1_000, "us": 1_000, "µ": 1_000, "ms": 1_000_000,
    "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000,
}  # fmt: skip


@dataclass
class ParseResult:
    batch: Batch
    lines: int = 0
    """Lines that hold a point (not blank, not a comment)."""
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    """(line number, reason, message) for each refused line, in line order."""
    string_fields: int = 0
    """String fields seen (valid line protocol, but no reading)."""


def precision_scale(precision: str) -> int:
    scale = PRECISION_NS.get(precision)
    if scale is None:
        raise LineProtocolError(
            f"precision {precision!r} is not one of {', '.join(PRECISION_NS)}", "bad_precision"
        )
    return scale


def read_line(
    line: bytes, scale: int, default_ns: int, naming: Naming
) -> tuple[list[str], list[float], int, int]:
    """One line the reference way: (sensors, values, timestamp ns, string fields)."""
    p = scan.parse_point(line)
    ts = scan.timestamp_ns(p.timestamp, scale, line) if p.timestamp else default_ns
    if any(k == b"time" for k, _ in p.tags):
        raise LineProtocolError(f"tag key 'time' is not allowed: {line[:80]!r}", "bad_line")
    head = naming.head(_text(p.measurement), [_text(v) for _, v in p.tags])
    sensors: list[str] = []
    values: list[float] = []
    strings = named = 0
    for key, raw in p.fields:
        if key == b"time":  # InfluxDB skips a field named time
            continue
        named += 1
        if not raw:  # InfluxDB's field iterator reads some escaped layouts so: no value
            continue
        value = scan.field_value(raw, line)
        if value is None:
            strings += 1
            continue
        sensors.append(naming.sensor(head, _text(key)))
        values.append(value)
    if not named:
        raise LineProtocolError(f"field key 'time' is not allowed: {line[:80]!r}", "bad_field")
    return sensors, values, ts, strings


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class LineProtocol:
    """Parses ``/write`` bodies under one agent's naming rules (see the module docstring)."""

    def __init__(self, measurements: dict[str, str] | None = None, prefix: str = "/influx"):
        self.naming = Naming(measurements, prefix)
        self.fast = FastParser(self.naming)

    def parse(self, body: bytes | str, precision: str, received_ns: int) -> ParseResult:
        data = body.encode() if isinstance(body, str) else bytes(body)
        scale = precision_scale(precision)
        default_ns = received_ns - received_ns % scale  # InfluxDB truncates "now" too
        fast = self.fast.parse(data, scale, default_ns)
        res = ParseResult(Batch.empty(), lines=fast.lines, string_fields=fast.strings)
        sensors, ts, vs, line_of = self._reference(data, fast.rest, scale, default_ns, res)
        if not sensors:
            if fast.sensors:
                res.batch = Batch.from_rows(fast.sensors, fast.timestamps_ns, fast.values)
            return res
        names = np.array(fast.sensors + sensors, dtype=object)
        all_ts = np.concatenate((fast.timestamps_ns, np.asarray(ts, np.int64)))
        all_vs = np.concatenate((fast.values, np.asarray(vs, np.float64)))
        order = np.argsort(np.concatenate((fast.line_of, line_of)), kind="stable")
        res.batch = Batch.from_rows(names[order].tolist(), all_ts[order], all_vs[order])
        return res

    def parse_reference(self, body: bytes | str, precision: str, received_ns: int) -> ParseResult:
        """The same answer as :meth:`parse`, by the reference parser alone (slow)."""
        data = body.encode() if isinstance(body, str) else bytes(body)
        scale = precision_scale(precision)
        default_ns = received_ns - received_ns % scale
        res = ParseResult(Batch.empty())
        sensors, ts, vs, _ = self._reference(data, scan.blocks(data), scale, default_ns, res)
        if sensors:
            res.batch = Batch.from_rows(sensors, np.asarray(ts, np.int64), vs)
        return res

    def _reference(
        self,
        body: bytes,
        blocks: Iterable[tuple[int, int, int]],
        scale: int,
        default_ns: int,
        res: ParseResult,
    ) -> tuple[list[str], list[int], list[float], list[int]]:
        sensors: list[str] = []
        stamps: list[int] = []
        values: list[float] = []
        line_of: list[int] = []
        for no, start, end in blocks:
            res.lines += 1
            try:
                got, vs, ts, strings = read_line(body[start:end], scale, default_ns, self.naming)
            except LineProtocolError as exc:
                res.errors.append((no, exc.reason, str(exc)))
                continue
            except SensorNameError as exc:
                res.errors.append((no, "bad_topic", str(exc)))
                continue
            sensors += got
            values += vs
            stamps += [ts] * len(got)
            line_of += [no] * len(got)
            res.string_fields += strings
        return sensors, stamps, values, line_of
