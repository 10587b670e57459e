"""Every PromQL function with its argument and result types (promql/parser/functions.go).

The parser checks calls against this table; the evaluator's implementations live
in :mod:`.functions`, keyed by the same names.
"""

from __future__ import annotations

from services.query_api.promql.ast import Function, ValueType

S, V, M, STR = ValueType.SCALAR, ValueType.VECTOR, ValueType.MATRIX, ValueType.STRING


def _f(name: str, args: tuple[ValueType, ...], ret: ValueType, variadic: int = 0) -> Function:
    return Function(name, args, variadic, ret)


_MATH = [
    "abs",
    "ceil",
    "floor",
    "exp",
    "sqrt",
    "ln",
    "log2",
    "log10",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "rad",
    "deg",
    "sgn",
    "absent",
    "sort",
    "sort_desc",
    "timestamp",
]
_OVER_TIME = [
    "absent_over_time",
    "avg_over_time",
    "changes",
    "count_over_time",
    "delta",
    "deriv",
    "idelta",
    "increase",
    "irate",
    "last_over_time",
    "max_over_time",
    "min_over_time",
    "present_over_time",
    "rate",
    "resets",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
]
_DATES = [
    "days_in_month",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "hour",
    "minute",
    "month",
    "year",
]

FUNCTIONS: dict[str, Function] = {
    **{n: _f(n, (V,), V) for n in _MATH},
    **{n: _f(n, (M,), V) for n in _OVER_TIME},
    **{n: _f(n, (V,), V, variadic=1) for n in _DATES},
    "clamp": _f("clamp", (V, S, S), V),
    "clamp_max": _f("clamp_max", (V, S), V),
    "clamp_min": _f("clamp_min", (V, S), V),
    "histogram_count": _f("histogram_count", (V,), V),
    "histogram_sum": _f("histogram_sum", (V,), V),
    "histogram_fraction": _f("histogram_fraction", (S, S, V), V),
    "histogram_quantile": _f("histogram_quantile", (S, V), V),
    "holt_winters": _f("holt_winters", (M, S, S), V),
    "label_replace": _f("label_replace", (V, STR, STR, STR, STR), V),
    "label_join": _f("label_join", (V, STR, STR, STR), V, variadic=-1),
    "pi": _f("pi", (), S),
    "predict_linear": _f("predict_linear", (M, S), V),
    "quantile_over_time": _f("quantile_over_time", (S, M), V),
    "round": _f("round", (V, S), V, variadic=1),
    "scalar": _f("scalar", (V,), S),
    "time": _f("time", (), S),
    "vector": _f("vector", (S,), V),
}

DATE_FUNCTIONS = frozenset(_DATES)
