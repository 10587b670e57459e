"""The PromQL subset Kelvin answers: selectors, range functions, aggregations, scalar arithmetic.

Supported::

    power{l2="row0", sensor=~"/hall/.*"}          instant vector selector (= != =~ !~)
    inlet_temp[5m]                                range selector (instant queries, functions)
    rate(x[1m])  increase  irate  delta  idelta    counter / gauge changes
    avg_over_time(x[5m])  min_ max_ sum_ count_ last_over_time
    sum by (l2) (x)  avg  min  max  count  (by / without before or after)
    abs(x)  x * 1000  1 - x  (x)  -x  and plain numbers (``1+1``)

Anything else is a ``bad_data`` error naming the position, as Prometheus answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

from services.common.errors import KelvinError

RANGE_FUNCS = (
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
)
INSTANT_FUNCS = ("abs",)
AGGREGATIONS = ("sum", "avg", "min", "max", "count")
_DURATION_UNITS = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class PromQLError(KelvinError, ValueError):
    """A query outside the supported subset, or malformed."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str

    def matches(self, got: str) -> bool:
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        hit = re.fullmatch(self.value, got) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]
    range_s: float | None = None


@dataclass(frozen=True)
class NumberLit:
    value: float


@dataclass(frozen=True)
class Func:
    name: str
    arg: Expr


@dataclass(frozen=True)
class Aggregate:
    op: str
    arg: Expr
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg:
    arg: Expr


