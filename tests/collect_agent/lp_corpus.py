"""Random line-protocol bodies for the differential tests: what clients send, and worse.

Escapes, quoted strings (with commas, spaces, ``=``, quotes and newlines),
tags sorted or not and repeated, every field type and its misspellings,
timestamps of every precision and out of range, stray separators, tabs, NULs,
CRLF, comments, blank lines, and random mutations of all of it. Seeded, so a
failure names its seed.
"""

from __future__ import annotations

import random

from services.collect_agent.line_protocol.scan import line_end

_PLAIN = "abcxyzAB019_-./"
_ESCAPES = ["\\ ", "\\,", "\\=", '\\"', "\\\\", "\\"]
_ODD = ["é", "²", "+", "#", "\t", "\x00", '"', "=", ",", " ", "\r"]


def token(r: random.Random) -> str:
    """A measurement, tag or field name: mostly plain, sometimes escaped or broken."""
    out = []
    for _ in range(r.randint(1, 7)):
        c = r.random()
        if c < 0.8:
            out.append(r.choice(_PLAIN))
        elif c < 0.9:
            out.append(r.choice(_ESCAPES))
        else:
            out.append(r.choice(_ODD))
    return "".join(out)


def plain_token(r: random.Random) -> str:
    return "".join(r.choice(_PLAIN) for _ in range(r.randint(1, 8)))


_FLOATS = ["1e5", "-.5", "5.", ".5e-3", "1E+05", "1e400", "-1e-400", "0", "-0", "00.100",
           "nan", "NaN", "inf", "1.2.3", "+1", "0x10", "1_000", "-", ".", "1e", "e5", "1e5.5",
           "2.2250738585072011e-308", "9007199254740993", "0.30000000000000004",
           "123456789012345678901234567890", "1" + "0" * 400]  # fmt: skip
_INTS = ["0i", "-0i", "007i", "9223372036854775807i", "-9223372036854775808i",
         "9223372036854775808i", "1.5i", "1e5i", "-i", "i", "5ii", "5iu", "5u", "-5u", "0u",
         "18446744073709551615u", "18446744073709551616u", "12i3"]  # fmt: skip
_BOOLS = ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE", "tRue",
          "yes", "truee", "t0"]  # fmt: skip


def value(r: random.Random, open_quotes: bool = True) -> str:
    c = r.random()
    if c < 0.35:
        return r.choice(
            [repr(r.uniform(-1e6, 1e6)), f"{r.uniform(0, 1000):.2f}", str(r.randint(0, 99))]
        )
    if c < 0.45:
        return repr(r.random() * 10 ** r.randint(-30, 30))
    if c < 0.55:
        return r.choice(_FLOATS)
    if c < 0.65:
        return f"{r.randint(-(10**12), 10**12)}i" if r.random() < 0.6 else r.choice(_INTS)
    if c < 0.75:
        return r.choice(_BOOLS)
    if c < 0.9:
        text = "".join(
            r.choice(["a", " ", ",", "=", '\\"', "\\\\", "é", "\n", "x"])
            for _ in range(r.randint(0, 8))
        )
        return f'"{text}"' if r.random() < 0.9 or not open_quotes else f'"{text}'
    return "".join(r.choice("0123456789.-+eEiu") for _ in range(r.randint(1, 10)))


_DIGITS = {"ns": 19, "u": 16, "ms": 13, "s": 10, "m": 8, "h": 6}


