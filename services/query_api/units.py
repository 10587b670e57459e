"""Physical units with pint: parsing sensor units and converting series between them.

One registry for the whole process (building it costs ~0.2 s). A unit pint does
not know (``requests``, ``aaa``) is *opaque*: it converts only to itself and
counts as dimensionless in expressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from services.common.errors import KelvinError
from services.common.readings import Float64Array


class UnitError(KelvinError, ValueError):
    """A unit is unknown or a conversion between two units is impossible."""


@lru_cache(maxsize=1)
def registry() -> Any:
    import pint

    ureg: Any = pint.UnitRegistry(autoconvert_offset_to_baseunit=True)
    ureg.formatter.default_format = "~"
    return ureg


@lru_cache(maxsize=4096)
def parse(text: str | None) -> Any | None:
    """A pint Unit for ``text``, or None when pint does not know it (opaque)."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return registry().dimensionless
    try:
        return registry().parse_units(text)
    except Exception:  # pint raises several unrelated types for unparsable input
        return None


def require(text: str, what: str) -> Any:
    """Parse a unit the caller asked for explicitly; unknown is an error."""
    unit = parse(text)
    if unit is None:
        raise UnitError(f"{what}: unit {text!r} is not known (expected e.g. W, kW, degC, %, J)")
    return unit


@dataclass(frozen=True, slots=True)
class Linear:
    """``y = x * scale + offset``: a conversion between two units of a scale (all but
    the logarithmic ones)."""

    scale: float
    offset: float

    def apply(self, values: Float64Array) -> Float64Array:
        if self.scale == 1.0 and self.offset == 0.0:
            return values
        out = values * self.scale
        if self.offset:
            out += self.offset
        return out


@dataclass(frozen=True, slots=True)
class Logarithmic:
    """A conversion no scale and offset can do (dB, dBm, Np: 10 dBm is 10 mW, not the
    straight line through 0 and 1 dBm), done by pint on the whole array."""

    src: Any
    dst: Any

    def apply(self, values: Float64Array) -> Float64Array:
        with np.errstate(divide="ignore", invalid="ignore"):  # log of 0 or less: -inf, NaN
            q = registry().Quantity(np.asarray(values, dtype=np.float64), self.src).to(self.dst)
        return np.asarray(q.magnitude, dtype=np.float64)


Conversion = Linear | Logarithmic


def has_offset(conv: Conversion) -> bool:
    """A scale with its own zero (degC, degF): differences convert without the offset."""
    return isinstance(conv, Linear) and conv.offset != 0.0


@lru_cache(maxsize=4096)
def conversion(src: str | None, dst: str) -> Conversion:
    """The conversion from unit ``src`` to unit ``dst`` (both as text).

    Raises UnitError naming both units when they are unknown or of different dimensions.
    """
    if src is not None and src.strip() == dst.strip():
        return Linear(1.0, 0.0)
    if src is None or not src.strip():
        raise UnitError(f"cannot convert to {dst!r}: the sensor has no unit (set one first)")
    a, b = parse(src), require(dst, "conversion target")
    if a is None:
        raise UnitError(f"cannot convert {src!r} to {dst!r}: {src!r} is not a known unit")
    return linear(a, b, src, dst)


def linear(a: Any, b: Any, src: str = "", dst: str = "") -> Conversion:
    """The map from unit ``a`` to unit ``b`` (pint Units): scale and offset, unless a
    logarithmic unit makes it no straight line."""
    import pint

    ureg = registry()
    if a.dimensionality != b.dimensionality:
        raise UnitError(
            f"cannot convert {src or str(a)!r} ({a.dimensionality}) to {dst or str(b)!r} "
            f"({b.dimensionality}): different dimensions"
        )
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # to dB: log10(0)
            q = ureg.Quantity(np.array([0.0, 1.0, 10.0]), a).to(b).magnitude
    except pint.PintError as exc:  # a temperature difference to a temperature scale
        raise UnitError(
            f"cannot convert {src or str(a)!r} to {dst or str(b)!r}: {exc} (a difference of "
            "temperatures converts to K or delta_degC, a temperature to degC, degF or K)"
        ) from None
    lin = Linear(float(q[1] - q[0]), float(q[0]))
    if not np.isclose(q[2], lin.scale * 10.0 + lin.offset, rtol=1e-9, atol=0.0):
        return Logarithmic(a, b)
    return lin


def difference_of(text: str) -> str:
    """The unit of a difference of two values in unit ``text``: ``delta_degC`` for
    ``degC`` (whose conversions add an offset, which a difference must not get);
    ``text`` itself for every unit without an offset (``K``, ``W``)."""
    unit = parse(text)
    if unit is None or not has_offset(to_base(unit)[1]):
        return text
    delta = f"delta_{text.strip()}"
    return delta if parse(delta) is not None else text


def to_base(unit: Any) -> tuple[Any, Conversion]:
    """The base (SI) unit of ``unit`` and the map into it."""
    base = registry().Quantity(1.0, unit).to_base_units().units
    return base, linear(unit, base)


def text(unit: Any) -> str:
    """Short, parseable text of a pint unit: ``kW``, ``kg*m**2/s**3``; dimensionless is ``''``."""
    if unit is None:
        return ""
    if unit == registry().dimensionless:
        return ""
    return f"{unit:~C}"
