"""PromQL as Prometheus 2.x evaluates it, over Kelvin's sensors.

Kept apart as Prometheus keeps them: the language (:mod:`.lexer`, :mod:`.parser`,
:mod:`.ast`, :mod:`.printer`), the evaluator (:mod:`.engine` over
:mod:`.values`, reading through :mod:`.source`) and the functions
(:mod:`.functions_table` for their types, :mod:`.functions`, :mod:`.windows`,
:mod:`.aggregate`, :mod:`.binary` for their work).
"""

from services.query_api.promql.ast import EvalError, PromQLError
from services.query_api.promql.engine import Engine
from services.query_api.promql.parser import parse, parse_duration_ns, parse_selector
from services.query_api.promql.printer import to_string

__all__ = [
    "Engine",
    "EvalError",
    "PromQLError",
    "parse",
    "parse_duration_ns",
    "parse_selector",
    "to_string",
]
