"""The expression language of virtual sensors: a tokenizer and a recursive-descent parser.

Grammar (``^`` binds tightest and is right-associative; unary minus binds
looser than ``^``, so ``-2^2`` is -4)::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("-" | "+") unary | power
    power  := atom ("^" unary)?
    atom   := NUMBER [UNIT | "[" UNIT-TEXT "]"]      1.5 kW, 3 [W/m^2]
            | STRING                                  "/hall/row0/rack0/node0/power"
            | NAME "(" expr ("," expr)* ")"           abs min max avg sum delta rate integral
            | "(" expr ")"

Sensor names are always quoted (``"..."`` or ``'...'``); inside the quotes
``*`` matches one hierarchy level and ``**`` any number of levels, allowed only
as an argument of ``min max avg sum``. No ``eval``: the parser builds a tree of
the node classes below, and every error names the position it found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from services.common import names
from services.common.errors import KelvinError, SensorNameError

AGGREGATE_FUNCS = ("min", "max", "avg", "sum")
"""Element-wise over their arguments; wildcards expand into arguments."""
SERIES_FUNCS = ("delta", "rate", "integral")
"""Need the previous grid point: one value per grid step."""
FUNCS = ("abs", *AGGREGATE_FUNCS, *SERIES_FUNCS)


class ExpressionError(KelvinError, ValueError):
    """An expression that cannot be parsed or checked; ``position`` is 0-based."""

    def __init__(self, message: str, text: str, position: int) -> None:
        self.message, self.text, self.position = message, text, position
        pointer = f"\n  {text}\n  {' ' * position}^" if "\n" not in text else ""
        super().__init__(f"{message} at position {position + 1}{pointer}")


@dataclass(frozen=True, slots=True)
class Number:
    value: float
    unit: str | None
    pos: int


@dataclass(frozen=True, slots=True)
class Ref:
    """A sensor reference; ``is_pattern`` when it holds a wildcard."""

    name: str
    pos: int

    @property
    def is_pattern(self) -> bool:
        return "*" in self.name


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    operand: Node
    pos: int


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: Node
    right: Node
    pos: int


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Node, ...]
    pos: int


Node = Union[Number, Ref, Unary, Binary, Call]  # noqa: UP007 (a runtime alias for isinstance)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>"[^"]*"|'[^']*')
  | (?P<name>[A-Za-z_°µΩ%][A-Za-z0-9_°µΩ%]*)
  | (?P<op>[-+*/^(),\[\]])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            ch = text[i]
            if ch in "\"'":
                raise ExpressionError(f"unterminated string (missing closing {ch})", text, i)
            raise ExpressionError(f"unexpected character {ch!r}", text, i)
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(Token(kind, m.group(), i))
        i = m.end()
    out.append(Token("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str, tok: Token | None = None) -> ExpressionError:
        return ExpressionError(message, self.text, (tok or self.tok).pos)

    def take(self, kind: str, text: str | None = None) -> Token | None:
        t = self.tok
        if t.kind == kind and (text is None or t.text == text):
            self.i += 1
            return t
        return None

    def expect(self, text: str, what: str) -> Token:
        t = self.take("op", text)
        if t is None:
            found = "the end" if self.tok.kind == "end" else repr(self.tok.text)
            raise self.error(f"expected {what}, found {found}")
        return t

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.error('empty expression; expected e.g. "/a/power" + "/b/power"')
        node = self.expr()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.text!r} after a complete expression")
        return node

    def expr(self) -> Node:
        node = self.term()
        while (t := self.take("op", "+") or self.take("op", "-")) is not None:
            node = Binary(t.text, node, self.term(), t.pos)
        return node

    def term(self) -> Node:
        node = self.unary()
        while (t := self.take("op", "*") or self.take("op", "/")) is not None:
            node = Binary(t.text, node, self.unary(), t.pos)
        return node

    def unary(self) -> Node:
        t = self.take("op", "-") or self.take("op", "+")
        if t is not None:
            operand = self.unary()
            return operand if t.text == "+" else Unary("-", operand, t.pos)
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        t = self.take("op", "^")
        if t is not None:
            return Binary("^", base, self.unary(), t.pos)
        return base

    def atom(self) -> Node:
        t = self.tok
        if t.kind == "number":
            self.i += 1
            return Number(float(t.text), self.unit(), t.pos)
        if t.kind == "string":
            self.i += 1
            return self.ref(t)
        if t.kind == "name":
            self.i += 1
            return self.call(t)
        if self.take("op", "("):
            inner = self.expr()
            self.expect(")", "')' to close the '(' at position " + str(t.pos + 1))
            return inner
        if t.kind == "end":
            raise self.error("expression ends early; expected a number, a quoted sensor or '('")
        if t.text == "/":
            raise self.error("unexpected '/'; sensor names must be quoted, e.g. \"/a/power\"")
        raise self.error(f"unexpected {t.text!r}; expected a number, a quoted sensor or '('")

    def unit(self) -> str | None:
        """The unit written after a number: one word (``kW``) or bracketed text (``[W/m^2]``)."""
        t = self.tok
        if t.kind == "name" and self.tokens[self.i + 1].text != "(":
            self.i += 1
            return t.text
        if t.kind == "op" and t.text == "[":
            close = self.text.find("]", t.pos)
            if close < 0:
                raise self.error("unit in '[' has no closing ']'")
            unit = self.text[t.pos + 1 : close].strip()
            if not unit:
                raise self.error("empty unit in '[]'")
            while self.tok.pos < close:
                self.i += 1
            self.expect("]", "']'")
            return unit
        return None

    def ref(self, t: Token) -> Ref:
        name = t.text[1:-1]
        try:
            names.validate(name.replace("*", "x"))
        except SensorNameError as exc:
            raise ExpressionError(f"bad sensor name: {exc}", self.text, t.pos) from None
        return Ref(name, t.pos)

    def call(self, t: Token) -> Call:
        func = t.text.lower()
        if func not in FUNCS:
            raise self.error(
                f"unknown function {t.text!r}; expected one of {', '.join(FUNCS)}"
                + (" (sensor names must be quoted)" if self.tok.text != "(" else ""),
                t,
            )
        self.expect("(", f"'(' after {func}")
        args = [self.expr()]
        while self.take("op", ","):
            args.append(self.expr())
        self.expect(")", f"')' to close {func}(")
        if func not in AGGREGATE_FUNCS and len(args) != 1:
            raise self.error(f"{func}() takes exactly one argument, got {len(args)}", t)
        return Call(func, tuple(args), t.pos)


def parse(text: str) -> Node:
    """Parse an expression into a tree; raises ExpressionError with the position."""
    if len(text) > 10_000:
        raise ExpressionError("expression longer than 10000 characters", text[:40], 0)
    node = _Parser(text).parse()
    _check_patterns(node, text, inside_aggregate=False)
    return node


def _check_patterns(node: Node, text: str, inside_aggregate: bool) -> None:
    if isinstance(node, Ref):
        if node.is_pattern and not inside_aggregate:
            raise ExpressionError(
                f"wildcard {node.name!r} gives several sensors; use it inside "
                f"{', '.join(AGGREGATE_FUNCS)}()",
                text,
                node.pos,
            )
    elif isinstance(node, Unary):
        _check_patterns(node.operand, text, False)
    elif isinstance(node, Binary):
        _check_patterns(node.left, text, False)
        _check_patterns(node.right, text, False)
    elif isinstance(node, Call):
        for a in node.args:
            direct = node.func in AGGREGATE_FUNCS and isinstance(a, Ref)
            _check_patterns(a, text, direct)


def refs(node: Node) -> list[Ref]:
    """Every sensor reference in the tree, in order of appearance."""
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Unary):
        return refs(node.operand)
    if isinstance(node, Binary):
        return refs(node.left) + refs(node.right)
    if isinstance(node, Call):
        return [r for a in node.args for r in refs(a)]
    return []


def numbers(node: Node) -> list[Number]:
    """Every number literal in the tree."""
    if isinstance(node, Number):
        return [node]
    if isinstance(node, Unary):
        return numbers(node.operand)
    if isinstance(node, Binary):
        return numbers(node.left) + numbers(node.right)
    if isinstance(node, Call):
        return [x for a in node.args for x in numbers(a)]
    return []


def lead_steps(node: Node) -> int:
    """How many grid steps before the first point the tree needs (nested delta/rate/integral)."""
    if isinstance(node, Unary):
        return lead_steps(node.operand)
    if isinstance(node, Binary):
        return max(lead_steps(node.left), lead_steps(node.right))
    if isinstance(node, Call):
        inner = max(lead_steps(a) for a in node.args)
        return inner + (1 if node.func in SERIES_FUNCS else 0)
    return 0
