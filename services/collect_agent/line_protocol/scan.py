"""InfluxDB 1.x line-protocol scanning, rule for rule: the reference parser's core.

These are the rules of InfluxDB 1.6's parser (``models/points.go``), written
down from its behaviour and checked against a real ``influxd``
(tests/collect_agent/test_line_protocol_influxd.py): how a body splits into
lines (an unescaped newline ends a line unless it is inside a quoted string
field; a backslash takes the next byte with it), what makes a line invalid, and
how names are unescaped. Where InfluxDB's rules look odd (a backslash escapes
any byte while scanning, yet unescaping only removes it before ``,``, ``=``,
space and, in field keys and measurements, ``"``) they are kept: the point is
to accept, reject and name exactly what InfluxDB does.

It walks bytes one at a time, so it is slow (a few µs per line); the
vectorised parser (:mod:`.fast`) handles ordinary lines and hands everything
else to :func:`parse_point` here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from services.common.errors import PayloadError

SP, TAB, NL, NUL = 0x20, 0x09, 0x0A, 0x00
COMMA, EQ, DQ, BS, MINUS, PLUS, DOT = 0x2C, 0x3D, 0x22, 0x5C, 0x2D, 0x2B, 0x2E
_TAG, _FIELDS = 0, 2
MAX_KEY_BYTES = 65535
"""InfluxDB's limit on a series key (measurement and tags; plus 4 + field key per field)."""
MIN_NS, MAX_NS = -(2**63) + 2, 2**63 - 2
"""InfluxDB's time range (``models.MinNanoTime``, ``models.MaxNanoTime``)."""
_NUMBER_START = frozenset(b"0123456789.-Nn")
_DIGIT_OR_DOT = frozenset(b"0123456789.")
_TRUE = frozenset((b"t", b"T", b"true", b"True", b"TRUE"))
_BOOLS = _TRUE | {b"f", b"F", b"false", b"False", b"FALSE"}
_UNESCAPE_NAME = frozenset(b',"= ')


class LineProtocolError(PayloadError):
    """A line InfluxDB would refuse; ``reason`` labels the reject counter."""

    def __init__(self, message: str, reason: str = "bad_line") -> None:
        super().__init__(message, reason)


@dataclass(slots=True)
class Point:
    """One parsed line: names unescaped, field values as raw tokens."""

    measurement: bytes
    tags: list[tuple[bytes, bytes]]
    """(key, value), in line order."""
    fields: list[tuple[bytes, bytes]]
    """(key, raw value token), in line order."""
    timestamp: bytes
    """The raw timestamp token; empty when the line has none."""


