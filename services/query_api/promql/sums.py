"""``sum_over_time`` from exact integer prefix sums, when that provably equals Prometheus' sum.

Prometheus sums a window sample by sample with ``kahanSumInc`` (Neumaier). A
running *float* sum differenced per window is wrong (after a 1e17 spike later
windows come out 0); running *integer* sums are exact, so their differences are
too. When every value of the query is an integer multiple of one power of two
``2**q`` and below ``2**(q + 62)`` (sensor data: readings within a factor of
about 500 of each other, integers, any 53-bit mantissa in a few binades), each
value is an exact int64 ``m * 2**q``; two int64 limbs of 31 bits hold every
prefix sum exactly, and a window's sum ``S`` is ``H * 2**(q+31) + L * 2**q``,
two exact doubles whose float sum is ``S`` correctly rounded.

Prometheus returns the same bits: each Neumaier error term is exact, every
partial sum and error is a multiple of ``2**q``, and the compensation, at most
``n**2 * 2**(q+9)`` for ``n`` samples, stays below ``2**(q+53)`` for windows
under ``2**22`` samples, so it is accumulated without rounding; then
``total + compensation`` is ``S`` exactly before its one rounding. Anything
else (a 1e17 spike among small readings, infinities, NaN, a wide dynamic range)
returns ``None`` and the caller sums window by window.
"""

from __future__ import annotations

import numpy as np

from services.query_api.promql.values import F1, I1

_LIMB = 31
_MAX_WINDOW = 1 << 22
_MAX_BITS = 62


def _quantum(vs: F1) -> int | None:
    """The largest ``q`` with every value a multiple of ``2**q`` below ``2**(q + 62)``."""
    nz = vs[vs != 0]
    if nz.shape[0] == 0:
        return 0
    mant, exp = np.frexp(nz)  # |nz| = |mant| * 2**exp, 0.5 <= |mant| < 1
    digits = np.abs(np.ldexp(mant, 53)).astype(np.int64)  # exact 53-bit integer mantissas
    low_bit = np.log2((digits & -digits).astype(np.float64)).astype(np.int64)
    q = int((exp - 53 + low_bit).min())
    if int(exp.max()) - q > _MAX_BITS or not -1000 <= q <= 900:
        return None
    return q


def exact_window_sums(vs: F1, lo: I1, hi: I1) -> F1 | None:
    """Prometheus' ``sum_over_time`` of the windows ``vs[lo:hi]``, or ``None`` when not provable."""
    n = hi - lo
    if vs.shape[0] >= 1 << 31 or (n.shape[0] and int(n.max()) >= _MAX_WINDOW):
        return None
    if not bool(np.isfinite(vs).all()):
        return None
    q = _quantum(vs)
    if q is None:
        return None
    m = np.ldexp(vs, -q).astype(np.int64)  # exact: |vs| / 2**q < 2**62, a whole number
    high = np.zeros(m.shape[0] + 1, dtype=np.int64)
    low = np.zeros(m.shape[0] + 1, dtype=np.int64)
    np.cumsum(m >> _LIMB, out=high[1:])
    np.cumsum(m & ((1 << _LIMB) - 1), out=low[1:])
    h = (high[hi] - high[lo]).astype(np.float64)  # |h| < 2**53: exact
    lsum = (low[hi] - low[lo]).astype(np.float64)
    return np.ldexp(h, q + _LIMB) + np.ldexp(lsum, q)