def timestamp(r: random.Random, precision: str) -> str:
    c = r.random()
    if c < 0.3:
        return ""
    if c < 0.75:
        digits = _DIGITS.get(precision, 19)
        return str(r.randint(10 ** (digits - 1), 10**digits - 1) // 7 * 3)
    return r.choice(["-5", "0", "00012", "-", "99999999999999999999", "9223372036854775807",
                     "9223372036854775806", "-9223372036854775806", "12x", "1.5", "²", "+5"])  # fmt: skip


def line(
    r: random.Random,
    precision: str,
    suffix: str = "",
    plain: bool = False,
    open_quotes: bool = True,
) -> str:
    """One line; ``suffix`` and the field's number are appended to every field key (to tell
    lines and fields apart)."""
    name = plain_token if plain else token
    keys = sorted({name(r) for _ in range(r.randint(0, 3))})
    timely = not plain and open_quotes  # tags and fields named time
    if not plain and r.random() < 0.1 and (keys or timely):
        keys.append(r.choice([*keys, "time"] if timely else keys))  # a repeated key
    if not plain and r.random() < 0.2:
        r.shuffle(keys)
    tags = "".join(f",{k}={name(r)}" for k in keys)
    if not plain and r.random() < 0.05:
        tags += r.choice([",", ",k", ",k=", ",=v", ",k=v=w"])
    nfields = r.randint(1, 4)
    fields = ",".join(
        f"{'time' if timely and r.random() < 0.05 else name(r)}{suffix and f'{suffix}_{j}'}"
        f"={value(r, open_quotes)}"
        for j in range(nfields)
    )
    ts = timestamp(r, precision)
    sep = " " if plain or r.random() < 0.85 else r.choice(["  ", "\t", " \t"])
    out = f"{name(r)}{tags}{sep}{fields}"
    if ts:
        out += f"{sep}{ts}"
    if not plain and r.random() < 0.05:
        out = r.choice(["  ", "\t", "\x00"]) + out
    if not plain and r.random() < 0.05:
        out += r.choice([" ", "  ", " x", "\r"])
    return out


def mutate(r: random.Random, text: str, n: int) -> str:
    chars = list(text)
    for _ in range(n):
        i = r.randrange(len(chars) + 1)
        c = r.random()
        if c < 0.4 and chars:
            del chars[min(i, len(chars) - 1)]
        elif c < 0.7:
            chars.insert(i, r.choice(_ODD + list(_PLAIN) + ["\n", "\\"]))
        elif chars:
            chars[min(i, len(chars) - 1)] = r.choice(_ODD + list(_PLAIN))
    return "".join(chars)


def body(r: random.Random, lines: int, precision: str = "ns", unique: bool = False) -> str:
    """``unique``: every field key carries its line's number, no line runs on into the next
    (no open quote, no backslash or CRLF at a line's end) and none is named ``time`` (InfluxDB
    then reports only the points it dropped, not the lines it could not parse)."""
    out = []
    for i in range(lines):
        c = r.random()
        if c < 0.03:
            out.append(r.choice(["", "   ", '# a comment, with = and "', "#"]))
            continue
        text = line(r, precision, f"x{i}" if unique else "", c < 0.4, open_quotes=not unique)
        if c > 0.9:
            text = mutate(r, text, r.randint(1, 3))
        if unique and line_end(text.encode() + b"\nm v=1", 0) != len(text.encode()):
            continue  # it would run on into the next line
        out.append(text)
    end = "\n" if unique else r.choice(["\n", "\n", "\n", "\r\n"])
    return end.join(out) + r.choice(["", "\n"])


def uniform_body(r: random.Random, lines: int, precision: str = "ns") -> str:
    """Lines of one shape (one kind of metric), values and series varying."""
    keys = sorted({plain_token(r) for _ in range(r.randint(0, 3))})
    fields = [plain_token(r) for _ in range(r.randint(1, 3))]
    has_ts = r.random() < 0.8
    out = []
    for _ in range(lines):
        tags = "".join(f",{k}={plain_token(r)}" for k in keys)
        vals = ",".join(
            f"{f}={value(r) if r.random() < 0.2 else repr(r.uniform(-1e4, 1e4))}" for f in fields
        )
        ts = f" {timestamp(r, precision) or 1}" if has_ts else ""
        out.append(f"m{tags} {vals}{ts}")
    return "\n".join(out) + "\n"
