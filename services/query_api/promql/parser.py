"""PromQL text -> syntax tree, with the checks Prometheus makes before evaluating.

Recursive descent over the token list (precedence climbing for binary operators,
``or`` < ``and unless`` < comparisons < ``+ -`` < ``* / % atan2`` < ``^``;
unary minus binds like ``*``; ``[...]``, ``offset`` and ``@`` bind tightest),
then the type checks of Prometheus' ``checkAST``. Nesting is limited to
:data:`MAX_DEPTH` levels (parentheses, calls, operators), so a deep query is a
400 with its position, never a RecursionError.
"""

from __future__ import annotations

import math
import re

from services.query_api.promql import ast
from services.query_api.promql.ast import ValueType as T
from services.query_api.promql.functions_table import FUNCTIONS
from services.query_api.promql.lexer import Lexer, LexError, Token
from services.query_api.promql.regex import Matcher, RegexError

MAX_DEPTH = 128
"""Deepest nesting a query may have (Prometheus has no limit; Python's stack has one)."""
MAX_QUERY_CHARS = 20_000

_BINARY_PREC = {
    "LOR": 1, "LAND": 2, "LUNLESS": 2,
    "EQLC": 3, "NEQ": 3, "LTE": 3, "LSS": 3, "GTE": 3, "GTR": 3,
    "ADD": 4, "SUB": 4, "MUL": 5, "DIV": 5, "MOD": 5, "ATAN2": 5, "POW": 6,
}  # fmt: skip
_METRIC_WORDS = frozenset(
    {"IDENTIFIER", "METRIC_IDENTIFIER", "AGG", "LAND", "LOR", "LUNLESS", "BY", "WITHOUT",
     "OFFSET", "START", "END"}
)  # fmt: skip
_LABEL_WORDS = _METRIC_WORDS | {"BOOL", "GROUP_LEFT", "GROUP_RIGHT", "IGNORING", "ON", "ATAN2"}
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def error_at(text: str, pos: int, message: str) -> ast.PromQLError:
    """``line:col: parse error: message``, positions counted in bytes as Go does."""
    head = text[:pos].encode("utf-8", "surrogatepass")
    line = head.count(b"\n") + 1
    col = len(head) - (head.rfind(b"\n") + 1) + 1 if b"\n" in head else len(head) + 1
    return ast.PromQLError(f"{line}:{col}: parse error: {message}")


def parse_duration_ns(text: str) -> int:
    """A PromQL duration (``1h30m``, ``250ms``; units in falling order) in ns."""
    m = _DURATION.match(text)
    if not text or m is None:
        raise ValueError(f'not a valid duration string: "{text}"')
    ms = sum(int(g) * unit for g, unit in zip(m.groups(), _UNIT_MS, strict=True) if g)
    if ms * 1_000_000 >= 2**63:
        raise ValueError(f'not a valid duration string: "{text}"')
    return ms * 1_000_000


def parse_number(text: str) -> float:
    """Go's ``strconv.ParseInt(s, 0, 64)``, falling back to ``ParseFloat``."""
    t = text.lower()
    try:
        if t.startswith("0x"):
            n = int(t[2:], 16)
        elif len(t) > 1 and t.startswith("0") and t.isdigit():
            n = int(t[1:], 8)
        else:
            n = int(t, 10)
        if -(2**63) <= n < 2**63:
            return float(n)
    except ValueError:
        pass
    if t in ("inf", "+inf", "infinity"):
        return math.inf
    if t == "nan":
        return math.nan
    return float(t)


