"""The PromQL syntax tree: one node type per construct, each knowing its value type.

Times and durations are int64 nanoseconds (Prometheus' milliseconds times 10^6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Union

from services.common.errors import KelvinError
from services.query_api.promql.regex import Matcher


class PromQLError(KelvinError, ValueError):
    """A query Prometheus refuses before evaluating it (HTTP 400, ``bad_data``)."""


class EvalError(KelvinError):
    """A query that fails while it is evaluated (HTTP 422, ``execution``), as in Prometheus."""


class ValueType(StrEnum):
    NONE = "none"
    SCALAR = "scalar"
    VECTOR = "vector"
    MATRIX = "matrix"
    STRING = "string"

    @property
    def documented(self) -> str:
        """The name Prometheus' error messages use."""
        return {"vector": "instant vector", "matrix": "range vector"}.get(self.value, self.value)


@dataclass(frozen=True)
class Function:
    name: str
    arg_types: tuple[ValueType, ...]
    variadic: int  # 0: fixed; n > 0: up to n optional; -1: unbounded
    return_type: ValueType


@dataclass(eq=False)
class Node:
    start: int
    end: int

    @property
    def type(self) -> ValueType:
        raise NotImplementedError


@dataclass(eq=False)
class VectorSelector(Node):
    name: str
    matchers: list[Matcher]
    offset_ns: int = 0
    at_ns: int | None = None
    at_kw: str | None = None  # "start" / "end": resolved per query

    @property
    def type(self) -> ValueType:
        return ValueType.VECTOR


@dataclass(eq=False)
class MatrixSelector(Node):
    vs: VectorSelector
    range_ns: int

    @property
    def type(self) -> ValueType:
        return ValueType.MATRIX


@dataclass(eq=False)
class SubqueryExpr(Node):
    expr: Expr
    range_ns: int
    step_ns: int  # 0: the default evaluation interval
    offset_ns: int = 0
    at_ns: int | None = None
    at_kw: str | None = None

    @property
    def type(self) -> ValueType:
        return ValueType.MATRIX


@dataclass(eq=False)
class NumberLiteral(Node):
    value: float

    @property
    def type(self) -> ValueType:
        return ValueType.SCALAR


@dataclass(eq=False)
class StringLiteral(Node):
    value: str

    @property
    def type(self) -> ValueType:
        return ValueType.STRING


@dataclass(eq=False)
class ParenExpr(Node):
    expr: Expr

    @property
    def type(self) -> ValueType:
        return self.expr.type


@dataclass(eq=False)
class UnaryExpr(Node):
    op: str  # "-" or "+"
    expr: Expr

    @property
    def type(self) -> ValueType:
        return self.expr.type


@dataclass
class VectorMatching:
    card: str = "one-to-one"  # many-to-one, one-to-many, many-to-many
    labels: list[str] = field(default_factory=list)
    on: bool = False
    include: list[str] = field(default_factory=list)


@dataclass(eq=False)
class BinaryExpr(Node):
    op: str
    lhs: Expr
    rhs: Expr
    return_bool: bool = False
    matching: VectorMatching | None = None

    @property
    def type(self) -> ValueType:
        if self.lhs.type == ValueType.SCALAR and self.rhs.type == ValueType.SCALAR:
            return ValueType.SCALAR
        return ValueType.VECTOR


@dataclass(eq=False)
class AggregateExpr(Node):
    op: str
    expr: Expr
    param: Expr | None = None
    grouping: list[str] = field(default_factory=list)
    without: bool = False

    @property
    def type(self) -> ValueType:
        return ValueType.VECTOR


@dataclass(eq=False)
class Call(Node):
    func: Function
    args: list[Expr]

    @property
    def type(self) -> ValueType:
        return self.func.return_type


Expr = Union[  # noqa: UP007 (a runtime alias)
    VectorSelector,
    MatrixSelector,
    SubqueryExpr,
    NumberLiteral,
    StringLiteral,
    ParenExpr,
    UnaryExpr,
    BinaryExpr,
    AggregateExpr,
    Call,
]

COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})
ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^"})
AGGREGATORS = frozenset(
    {
        "sum", "avg", "count", "min", "max", "group", "stddev", "stdvar",
        "topk", "bottomk", "count_values", "quantile",
    }
)  # fmt: skip
PARAM_AGGREGATORS = frozenset({"topk", "bottomk", "count_values", "quantile"})


def unwrap(e: Expr) -> Expr:
    """The expression inside any parentheses."""
    while isinstance(e, ParenExpr):
        e = e.expr
    return e


def children(e: Expr) -> list[Expr]:
    if isinstance(e, MatrixSelector):
        return [e.vs]
    if isinstance(e, SubqueryExpr | ParenExpr | UnaryExpr):
        return [e.expr]
    if isinstance(e, BinaryExpr):
        return [e.lhs, e.rhs]
    if isinstance(e, AggregateExpr):
        return [e.expr] if e.param is None else [e.param, e.expr]
    if isinstance(e, Call):
        return list(e.args)
    return []
