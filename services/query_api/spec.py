"""Sensor specifications as DCDB's query tool writes them.

``/a/power`` (plain), ``/a/power@kW`` (unit conversion), ``/a/power@0.001``
(scale factor), ``derivative(/a/energy)`` (an operation), and Kelvin's
extensions: nested operations (``max(rate(/a/bytes))``) and a modifier on the
result (``integral(/a/power)@kWh``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common import names
from services.common.errors import KelvinError, SensorNameError

TRANSFORMS = ("delta", "delta_t", "derivative", "integral", "rate")
"""Operations that turn a series into a series (one point per input step)."""
AGGREGATES = ("min", "max", "avg", "sum", "count")
"""Operations that reduce a series (the whole range, or each ``interval`` bucket)."""
OPERATIONS = TRANSFORMS + AGGREGATES

_FUNC = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)
_NUMBER = re.compile(r"^[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?$")


class SpecError(KelvinError, ValueError):
    """A sensor specification cannot be parsed."""


@dataclass(frozen=True, slots=True)
class Modifier:
    """``@kW`` converts to a unit; ``@0.001`` multiplies by a factor."""

    unit: str | None = None
    factor: float | None = None

    def __str__(self) -> str:
        return f"@{self.unit}" if self.unit is not None else f"@{self.factor:g}"


@dataclass(frozen=True, slots=True)
class Spec:
    """A parsed specification: a sensor, its input modifier, operations inside-out, result modifier."""

    sensor: str
    input_mod: Modifier | None = None
    operations: tuple[str, ...] = ()
    """Applied in order (innermost first)."""
    output_mod: Modifier | None = None
    text: str = ""

    @property
    def aggregate(self) -> str | None:
        return (
            self.operations[-1] if self.operations and self.operations[-1] in AGGREGATES else None
        )

    @property
    def label(self) -> str:
        """The CSV value column name, as DCDB prints it (``Value``, ``Delta_t``, ``avg``)."""
        if not self.operations:
            return "Value"
        op = self.operations[-1]
        return op if op in AGGREGATES else op.capitalize()

    @property
    def has_wildcard(self) -> bool:
        return "*" in self.sensor


def _split_mod(text: str, where: str) -> tuple[str, Modifier | None]:
    """Split ``x@mod`` at the last ``@`` outside parentheses."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
        elif ch == "@" and depth == 0:
            mod = text[i + 1 :].strip()
            if not mod:
                raise SpecError(f"{where}: empty modifier after '@' at position {i + 1}")
            if _NUMBER.match(mod):
                return text[:i], Modifier(factor=float(mod))
            return text[:i], Modifier(unit=mod)
    return text, None


def parse(text: str) -> Spec:
    """Parse a specification; errors name the text and what was expected."""
    where = f"sensor {text!r}"
    body, out_mod = _split_mod(text.strip(), where)
    ops: list[str] = []
    while True:
        m = _FUNC.match(body)
        if not m or m.group(1).lower() not in OPERATIONS:
            if m and not body.lstrip().startswith("/"):
                raise SpecError(
                    f"{where}: unknown operation {m.group(1)!r}; expected one of {', '.join(OPERATIONS)}"
                )
            break
        ops.append(m.group(1).lower())
        body = m.group(2)
        inner_body, inner_mod = _split_mod(body.strip(), where)
        if inner_mod is not None and _FUNC.match(inner_body) is None:
            body = inner_body
            return _finish(text, body, inner_mod, ops, out_mod, where)
    return _finish(text, body, None, ops, out_mod, where)


def _finish(
    text: str,
    body: str,
    in_mod: Modifier | None,
    ops: list[str],
    out_mod: Modifier | None,
    where: str,
) -> Spec:
    name = body.strip()
    if not ops and in_mod is None:
        in_mod, out_mod = out_mod, None
    # ops is outermost first here; an aggregate reduces, so nothing may wrap it
    for i, op in enumerate(ops):
        if op in AGGREGATES and i > 0:
            raise SpecError(
                f"{where}: aggregate {op!r} must be the outermost operation (it is inside {ops[i - 1]!r})"
            )
    check = name.replace("*", "x")
    try:
        names.validate(check)
    except SensorNameError as exc:
        raise SensorNameError(f"{where}: {exc}") from None
    return Spec(name, in_mod, tuple(reversed(ops)), out_mod, text)