def unquote(text: str) -> str:
    """A Go string literal's value (``"..."``, ``'...'`` or raw)."""
    quote, body = text[0], text[1:-1]
    if quote == "`":
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1] if i + 1 < len(body) else ""
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e == quote:
            out.append(quote)
            i += 2
        elif e in "01234567" and e:
            digits = body[i + 1 : i + 4]
            if len(digits) < 3 or not all(d in "01234567" for d in digits):
                raise ValueError(f"illegal character in escape sequence: {digits!r}")
            value = int(digits, 8)
            if value > 255:
                raise ValueError("escape sequence is an invalid Unicode code point")
            out.append(chr(value))
            i += 4
        elif e in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2 : i + 2 + n]
            if len(digits) < n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"illegal character in escape sequence: {digits!r}")
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value < 0xE000:
                raise ValueError("escape sequence is an invalid Unicode code point")
            out.append(chr(value))
            i += 2 + n
        else:
            shown = f"U+{ord(e):04X} '{e}'" if e else "end of input"
            raise ValueError(f"unknown escape sequence {shown}")
    return "".join(out)


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self.toks = Lexer(text).tokens()
        except LexError as exc:
            raise error_at(text, exc.pos, str(exc)) from None
        self.i = 0
        self.depth = 0

    # ------------------------------------------------------------------ helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def err(self, message: str, pos: int | None = None) -> ast.PromQLError:
        return error_at(self.text, self.tok.pos if pos is None else pos, message)

    def unexpected(self, context: str = "", expected: str = "") -> ast.PromQLError:
        msg = f"unexpected {self.tok.desc()}"
        if context:
            msg += f" in {context}"
        if expected:
            msg += f", expected {expected}"
        return self.err(msg)

    def take(self, kind: str) -> Token | None:
        t = self.tok
        if t.kind == kind:
            self.i += 1
            return t
        return None

    def expect(self, kind: str, context: str, expected: str) -> Token:
        t = self.take(kind)
        if t is None:
            raise self.unexpected(context, expected)
        return t

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.err(f"the query nests deeper than {MAX_DEPTH} levels; simplify it")

    # ------------------------------------------------------------------ grammar
    def parse(self) -> ast.Expr:
        if self.tok.kind == "EOF":
            raise self.err("no expression found in input")
        e = self.expr(1)
        if self.tok.kind != "EOF":
            raise self.unexpected()
        return e

    def expr(self, min_prec: int) -> ast.Expr:
        self.enter()
        left = self.unary()
        while True:
            op = self.tok
            prec = _BINARY_PREC.get(op.kind)
            if op.kind == "AGG" or prec is None or prec < min_prec:
                break
            self.i += 1
            matching, return_bool = self.bin_modifiers()
            right = self.expr(prec if op.kind == "POW" else prec + 1)
            left = ast.BinaryExpr(
                left.start, right.end, op.word, left, right, return_bool, matching
            )
        self.depth -= 1
        return left

    def bin_modifiers(self) -> tuple[ast.VectorMatching, bool]:
        m = ast.VectorMatching()
        return_bool = self.take("BOOL") is not None
        on = self.take("ON") or self.take("IGNORING")
        if on is not None:
            m.on = on.kind == "ON"
            m.labels = self.grouping_labels()
            side = self.take("GROUP_LEFT") or self.take("GROUP_RIGHT")
            if side is not None:
                m.card = "many-to-one" if side.kind == "GROUP_LEFT" else "one-to-many"
                if self.tok.kind == "LEFT_PAREN":
                    m.include = self.grouping_labels()
        return m, return_bool

    def grouping_labels(self) -> list[str]:
        self.expect("LEFT_PAREN", "grouping opts", '"("')
        out: list[str] = []
        while self.take("RIGHT_PAREN") is None:
            t = self.tok
            if t.kind not in _LABEL_WORDS or not _LABEL_NAME.fullmatch(t.text):
                raise self.unexpected("grouping opts", "label")
            out.append(t.text)
            self.i += 1
            if self.take("COMMA") is None and self.tok.kind != "RIGHT_PAREN":
                raise self.unexpected("grouping opts", '"," or ")"')
        return out

    def unary(self) -> ast.Expr:
        t = self.tok
        if t.kind not in ("ADD", "SUB"):
            return self.postfix(self.primary())
        self.i += 1
        self.enter()
        inner = self.expr(_BINARY_PREC["POW"])
        self.depth -= 1
        if isinstance(inner, ast.NumberLiteral):
            inner.value = -inner.value if t.kind == "SUB" else inner.value
            inner.start = t.pos
            return inner
        return ast.UnaryExpr(t.pos, inner.end, t.text, inner)

    def postfix(self, e: ast.Expr) -> ast.Expr:
        while True:
            t = self.tok
            if t.kind == "LEFT_BRACKET":
                e = self.bracket(e)
            elif t.kind == "OFFSET":
                self.i += 1
                sign = -1 if self.take("SUB") else 1
                d = self.tok
                if d.kind != "DURATION":
                    raise self.unexpected("offset", "duration")
                self.i += 1
                self.set_offset(e, sign * self.duration(d), d.pos + len(d.text))
            elif t.kind == "AT":
                self.i += 1
                self.set_at(e)
            else:
                return e

    def duration(self, t: Token) -> int:
        try:
            ns = parse_duration_ns(t.text)
        except ValueError as exc:
            raise self.err(str(exc), t.pos) from None
        if ns == 0:
            raise self.err("duration must be greater than 0", t.pos)
        return ns

    def bracket(self, e: ast.Expr) -> ast.Expr:
        open_ = self.tok
        self.i += 1
        d = self.tok
        if d.kind != "DURATION":
            raise self.unexpected("subquery selector", "duration")
        self.i += 1
        rng = self.duration(d)
        if self.take("COLON") is not None:
            step = 0
            s = self.take("DURATION")
            if s is not None:
                step = self.duration(s)
            close = self.expect("RIGHT_BRACKET", "subquery selector", '"]"')
            return ast.SubqueryExpr(e.start, close.pos + 1, e, rng, step)
        close = self.expect("RIGHT_BRACKET", "subquery or range", '":" or "]"')
        if not isinstance(e, ast.VectorSelector):
            raise self.err("ranges only allowed for vector selectors", open_.pos)
        if e.offset_ns:
            raise self.err("no offset modifiers allowed before range", open_.pos)
        if e.at_ns is not None or e.at_kw is not None:
            raise self.err("no @ modifiers allowed before range", open_.pos)
        return ast.MatrixSelector(e.start, close.pos + 1, e, rng)

    def _modifiable(self, e: ast.Expr, what: str) -> ast.VectorSelector | ast.SubqueryExpr:
        if isinstance(e, ast.MatrixSelector):
            return e.vs
        if isinstance(e, ast.VectorSelector | ast.SubqueryExpr):
            return e
        raise self.err(
            f"{what} modifier must be preceded by an instant vector selector or range vector "
            "selector or a subquery",
            e.start,
        )

    def set_offset(self, e: ast.Expr, offset_ns: int, end: int) -> None:
        target = self._modifiable(e, "offset")
        if target.offset_ns:
            raise self.err("offset may not be set multiple times", e.start)
        target.offset_ns = offset_ns
        e.end = end

    def set_at(self, e: ast.Expr) -> None:
        target = self._modifiable(e, "@")
        if target.at_ns is not None or target.at_kw is not None:
            raise self.err("@ <timestamp> may not be set multiple times", e.start)
        t = self.tok
        if t.kind in ("START", "END"):
            self.i += 1
            self.expect("LEFT_PAREN", "@", '"("')
            close = self.expect("RIGHT_PAREN", "@", '")"')
            target.at_kw = t.word
            e.end = close.pos + 1
            return
        sign = 1.0
        if t.kind in ("ADD", "SUB"):
            sign = -1.0 if t.kind == "SUB" else 1.0
            self.i += 1
        n = self.tok
        if n.kind != "NUMBER":
            raise self.unexpected("@", "timestamp")
        self.i += 1
        value = sign * parse_number(n.text)
        if not math.isfinite(value) or abs(value) >= 2**63 / 1000:
            raise self.err(f"timestamp out of bounds for @ modifier: {value:f}", e.start)
        target.at_ns = _seconds_to_ms(value) * 1_000_000
        e.end = n.pos + len(n.text)

    def primary(self) -> ast.Expr:
        t = self.tok
        k = t.kind
        if k == "NUMBER":
            self.i += 1
            try:
                value = parse_number(t.text)
            except ValueError:
                raise self.err(
                    f'error parsing number: strconv.ParseFloat: parsing "{t.text}"'
                ) from None
            return ast.NumberLiteral(t.pos, t.pos + len(t.text), value)
        if k == "STRING":
            self.i += 1
            return ast.StringLiteral(t.pos, t.pos + len(t.text), self.string(t))
        if k == "LEFT_PAREN":
            self.i += 1
            inner = self.expr(1)
            close = self.expect("RIGHT_PAREN", "paren expression", '")"')
            return ast.ParenExpr(t.pos, close.pos + 1, inner)
        if k == "LEFT_BRACE":
            return self.selector(None)
        nxt = self.toks[self.i + 1].kind
        if k == "AGG" and nxt in ("LEFT_PAREN", "BY", "WITHOUT"):
            return self.aggregate()
        if k == "IDENTIFIER" and nxt == "LEFT_PAREN":
            return self.call()
        if k in _METRIC_WORDS:
            self.i += 1
            return self.selector(t)
        if k == "EOF":
            raise self.unexpected()
        raise self.unexpected()

    def string(self, t: Token) -> str:
        try:
            return unquote(t.text)
        except ValueError as exc:
            raise self.err(str(exc), t.pos) from None

    def args(self, context: str) -> tuple[list[ast.Expr], int]:
        self.expect("LEFT_PAREN", context, '"("')
        out: list[ast.Expr] = []
        close = self.take("RIGHT_PAREN")
        while close is None:
            out.append(self.expr(1))
            comma = self.take("COMMA")
            if comma is not None and self.tok.kind == "RIGHT_PAREN":
                raise self.err("trailing commas not allowed in function call args", comma.pos)
            if comma is None:
                close = self.expect("RIGHT_PAREN", context, '"," or ")"')
        return out, close.pos + 1

    def call(self) -> ast.Expr:
        name = self.tok
        self.i += 1
        fn = FUNCTIONS.get(name.text)
        if fn is None:
            raise self.err(f'unknown function with name "{name.text}"', name.pos)
        self.enter()
        args, end = self.args("function call")
        self.depth -= 1
        return ast.Call(name.pos, end, fn, args)

    def aggregate(self) -> ast.Expr:
        op = self.tok
        self.i += 1
        grouping: list[str] | None = None
        without = False
        mod = self.take("BY") or self.take("WITHOUT")
        if mod is not None:
            without = mod.kind == "WITHOUT"
            grouping = self.grouping_labels()
        self.enter()
        args, end = self.args("aggregation")
        self.depth -= 1
        if grouping is None:
            mod = self.take("BY") or self.take("WITHOUT")
            if mod is not None:
                without = mod.kind == "WITHOUT"
                grouping = self.grouping_labels()
                end = self.toks[self.i - 1].pos + 1
        name = op.word
        if not args:
            raise self.err("no arguments for aggregate expression provided", op.pos)
        want = 2 if name in ast.PARAM_AGGREGATORS else 1
        if len(args) != want:
            raise self.err(
                "wrong number of arguments for aggregate expression provided, "
                f"expected {want}, got {len(args)}",
                op.pos,
            )
        param = args[0] if want == 2 else None
        return ast.AggregateExpr(op.pos, end, name, args[-1], param, grouping or [], without)

    def selector(self, name_tok: Token | None) -> ast.VectorSelector:
        matchers: list[Matcher] = []
        start = name_tok.pos if name_tok else self.tok.pos
        end = name_tok.pos + len(name_tok.text) if name_tok else start
        if self.tok.kind == "LEFT_BRACE":
            self.i += 1
            while True:
                close = self.take("RIGHT_BRACE")
                if close is not None:
                    end = close.pos + 1
                    break
                label = self.tok
                if label.kind != "IDENTIFIER":
                    raise self.unexpected("label matching", 'identifier or "}"')
                self.i += 1
                op = self.tok
                if op.kind not in ("EQL", "NEQ", "EQL_REGEX", "NEQ_REGEX"):
                    raise self.unexpected("label matching", "label matching operator")
                self.i += 1
                value = self.tok
                if value.kind != "STRING":
                    raise self.unexpected("label matching", "string")
                self.i += 1
                try:
                    matchers.append(Matcher.make(label.text, op.text, self.string(value)))
                except RegexError as exc:
                    raise self.err(str(exc), label.pos) from None
                if self.take("COMMA") is None and self.tok.kind != "RIGHT_BRACE":
                    raise self.unexpected("label matching", '"," or "}"')
        name = name_tok.text if name_tok else ""
        if name:
            matchers.append(Matcher.make("__name__", "=", name))
        return ast.VectorSelector(start, end, name, matchers)


