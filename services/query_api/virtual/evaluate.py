"""Evaluating an expression tree on a grid, element-wise with numpy.

Inputs arrive through an async ``fetch(name)`` already interpolated onto the
grid and converted to SI base units, so evaluation is plain float arithmetic.
A missing value (NaN) in any operand gives NaN: gaps stay gaps, also in
``sum`` and ``avg`` (a hall total that silently drops a node would lie).
Aggregates over wildcards accumulate one input at a time, so a thousand
inputs never sit in memory together.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import numpy as np

from services.common.readings import Float64Array
from services.query_api import units
from services.query_api.virtual.parser import Binary, Call, Node, Number, Ref, Unary

Fetch = Callable[[str], Awaitable[Float64Array]]
Value = Float64Array | float


class Evaluator:
    """Evaluates one tree on a grid of ``n`` points ``interval_ns`` apart."""

    def __init__(
        self,
        n: int,
        interval_ns: int,
        fetch: Fetch,
        expansions: Mapping[str, Sequence[str]],
    ) -> None:
        self.n = n
        self.interval_s = interval_ns / 1e9
        self.fetch = fetch
        self.expansions = expansions

    async def run(self, node: Node) -> Float64Array:
        with np.errstate(all="ignore"):
            out = await self.value(node)
        arr = np.broadcast_to(np.asarray(out, dtype=np.float64), (self.n,)).copy()
        arr[~np.isfinite(arr)] = np.nan
        return arr

    async def value(self, node: Node) -> Value:
        if isinstance(node, Number):
            if node.unit is None:
                return node.value
            unit = units.parse(node.unit)
            base = units.to_base(unit)[1]
            return float(base.apply(np.array([node.value]))[0])
        if isinstance(node, Ref):
            return await self.fetch(node.name)
        if isinstance(node, Unary):
            return -(await self.value(node.operand))
        if isinstance(node, Binary):
            left = await self.value(node.left)
            right = await self.value(node.right)
            if node.op == "+":
                return left + right
            if node.op == "-":
                return left - right
            if node.op == "*":
                return left * right
            if node.op == "/":
                return np.divide(left, right)
            return np.power(left, right)
        return await self.call(node)

    async def call(self, node: Call) -> Value:
        if node.func in ("min", "max", "avg", "sum"):
            return await self.aggregate(node)
        x = await self.value(node.args[0])
        if node.func == "abs":
            return np.abs(x)
        arr = np.broadcast_to(np.asarray(x, dtype=np.float64), (self.n,))
        out = np.full(self.n, np.nan)
        if self.n < 2:
            return out
        step = arr[1:] - arr[:-1]
        if node.func == "delta":
            out[1:] = step
        elif node.func == "rate":
            # a counter that drops was reset and has counted up from zero since
            reset = step < 0
            step = np.where(reset, arr[1:], step)
            out[1:] = step / self.interval_s
        else:  # integral over each grid step, trapezoid
            out[1:] = (arr[1:] + arr[:-1]) * 0.5 * self.interval_s
        return out

    async def aggregate(self, node: Call) -> Value:
        acc: Value | None = None
        count = 0
        for arg in node.args:
            members: Sequence[Node]
            if isinstance(arg, Ref) and arg.is_pattern:
                members = [Ref(m, arg.pos) for m in self.expansions.get(arg.name, ())]
            else:
                members = [arg]
            for m in members:
                v = await self.value(m)
                count += 1
                if acc is None:
                    acc = np.array(v, dtype=np.float64, copy=True)
                elif node.func == "min":
                    acc = np.minimum(acc, v)
                elif node.func == "max":
                    acc = np.maximum(acc, v)
                else:
                    acc = acc + v
        if acc is None:  # a wildcard that matches nothing (any more)
            return np.nan
        if node.func == "avg":
            return acc / count
        return acc