def skip_whitespace(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in (SP, TAB, NUL):
        i += 1
    return i


def line_end(buf: bytes, i: int) -> int:
    """Where the line starting at ``i`` ends: the newline that ends it, or ``len(buf)``."""
    n = len(buf)
    quoted = fields = False
    equals = commas = 0
    while i < n:
        c = buf[i]
        if c == BS and i + 2 < n:
            i += 2
            continue
        if c == SP:
            fields = True
        if fields:
            if not quoted and c == EQ:
                equals += 1
                i += 1
                continue
            if not quoted and c == COMMA:
                commas += 1
                i += 1
                continue
            if c == DQ and equals > commas:
                quoted = not quoted
                i += 1
                continue
        if c == NL and not quoted:
            break
        i += 1
    return i


def blocks(body: bytes, start: int = 0, line: int = 1) -> Iterator[tuple[int, int, int]]:
    """(line number, start, end) of every line of ``body`` that holds a point: blank
    lines and ``#`` comments are left out; ``start`` is past leading whitespace."""
    pos, n = start, len(body)
    while pos < n:
        end = line_end(body, pos)
        first = skip_whitespace(body, pos)
        if first < end and body[first] != 0x23:  # '#': a comment
            stop = end - 1 if body[end - 1] == NL else end  # a quoted newline at the end
            yield line, first, stop
        line += body.count(b"\n", pos, end) + 1
        pos = end + 1


# --------------------------------------------------------------------------- one line


def _fail(what: str, buf: bytes, reason: str = "bad_line") -> LineProtocolError:
    text = buf[:80].decode("utf-8", "replace")
    return LineProtocolError(f"{what}: {text!r}", reason)


def _scan_measurement(buf: bytes, i: int) -> tuple[int, int]:
    n = len(buf)
    if i >= n or buf[i] == COMMA:
        raise _fail("missing measurement", buf)
    while True:
        i += 1
        if i >= n:
            raise _fail("missing fields", buf)
        if buf[i - 1] == BS:
            continue
        if buf[i] == COMMA:
            return _TAG, i + 1
        if buf[i] == SP:
            return _FIELDS, i


def _scan_tags(buf: bytes, i: int) -> tuple[int, list[int]]:
    n = len(buf)
    starts: list[int] = []
    while True:  # a tag key, then its value
        starts.append(i)
        if i >= n or buf[i] in (SP, COMMA, EQ):
            raise _fail("missing tag key", buf)
        while True:
            i += 1
            if i >= n or (buf[i] in (SP, COMMA) and buf[i - 1] != BS):
                raise _fail("missing tag value", buf)
            if buf[i] == EQ and buf[i - 1] != BS:
                i += 1
                break
        if i >= n or buf[i] in (COMMA, SP):
            raise _fail("missing tag value", buf)
        while True:
            i += 1
            if i >= n:
                raise _fail("missing fields", buf)
            if buf[i - 1] == BS:
                continue
            if buf[i] == EQ:
                raise _fail("invalid tag format", buf)
            if buf[i] == COMMA:
                i += 1
                break
            if buf[i] == SP:
                return i, starts


def _scan_to(buf: bytes, i: int, stop: int) -> int:
    """The first unescaped ``stop`` at or after ``i`` (or the end)."""
    n = len(buf)
    while i < n and not (buf[i] == stop and (i == 0 or buf[i - 1] != BS)):
        i += 1
    return i


def _scan_number(buf: bytes, i: int) -> int:
    n = len(buf)
    start = i
    is_int = is_uint = decimal = scientific = False
    if i < n and buf[i] == MINUS:
        i += 1
        if i == n:
            raise _fail("invalid number", buf, "bad_field")
    while i < n:
        c = buf[i]
        if c in (COMMA, SP):
            break
        if c == 0x69 and i > start and not (is_int or is_uint):  # 'i'
            is_int = True
            i += 1
            continue
        if c == 0x75 and i > start and not (is_int or is_uint):  # 'u'
            is_uint = True
            i += 1
            continue
        if c == DOT:
            if decimal:
                raise _fail("invalid number", buf, "bad_field")
            decimal = True
        if i > start and c in (0x65, 0x45):  # 'e' 'E'
            scientific = True
            i += 1
            continue
        if c in (PLUS, MINUS) and buf[i - 1] in (0x65, 0x45):
            i += 1
            continue
        if (i + 2 < n and c in (0x4E, 0x6E)) or c not in _DIGIT_OR_DOT:  # NaN: unsupported
            raise _fail("invalid number", buf, "bad_field")
        i += 1
    if (is_int or is_uint) and (decimal or scientific):
        raise _fail("invalid number", buf, "bad_field")
    # InfluxDB counts the 'u' suffix, an exponent and its sign as digits here
    digits = i - start - is_int - decimal - (buf[start] == MINUS)
    if digits == 0:
        raise _fail("invalid number", buf, "bad_field")
    token = buf[start:i]
    if is_int:
        if buf[i - 1] != 0x69:
            raise _fail("invalid number", buf, "bad_field")
        if not -(2**63) <= int_token(token[:-1]) < 2**63:
            raise _fail("integer out of range", buf, "bad_field")
    elif is_uint:
        # InfluxDB 1.x OSS refuses unsigned integers; 2.x (and Kelvin) take them
        if buf[i - 1] != 0x75 or buf[start] == MINUS:
            raise _fail("invalid number", buf, "bad_field")
        if int_token(token[:-1]) >= 2**64:
            raise _fail("unsigned integer out of range", buf, "bad_field")
    else:
        try:
            value = float(token)
        except ValueError:
            raise _fail("invalid float", buf, "bad_field") from None
        if value in (float("inf"), float("-inf")):
            raise _fail("invalid float (out of range)", buf, "bad_field")
    return i


def _scan_boolean(buf: bytes, i: int) -> int:
    n = len(buf)
    start = i
    if buf[i] not in b"tfTF":
        raise _fail("invalid boolean", buf, "bad_field")
    i += 1
    while i < n and buf[i] not in (COMMA, SP):
        i += 1
    if buf[start:i] not in _BOOLS:
        raise _fail("invalid boolean", buf, "bad_field")
    return i


def _scan_fields(buf: bytes, i: int) -> tuple[int, int]:
    n = len(buf)
    start = i = skip_whitespace(buf, i)
    quoted = False
    equals = commas = 0
    while i < n:
        c = buf[i]
        if c == BS and i + 1 < n:
            i += 2
            continue
        if c == DQ and equals > commas:
            quoted = not quoted
            i += 1
            continue
        if c == EQ and not quoted:
            equals += 1
            if buf[i - 1] in (SP, COMMA) and buf[i - 2] != BS:
                raise _fail("missing field key", buf)
            if i + 1 >= n or buf[i + 1] in (COMMA, SP):
                raise _fail("missing field value", buf, "bad_field")
            nxt = buf[i + 1]
            if nxt in _NUMBER_START:
                i = _scan_number(buf, i + 1)
                continue
            if nxt != DQ:
                i = _scan_boolean(buf, i + 1)
                continue
        if c == COMMA and not quoted:
            commas += 1
        if c == SP and not quoted:
            break
        i += 1
    if quoted:
        raise _fail("unbalanced quotes", buf)
    if equals == 0 or commas != equals - 1:
        raise _fail("invalid field format", buf)
    return start, i


def _scan_field_value(buf: bytes, i: int) -> int:
    n = len(buf)
    quoted = False
    while i < n:
        c = buf[i]
        if c == BS and i + 1 < n and buf[i + 1] in (DQ, BS):
            i += 2
            continue
        if c == DQ:
            quoted = not quoted
        elif c == COMMA and not quoted:
            break
        i += 1
    return i


def unescape_name(raw: bytes) -> bytes:
    """Measurements and field keys: ``\\,`` ``\\"`` ``\\ `` ``\\=`` lose the backslash."""
    if BS not in raw:
        return raw
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        if raw[i] == BS and i + 1 < n and raw[i + 1] in _UNESCAPE_NAME:
            out.append(raw[i + 1])
            i += 2
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def unescape_tag(raw: bytes) -> bytes:
    """Tag keys and values: ``\\,``, ``\\ ``, then ``\\=`` lose the backslash."""
    for esc in (b"\\,", b"\\ ", b"\\="):
        raw = raw.replace(esc, esc[1:])
    return raw


def parse_point(buf: bytes) -> Point:
    """One line (no leading whitespace, no newline), checked as InfluxDB checks it."""
    state, i = _scan_measurement(buf, 0)
    tag_starts: list[int] = []
    if state == _TAG:
        i, tag_starts = _scan_tags(buf, i)
    key_end = i
    tag_keys = [buf[s : _scan_to(buf, s, EQ)] for s in tag_starts]
    if len(set(tag_keys)) != len(tag_keys):
        raise _fail("duplicate tags", buf)
    if key_end > MAX_KEY_BYTES:
        raise _fail(f"max key length exceeded: {key_end} > {MAX_KEY_BYTES}", buf)
    f_start, i = _scan_fields(buf, i)
    if i == f_start:
        raise _fail("missing fields", buf)
    fields = _fields(buf[f_start:i])
    for k, _ in fields:
        if key_end + 4 + len(k) > MAX_KEY_BYTES:
            raise _fail("max key length exceeded", buf)
    start = i = skip_whitespace(buf, i)
    n = len(buf)
    while i < n and buf[i] not in (NL, SP):
        if not (0x30 <= buf[i] <= 0x39 or (i == start and buf[i] == MINUS)):
            raise _fail("bad timestamp", buf, "bad_timestamp")
        i += 1
    stamp = buf[start:i]
    if stamp and buf[i:].strip(b" "):
        raise _fail("point is invalid (text after the timestamp)", buf)
    measurement = unescape_name(buf[: tag_starts[0] - 1] if tag_starts else buf[:key_end])
    tags = []
    for s, k in zip(tag_starts, tag_keys, strict=True):
        value = buf[s + len(k) + 1 : _tag_value_end(buf, s + len(k) + 1)]
        tags.append((unescape_tag(k), unescape_tag(value)))
    return Point(measurement, tags, fields, stamp)


def _tag_value_end(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and not (buf[i] in (COMMA, SP) and buf[i - 1] != BS):
        i += 1
    return i


def _fields(raw: bytes) -> list[tuple[bytes, bytes]]:
    """(unescaped key, raw value) of each field, as InfluxDB's field iterator reads them."""
    out = []
    pos = 0
    while pos < len(raw):
        eq = _scan_to(raw, pos, EQ)
        end = _scan_field_value(raw, eq + 1)
        out.append((unescape_name(raw[pos:eq]), raw[eq + 1 : end]))
        pos = end + 1
    return out


def field_value(raw: bytes, line: bytes = b"") -> float | None:
    """A scanned field's value as Kelvin stores it; None for a string field.

    InfluxDB's field iterator splits fields by rules other than its scanner's, so
    with some escapes and quotes it finds a value the scanner never checked (and
    fails the whole write with a 500 when storing it): such a line is refused here.
    """
    c = raw[0]
    if c == DQ:
        return None
    try:
        if c in b"0123456789-.nNiIu":
            if raw[-1] in b"iu":
                if not raw[:-1].lstrip(b"-").isdigit():
                    raise ValueError
                return float(int_token(raw[:-1]))
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")) or not raw.isascii():
                raise ValueError
            return value
        if raw not in _BOOLS:
            raise ValueError
    except ValueError:
        raise _fail("field value does not parse", line or raw, "bad_field") from None
    return 1.0 if raw in _TRUE else 0.0


def int_token(raw: bytes) -> int:
    """An optional ``-`` and digits as an int; beyond 2**70 (int() of thousands of digits is
    slow, and refused past 4300) any value beyond 64 bits stands for it."""
    if len(raw.lstrip(b"-").lstrip(b"0")) > 21:
        return -(2**70) if raw[:1] == b"-" else 2**70
    return int(raw)


def timestamp_ns(raw: bytes, scale: int, line: bytes) -> int:
    """A timestamp token in ``scale`` ns units, checked against InfluxDB's and Kelvin's range."""
    if raw in (b"-", b""):
        raise _fail("bad timestamp", line, "bad_timestamp")
    ts = int_token(raw)
    if not -(2**63) <= ts < 2**63 or not MIN_NS <= ts * scale <= MAX_NS:
        raise _fail("time outside range", line, "bad_timestamp")
    if ts < 0:  # InfluxDB takes times before 1970; Kelvin's storage does not
        raise _fail(
            "time before 1970 (Kelvin stores times from the epoch on)", line, "bad_timestamp"
        )
    return ts * scale