def _seconds_to_ms(value: float) -> int:
    """Prometheus' ``timestamp.FromFloatSeconds``: round(value * 1000) as Go rounds."""
    ms = math.floor(abs(value) * 1000 + 0.5)
    return ms if value >= 0 else -ms


# ---------------------------------------------------------------------- type checks
class Checker:
    """Prometheus' checkAST: value types of operands and arguments, matching rules."""

    def __init__(self, text: str) -> None:
        self.text = text

    def err(self, node: ast.Node, message: str) -> ast.PromQLError:
        return error_at(self.text, node.start, message)

    def expect(self, node: ast.Expr, want: T, context: str) -> None:
        got = self.check(node)
        if got != want:
            raise self.err(
                node, f"expected type {want.documented} in {context}, got {got.documented}"
            )

    def check(self, n: ast.Expr) -> T:
        if isinstance(n, ast.AggregateExpr):
            self.expect(n.expr, T.VECTOR, "aggregation expression")
            if n.param is not None:
                want = T.STRING if n.op == "count_values" else T.SCALAR
                self.expect(n.param, want, "aggregation parameter")
        elif isinstance(n, ast.BinaryExpr):
            self.binary(n)
        elif isinstance(n, ast.Call):
            self.call(n)
        elif isinstance(n, ast.ParenExpr):
            self.check(n.expr)
        elif isinstance(n, ast.UnaryExpr):
            t = self.check(n.expr)
            if t not in (T.SCALAR, T.VECTOR):
                raise self.err(
                    n,
                    "unary expression only allowed on expressions of type scalar or instant "
                    f'vector, got "{t.documented}"',
                )
        elif isinstance(n, ast.SubqueryExpr):
            t = self.check(n.expr)
            if t != T.VECTOR:
                raise self.err(n, f"subquery is only allowed on instant vector, got {t} instead")
        elif isinstance(n, ast.MatrixSelector):
            self.check(n.vs)
        elif isinstance(n, ast.VectorSelector):
            self.selector(n)
        return n.type

    def selector(self, n: ast.VectorSelector) -> None:
        if n.name:
            for m in n.matchers[:-1]:
                if m.name == "__name__":
                    raise self.err(
                        n, f'metric name must not be set twice: "{n.name}" or "{m.value}"'
                    )
            return
        if not any(not m.matches("") for m in n.matchers):
            raise self.err(n, "vector selector must contain at least one non-empty matcher")

    def binary(self, n: ast.BinaryExpr) -> None:
        lt, rt = self.check(n.lhs), self.check(n.rhs)
        op_pos = ast.NumberLiteral(n.lhs.end, n.lhs.end, 0.0)
        while op_pos.start < len(self.text) and self.text[op_pos.start].isspace():
            op_pos.start += 1
        m = n.matching
        if n.return_bool and n.op not in ast.COMPARISONS:
            raise self.err(op_pos, "bool modifier can only be used on comparison operators")
        if n.op in ast.COMPARISONS and not n.return_bool and lt == rt == T.SCALAR:
            raise self.err(op_pos, "comparisons between scalars must use BOOL modifier")
        if m is not None and n.op in ast.SET_OPS and m.card == "one-to-one":
            m.card = "many-to-many"
        if m is not None and m.on:
            for label in m.labels:
                if label in m.include:
                    raise self.err(
                        op_pos, f'label "{label}" must not occur in ON and GROUP clause at once'
                    )
        if lt not in (T.SCALAR, T.VECTOR):
            raise self.err(
                n.lhs, "binary expression must contain only scalar and instant vector types"
            )
        if rt not in (T.SCALAR, T.VECTOR):
            raise self.err(
                n.rhs, "binary expression must contain only scalar and instant vector types"
            )
        if (lt != T.VECTOR or rt != T.VECTOR) and m is not None:
            if m.labels:
                raise self.err(n, "vector matching only allowed between instant vectors")
            n.matching = None
        elif m is not None and n.op in ast.SET_OPS and m.card in ("one-to-many", "many-to-one"):
            raise self.err(n, f'no grouping allowed for "{n.op}" operation')
        if T.SCALAR in (lt, rt) and n.op in ast.SET_OPS:
            raise self.err(n, f'set operator "{n.op}" not allowed in binary scalar expression')

    def call(self, n: ast.Call) -> None:
        fn = n.func
        nargs = len(fn.arg_types)
        if fn.variadic == 0 and nargs != len(n.args):
            raise self.err(
                n, f'expected {nargs} argument(s) in call to "{fn.name}", got {len(n.args)}'
            )
        if fn.variadic != 0:
            least = nargs - 1
            if least > len(n.args):
                raise self.err(
                    n,
                    f'expected at least {least} argument(s) in call to "{fn.name}", '
                    f"got {len(n.args)}",
                )
            most = least + fn.variadic
            if fn.variadic > 0 and most < len(n.args):
                raise self.err(
                    n,
                    f'expected at most {most} argument(s) in call to "{fn.name}", '
                    f"got {len(n.args)}",
                )
        for i, arg in enumerate(n.args):
            k = min(i, nargs - 1)
            self.expect(arg, fn.arg_types[k], f'call to function "{fn.name}"')


def _depth_check(text: str, root: ast.Expr) -> None:
    """Reject trees deeper than MAX_DEPTH (long left-leaning chains such as 1+1+...+1)."""
    stack: list[tuple[ast.Expr, int]] = [(root, 1)]
    while stack:
        node, d = stack.pop()
        if d > MAX_DEPTH:
            raise error_at(
                text, node.start, f"the query nests deeper than {MAX_DEPTH} levels; simplify it"
            )
        stack.extend((c, d + 1) for c in ast.children(node))


def parse(text: str) -> ast.Expr:
    """Parse and type-check a PromQL expression; PromQLError as Prometheus words it."""
    if len(text) > MAX_QUERY_CHARS:
        raise ast.PromQLError(f"1:1: parse error: query longer than {MAX_QUERY_CHARS} characters")
    expr = Parser(text).parse()
    _depth_check(text, expr)
    Checker(text).check(expr)
    return expr


def parse_selector(text: str) -> ast.VectorSelector:
    """A series selector (``match[]`` of the metadata endpoints)."""
    expr = parse(text)
    if not isinstance(expr, ast.VectorSelector):
        raise ast.PromQLError(f'1:1: parse error: "{text}" is not a series selector')
    return expr
