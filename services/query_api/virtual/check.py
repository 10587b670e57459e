"""Dimensional analysis of an expression tree, done once when a virtual sensor is defined.

Every input is converted to SI base units before evaluation, so the check
only has to prove that the dimensions fit: ``+ - min max avg sum`` need equal
dimensions, ``*`` and ``/`` combine them, ``^`` needs a dimensionless exponent
(a plain number when the base has a dimension), ``rate`` divides by time and
``integral`` multiplies by it. A mismatch is an ExpressionError at the
position of the operator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.query_api import units
from services.query_api.virtual.parser import (
    Binary,
    Call,
    ExpressionError,
    Node,
    Number,
    Ref,
    Unary,
)


@dataclass
class Checked:
    """What the check learnt: the result's base unit and what a user should know."""

    unit: Any
    """pint Unit (SI base units) of the expression's value."""
    warnings: list[str] = field(default_factory=list)
    difference: bool = False
    """The value is a difference of temperatures (``"/out" - "/in"``): in a unit with
    an offset it is that unit's ``delta_`` unit (10 delta_degC, not -263.15 degC)."""


class _Checker:
    def __init__(
        self,
        text: str,
        sensor_units: Mapping[str, str | None],
        expansions: Mapping[str, Sequence[str]],
    ) -> None:
        self.text = text
        self.sensor_units = sensor_units
        self.expansions = expansions
        self.warnings: list[str] = []
        self.ureg = units.registry()
        self._units: dict[int, Any] = {}
        """id(node) -> its unit, as :meth:`unit` found it."""

    def fail(self, message: str, pos: int) -> ExpressionError:
        return ExpressionError(message, self.text, pos)

    def sensor_unit(self, name: str, pos: int) -> Any:
        text = self.sensor_units.get(name)
        if not text:
            return self.ureg.dimensionless
        parsed = units.parse(text)
        if parsed is None:
            self.warnings.append(
                f"{name}: unit {text!r} is unknown to pint; its values are used as plain numbers"
            )
            return self.ureg.dimensionless
        return units.to_base(parsed)[0]

    def same(self, a: Any, b: Any, what: str, pos: int) -> Any:
        if a.dimensionality != b.dimensionality:
            raise self.fail(f"{what}: {_dim(a)} and {_dim(b)} are different dimensions", pos)
        return a

    def unit(self, node: Node) -> Any:
        found = self._unit(node)
        self._units[id(node)] = found
        return found

    def _unit(self, node: Node) -> Any:
        if isinstance(node, Number):
            if node.unit is None:
                return self.ureg.dimensionless
            parsed = units.parse(node.unit)
            if parsed is None:
                raise self.fail(f"unknown unit {node.unit!r} after the number", node.pos)
            return units.to_base(parsed)[0]
        if isinstance(node, Ref):
            if node.is_pattern:
                members = self.expansions.get(node.name, ())
                if not members:
                    raise self.fail(f"wildcard {node.name!r} matches no sensor", node.pos)
                first = self.sensor_unit(members[0], node.pos)
                for m in members[1:]:
                    self.same(
                        first, self.sensor_unit(m, node.pos), f"{members[0]} and {m}", node.pos
                    )
                return first
            return self.sensor_unit(node.name, node.pos)
        if isinstance(node, Unary):
            return self.unit(node.operand)
        if isinstance(node, Binary):
            return self.binary(node)
        return self.call(node)

    def binary(self, node: Binary) -> Any:
        left, right = self.unit(node.left), self.unit(node.right)
        if node.op in "+-":
            verb = "cannot add" if node.op == "+" else "cannot subtract"
            return self.same(left, right, verb, node.pos)
        if node.op == "*":
            return left * right
        if node.op == "/":
            return left / right
        # '^'
        if not right.dimensionless:
            raise self.fail(f"the exponent must be dimensionless, not {_dim(right)}", node.pos)
        if left.dimensionless:
            return left
        if not isinstance(node.right, Number) and not (
            isinstance(node.right, Unary) and isinstance(node.right.operand, Number)
        ):
            raise self.fail(
                f"a quantity with a dimension ({_dim(left)}) can only be raised to a constant number",
                node.pos,
            )
        exp = node.right.value if isinstance(node.right, Number) else -node.right.operand.value  # type: ignore[union-attr]
        return left**exp

    def call(self, node: Call) -> Any:
        args = [self.unit(a) for a in node.args]
        if node.func in ("min", "max", "avg", "sum"):
            for a, arg in zip(args[1:], node.args[1:], strict=True):
                self.same(args[0], a, f"{node.func}() arguments", arg_pos(arg))
            return args[0]
        if node.func == "rate":
            return args[0] / self.ureg.second
        if node.func == "integral":
            return args[0] * self.ureg.second
        return args[0]  # abs, delta

    def difference(self, node: Node) -> bool:
        """Whether a (temperature) value is a difference rather than a point on a scale:
        a difference of two points, a function of differences, or ``delta()``. Call
        after :meth:`unit` checked the tree."""
        if isinstance(node, Number):
            unit = units.parse(node.unit) if node.unit else None
            return unit is None or not units.has_offset(units.to_base(unit)[1])  # 5 K, not 5 degC
        if isinstance(node, Ref):
            name = (self.expansions.get(node.name) or [node.name])[0]
            text = self.sensor_units.get(name) or ""
            return text.strip().startswith("delta_")
        if isinstance(node, Unary):
            return self.difference(node.operand)
        if isinstance(node, Binary):
            left, right = self.difference(node.left), self.difference(node.right)
            if node.op == "+":
                return left and right
            if node.op == "-":
                return left == right  # point - point, or difference - difference
            if node.op == "^":
                return left
            # * and /: what the factor with a dimension is (2 * ("/a" - "/b"))
            if self._units[id(node.right)].dimensionless:
                return left
            return right if self._units[id(node.left)].dimensionless else False
        if node.func == "delta":
            return True
        return all(self.difference(a) for a in node.args)


