"""Syntax tree -> PromQL text, as Prometheus' ``String()`` methods print it.

The rules and alerts API shows each rule's ``query`` this way, so Grafana sees the
same text for a rule whether Prometheus or Kelvin evaluates it.
"""

from __future__ import annotations

import math

from services.query_api.promql import ast

_UNITS = (
    ("y", 365 * 86_400_000, True), ("w", 7 * 86_400_000, True), ("d", 86_400_000, False),
    ("h", 3_600_000, False), ("m", 60_000, False), ("s", 1000, False), ("ms", 1, False),
)  # fmt: skip
_QUOTE_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}  # fmt: skip


def duration(ns: int) -> str:
    """Prometheus' ``model.Duration.String()``: ``90m`` -> ``1h30m``, ``7d`` -> ``1w``."""
    ms = ns // 1_000_000
    if ms == 0:
        return "0s"
    out = ""
    for unit, mult, exact in _UNITS:
        if exact and ms % mult:
            continue
        v = ms // mult
        if v > 0:
            out += f"{v}{unit}"
            ms -= v * mult
    return out


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote``."""
    out = ['"']
    for c in s:
        if c in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def _shortest(v: float) -> tuple[str, int]:
    """Shortest round-trip digits of ``v > 0`` and the exponent of the first one."""
    r = repr(v)
    if "e" in r:
        mant, _, e = r.partition("e")
        return mant.replace(".", "").rstrip("0") or "0", int(e)
    whole, _, frac = r.partition(".")
    if whole != "0":
        return (whole + frac).rstrip("0") or "0", len(whole) - 1
    stripped = frac.lstrip("0")
    return stripped.rstrip("0"), -(len(frac) - len(stripped)) - 1


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    return None


def _exponent(v: float, digs: str, exp: int) -> str:
    body = digs[0] + ("." + digs[1:] if len(digs) > 1 else "")
    return f"{'-' if v < 0 else ''}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _positional(v: float, digs: str, exp: int) -> str:
    sign = "-" if v < 0 else ""
    dp = exp + 1
    if dp <= 0:
        return f"{sign}0.{'0' * -dp}{digs}"
    if dp >= len(digs):
        return f"{sign}{digs}{'0' * (dp - len(digs))}"
    return f"{sign}{digs[:dp]}.{digs[dp:]}"


def go_float(v: float) -> str:
    """Go's ``fmt.Sprint(float64)`` (``%g``, shortest digits, exponent from 1e+06 on)."""
    special = _special(v)
    if special is not None:
        return special
    digs, exp = _shortest(abs(v))
    return _exponent(v, digs, exp) if exp < -4 or exp >= 6 else _positional(v, digs, exp)


def go_format_f(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: how Prometheus writes scalars."""
    special = _special(v)
    return special if special is not None else _positional(v, *_shortest(abs(v)))


def go_format_e(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'e', -1, 64)`` (alert values in the rules API)."""
    special = _special(v)
    if v == 0 and special is not None:
        return "-0e+00" if special == "-0" else "0e+00"
    return special if special is not None else _exponent(v, *_shortest(abs(v)))


def prom_value(v: float) -> str:
    """A sample value as Prometheus' JSON writes it (``jsonutil.MarshalValue``): Go's 'f'
    format, or 'e' below 1e-6 and from 1e21 on."""
    a = abs(v)
    if a != 0 and math.isfinite(a) and (a < 1e-6 or a >= 1e21):
        return go_format_e(v)
    return go_format_f(v)


def _at(at_ns: int | None, at_kw: str | None) -> str:
    if at_ns is not None:
        return f" @ {at_ns / 1e9:.3f}"
    if at_kw is not None:
        return f" @ {at_kw}()"
    return ""


def _offset(ns: int) -> str:
    if ns > 0:
        return f" offset {duration(ns)}"
    if ns < 0:
        return f" offset -{duration(-ns)}"
    return ""


def _selector(n: ast.VectorSelector, modifiers: bool = True) -> str:
    parts = sorted(
        str(m)
        for m in n.matchers
        if not (m.name == "__name__" and m.op == "=" and m.value == n.name)
    )
    body = f"{n.name}{{{','.join(parts)}}}" if parts else n.name
    return body + (_at(n.at_ns, n.at_kw) + _offset(n.offset_ns) if modifiers else "")


def to_string(n: ast.Expr) -> str:
    if isinstance(n, ast.VectorSelector):
        return _selector(n)
    if isinstance(n, ast.MatrixSelector):
        vs = n.vs
        return f"{_selector(vs, False)}[{duration(n.range_ns)}]{_at(vs.at_ns, vs.at_kw)}{_offset(vs.offset_ns)}"
    if isinstance(n, ast.SubqueryExpr):
        step = duration(n.step_ns) if n.step_ns else ""
        return (
            f"{to_string(n.expr)}[{duration(n.range_ns)}:{step}]"
            f"{_at(n.at_ns, n.at_kw)}{_offset(n.offset_ns)}"
        )
    if isinstance(n, ast.NumberLiteral):
        return go_float(n.value)
    if isinstance(n, ast.StringLiteral):
        return go_quote(n.value)
    if isinstance(n, ast.ParenExpr):
        return f"({to_string(n.expr)})"
    if isinstance(n, ast.UnaryExpr):
        return f"{n.op}{to_string(n.expr)}"
    if isinstance(n, ast.BinaryExpr):
        matching = ""
        m = n.matching
        if m is not None and (m.labels or m.on):
            matching = f" {'on' if m.on else 'ignoring'} ({', '.join(m.labels)})"
            if m.card in ("many-to-one", "one-to-many"):
                side = "left" if m.card == "many-to-one" else "right"
                matching += f" group_{side} ({', '.join(m.include)})"
        flag = " bool" if n.return_bool else ""
        return f"{to_string(n.lhs)} {n.op}{flag}{matching} {to_string(n.rhs)}"
    if isinstance(n, ast.AggregateExpr):
        head = n.op
        if n.without:
            head += f" without ({', '.join(n.grouping)}) "
        elif n.grouping:
            head += f" by ({', '.join(n.grouping)}) "
        param = f"{to_string(n.param)}, " if n.param is not None else ""
        return f"{head}({param}{to_string(n.expr)})"
    assert isinstance(n, ast.Call)
    return f"{n.func.name}({', '.join(to_string(a) for a in n.args)})"
