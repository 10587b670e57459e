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

The tree is at most :data:`MAX_DEPTH` levels deep (parentheses, calls, signs and
``^`` each add one; a long run of ``+`` or of ``*`` is built in halves, so a sum of
many sensors stays shallow): deeper input is an :class:`ExpressionTooDeep` at the
position where it went too deep, never a RecursionError in whatever walks the tree.
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


MAX_DEPTH = 100
"""Deepest tree an expression may make (real ones nest a handful of levels)."""


class ExpressionError(KelvinError, ValueError):
    """An expression that cannot be parsed or checked; ``position`` is 0-based."""

    def __init__(self, message: str, text: str, position: int) -> None:
        self.message, self.text, self.position = message, text, position
        pointer = (
            f"\n  {text}\n  {' ' * position}^" if "\n" not in text and len(text) <= 200 else ""
        )
        super().__init__(f"{message} at position {position + 1}{pointer}")


class ExpressionTooDeep(ExpressionError):
    """An expression nested deeper than :data:`MAX_DEPTH`."""

    reason = "too_deep"

    def __init__(self, text: str, position: int) -> None:
        super().__init__(
            f"expression nested deeper than {MAX_DEPTH} levels (parentheses, function calls, "
            "signs and '^' each add one)",
            text,
            position,
        )


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
        self.depth = 0

    def deeper(self, tok: Token) -> None:
        """One level down (undone by :meth:`up`); too deep is an error here, before recursing."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionTooDeep(self.text, tok.pos)

    def up(self) -> None:
        self.depth -= 1

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
        operands, ops = [self.term()], []
        while (t := self.take("op", "+") or self.take("op", "-")) is not None:
            ops.append(t)
            operands.append(self.term())
        return _chain(operands, ops, "+")

    def term(self) -> Node:
        operands, ops = [self.unary()], []
        while (t := self.take("op", "*") or self.take("op", "/")) is not None:
            ops.append(t)
            operands.append(self.unary())
        return _chain(operands, ops, "*")

    def unary(self) -> Node:
        t = self.take("op", "-") or self.take("op", "+")
        if t is not None:
            self.deeper(t)
            try:
                operand = self.unary()
            finally:
                self.up()
            return operand if t.text == "+" else Unary("-", operand, t.pos)
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        t = self.take("op", "^")
        if t is not None:
            self.deeper(t)
            try:
                return Binary("^", base, self.unary(), t.pos)
            finally:
                self.up()
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
            self.deeper(t)
            try:
                inner = self.expr()
            finally:
                self.up()
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
        self.deeper(t)
        try:
            args = [self.expr()]
            while self.take("op", ","):
                args.append(self.expr())
        finally:
            self.up()
        self.expect(")", f"')' to close {func}(")
        if func not in AGGREGATE_FUNCS and len(args) != 1:
            raise self.error(f"{func}() takes exactly one argument, got {len(args)}", t)
        return Call(func, tuple(args), t.pos)


def _chain(operands: list[Node], ops: list[Token], commutative: str) -> Node:
    """``a op b op c ...`` left to right; a run of ``commutative`` (``+`` or ``*``) is
    built balanced (its depth is log2 of its length, not its length)."""
    node = operands[0]
    i = 0
    while i < len(ops):
        j = i
        while j < len(ops) and ops[j].text == commutative:
            j += 1
        if j > i:  # ops[i:j] are all the commutative one: combine node, operands[i+1..j]
            node = _balanced([node, *operands[i + 1 : j + 1]], ops[i:j])
            i = j
        else:
            node = Binary(ops[i].text, node, operands[i + 1], ops[i].pos)
            i += 1
    return node


LEFT_TO_RIGHT_RUN = 32
"""Runs up to this long are combined strictly left to right (the same rounding as
written); longer ones (sums of many sensors) in halves."""


def _balanced(operands: list[Node], ops: list[Token]) -> Node:
    if len(operands) <= LEFT_TO_RIGHT_RUN:
        node = operands[0]
        for op, right in zip(ops, operands[1:], strict=True):
            node = Binary(op.text, node, right, op.pos)
        return node
    mid = (len(operands) + 1) // 2
    left = _balanced(operands[:mid], ops[: mid - 1])
    right = _balanced(operands[mid:], ops[mid:])
    return Binary(ops[mid - 1].text, left, right, ops[mid - 1].pos)


def _check_depth(root: Node, text: str) -> None:
    """Chains of ``-`` or ``/`` deepen the tree without recursion in the parser."""
    stack: list[tuple[Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExpressionTooDeep(text, node.pos)
        if isinstance(node, Unary):
            stack.append((node.operand, depth + 1))
        elif isinstance(node, Binary):
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, Call):
            stack += [(a, depth + 1) for a in node.args]


def parse(text: str) -> Node:
    """Parse an expression into a tree; raises ExpressionError with the position."""
    if len(text) > 10_000:
        raise ExpressionError("expression longer than 10000 characters", text[:40], 0)
    node = _Parser(text).parse()
    _check_depth(node, text)
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