def arg_pos(node: Node) -> int:
    return node.pos


_NAMED = {
    "W": "power",
    "J": "energy",
    "K": "temperature",
    "s": "time",
    "Hz": "frequency",
    "A": "current",
    "V": "voltage",
    "Pa": "pressure",
    "m": "length",
    "kg": "mass",
    "m^3/s": "volume flow",
    "kg/s": "mass flow",
}


def _dim(unit: Any) -> str:
    """``power [mass]·[length]²/[time]³`` — a name for common dimensions, always the formula."""
    if unit.dimensionless:
        return "dimensionless"
    formula = str(unit.dimensionality)
    for sym, label in _NAMED.items():
        ref = units.parse(sym)
        if ref is not None and ref.dimensionality == unit.dimensionality:
            return f"{label} ({formula})"
    return formula


def check(
    node: Node,
    text: str,
    sensor_units: Mapping[str, str | None],
    expansions: Mapping[str, Sequence[str]],
) -> Checked:
    """Check dimensions; ``sensor_units`` maps every referenced (and expanded) sensor to its unit."""
    checker = _Checker(text, sensor_units, expansions)
    unit = checker.unit(node)
    return Checked(unit, checker.warnings, checker.difference(node))


def result_unit(
    checked: Checked,
    declared: str | None,
    candidates: Sequence[str | None],
    where: str,
) -> str:
    """The unit results are stored in: the declared one (dimension checked), else the first
    input unit of the right dimension, else SI base units; for a difference of
    temperatures the ``delta_`` form of a unit with an offset (``delta_degC``)."""
    if declared:
        unit = units.require(declared, where)
        if unit.dimensionality != checked.unit.dimensionality:
            raise units.UnitError(
                f"{where}: declared unit {declared!r} ({_dim(unit)}) does not match the "
                f"expression's dimension ({_dim(checked.unit)})"
            )
        return _of_difference(checked, declared)
    for c in candidates:
        parsed = units.parse(c) if c else None
        if parsed is not None and parsed.dimensionality == checked.unit.dimensionality:
            return _of_difference(checked, str(c))
    return units.text(checked.unit)


def _of_difference(checked: Checked, unit: str) -> str:
    if not checked.difference:
        return unit
    delta = units.difference_of(unit)
    if delta != unit:
        checked.warnings.append(
            f"the expression is a difference of temperatures: its results are in {delta} "
            f"(a difference in {unit}), which converts to K without {unit}'s offset"
        )
    return delta