Expr = Union[Selector, NumberLit, Func, Aggregate, BinOp, Neg]  # noqa: UP007 (runtime alias)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<duration>\d+(?:ms|s|m|h|d|w|y)(?:\d+(?:ms|s|m|h|d|w|y))*(?![A-Za-z0-9_]))
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|0x[0-9a-fA-F]+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|[-+*/^(){}\[\],=])
    """,
    re.VERBOSE,
)


@dataclass
class _Tok:
    kind: str
    text: str
    pos: int


@dataclass
class _Parser:
    text: str
    toks: list[_Tok] = field(default_factory=list)
    i: int = 0

    def __post_init__(self) -> None:
        at = 0
        while at < len(self.text):
            m = _TOKEN.match(self.text, at)
            if m is None:
                raise self.err(f'unexpected character: "{self.text[at]}"', at)
            if m.lastgroup != "ws":
                self.toks.append(_Tok(m.lastgroup or "", m.group(), at))
            at = m.end()
        self.toks.append(_Tok("end", "", len(self.text)))

    def err(self, msg: str, pos: int | None = None) -> PromQLError:
        p = self.tok.pos if pos is None else pos
        return PromQLError(f"1:{p + 1}: parse error: {msg}")

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self, text: str) -> bool:
        if self.tok.kind in ("op", "ident") and self.tok.text == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            got = "end of input" if self.tok.kind == "end" else f'"{self.tok.text}"'
            raise self.err(f'unexpected {got}, expected "{text}"')

    def parse(self) -> Expr:
        if self.tok.kind == "end":
            raise self.err("no expression found in input")
        e = self.expr()
        if self.tok.kind != "end":
            raise self.err(f'unexpected "{self.tok.text}"')
        return e

    def expr(self) -> Expr:
        e = self.term()
        while self.tok.text in ("+", "-") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            e = BinOp(op, e, self.term())
        return e

    def term(self) -> Expr:
        e = self.unary()
        while self.tok.text in ("*", "/") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            e = BinOp(op, e, self.unary())
        return e

    def unary(self) -> Expr:
        if self.tok.kind == "op" and self.tok.text in "-+":
            neg = self.tok.text == "-"
            self.i += 1
            inner = self.unary()
            return Neg(inner) if neg else inner
        return self.primary()

    def primary(self) -> Expr:
        t = self.tok
        if t.kind == "number":
            self.i += 1
            return NumberLit(float(int(t.text, 16)) if t.text.startswith("0x") else float(t.text))
        if self.take("("):
            e = self.expr()
            self.expect(")")
            return e
        if t.kind == "ident" and t.text.lower() in ("inf", "nan"):
            self.i += 1
            return NumberLit(float(t.text))
        if t.kind == "ident" and t.text in AGGREGATIONS:
            return self.aggregation()
        if t.kind == "ident" and self.toks[self.i + 1].text == "(":
            return self.function()
        if t.kind == "ident" or (t.kind == "op" and t.text == "{"):
            return self.selector()
        got = "end of input" if t.kind == "end" else f'"{t.text}"'
        raise self.err(f"unexpected {got}")

    def labels(self) -> tuple[str, ...]:
        self.expect("(")
        out: list[str] = []
        while not self.take(")"):
            if self.tok.kind != "ident":
                raise self.err(f'unexpected "{self.tok.text}" in grouping opts, expected label')
            out.append(self.tok.text)
            self.i += 1
            if not self.take(","):
                self.expect(")")
                break
        return tuple(out)

    def aggregation(self) -> Expr:
        op = self.tok.text
        self.i += 1
        by = without = None
        if self.take("by"):
            by = self.labels()
        elif self.take("without"):
            without = self.labels()
        self.expect("(")
        arg = self.expr()
        self.expect(")")
        if by is None and without is None:
            if self.take("by"):
                by = self.labels()
            elif self.take("without"):
                without = self.labels()
        return Aggregate(op, arg, by, without)

    def function(self) -> Expr:
        t = self.tok
        if t.text not in RANGE_FUNCS and t.text not in INSTANT_FUNCS:
            raise self.err(f'unknown function with name "{t.text}"')
        self.i += 2  # name and "("
        arg = self.expr()
        self.expect(")")
        if t.text in RANGE_FUNCS and not (isinstance(arg, Selector) and arg.range_s):
            raise self.err(
                f'expected type range vector in call to function "{t.text}", got instant vector',
                t.pos,
            )
        return Func(t.text, arg)

    def selector(self) -> Selector:
        matchers: list[Matcher] = []
        if self.tok.kind == "ident":
            matchers.append(Matcher("__name__", "=", self.tok.text))
            self.i += 1
        if self.take("{"):
            while not self.take("}"):
                if self.tok.kind != "ident":
                    raise self.err(
                        f'unexpected "{self.tok.text}" in label matching, expected label'
                    )
                label = self.tok.text
                self.i += 1
                if self.tok.kind != "op" or self.tok.text not in ("=", "!=", "=~", "!~"):
                    raise self.err(f'unexpected "{self.tok.text}" in label matching, expected "="')
                op = self.tok.text
                self.i += 1
                if self.tok.kind != "string":
                    raise self.err(
                        f'unexpected "{self.tok.text}" in label matching, expected string'
                    )
                value = _unquote(self.tok.text)
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise self.err(f"invalid regular expression {value!r}: {exc}") from None
                matchers.append(Matcher(label, op, value))
                self.i += 1
                if not self.take(","):
                    self.expect("}")
                    break
        if not any(m.op in ("=", "=~") and not m.matches("") for m in matchers):
            raise self.err("vector selector must contain at least one non-empty matcher")
        range_s = None
        if self.take("["):
            if self.tok.kind != "duration":
                raise self.err(f'unexpected "{self.tok.text}" in range, expected duration')
            range_s = parse_duration_s(self.tok.text)
            self.i += 1
            self.expect("]")
        return Selector(tuple(matchers), range_s)


def _unquote(text: str) -> str:
    body = text[1:-1]
    if text[0] == "`":
        return body
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def parse_duration_s(text: str) -> float:
    """``5m``, ``1h30m``, ``250ms`` -> seconds."""
    total = 0.0
    for num, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text):
        total += int(num) * _DURATION_UNITS[unit]
    return total


def parse(text: str) -> Expr:
    if len(text) > 20_000:
        raise PromQLError("query longer than 20000 characters")
    return _Parser(text).parse()
