"""Tokens of a body to numbers, many at once: integers, floats, booleans, word rows.

Every function takes the padded body (:func:`padded`) and the tokens' starts and
lengths, and returns the values with a mask of the tokens it converted exactly;
the caller hands the others to the reference parser, so these only need to be
right on what they accept. Each token is copied out as one fixed-width item of
an overlapping ``void`` view of the body (a memcpy per token, not per byte) and
worked on as a small byte matrix: numbers right-aligned in 24 columns, so that
a column's weight is a fixed power of ten; per-token tests read the matrix's
rows as three 64-bit words (eight byte flags at a time).

A decimal with at most 19 characters and no exponent is its digits as one
integer divided by a power of ten: both exact in a double (up to 2**53 and
10**22), so the division rounds correctly, as Python's ``float()`` and Go's
``ParseFloat`` do. Up to 15 characters that integer is summed exactly in
doubles (one BLAS call); longer ones in uint64. Exponents go through numpy's
(correctly rounded) string cast.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]

PAD = 32
"""Zero bytes before the body in :func:`padded`."""
TAIL = 512
"""Zero bytes after it: room for the widest window read from a token near the end."""
W = 24
"""Columns of a number's matrix (three words)."""
_POW10 = np.array([0] * (W - 19) + [10**k for k in range(18, -1, -1)], dtype=np.uint64)
_POWERS = np.array([10**k for k in range(20)], dtype=np.uint64)
_FPOWERS = np.array([10.0**k for k in range(20)])
_EXACT = np.uint64(2**53)
_F15 = np.array([0.0] * (W - 15) + [10.0**k for k in range(14, -1, -1)])
_COLS = np.arange(W, dtype=np.float64)
_ONES = np.uint64(0x0101010101010101)
_cols = np.arange(W)
_RIGHT = (_cols[None, :] >= W - np.arange(W + 1)[:, None]).view(np.uint8)
"""Row ``n``: the last ``n`` columns (a token of length n, right-aligned)."""
_LEFT = (_cols[None, :] < np.arange(W + 1)[:, None]).view(np.uint8)
_LEAD = (_cols[None, :] == W - np.arange(W + 1)[:, None]).view(np.uint8)
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)
MAX_WORDS = 32
_WORD_MASKS = _MASKS[
    np.clip(np.arange(8 * MAX_WORDS + 1)[:, None] - 8 * np.arange(MAX_WORDS), 0, 8)
]
"""Row ``n``: the word masks keeping the first ``n`` bytes of a string."""


def padded(body: bytes) -> U8:
    out = np.zeros(PAD + len(body) + TAIL, np.uint8)
    out[PAD : PAD + len(body)] = np.frombuffer(body, np.uint8)
    return out


def windows(buf: U8, starts: I64, width: int) -> U8:
    """(m, width) bytes of ``buf`` from each body offset ``starts[i]`` on (may run past the
    token; from ``-PAD`` on, up to ``TAIL`` bytes past the body's end)."""
    # fancy indexing of an S view: one memcpy per token (np.take is 30x slower here)
    every = np.ndarray((buf.shape[0] - width + 1,), f"S{width}", buffer=buf, strides=(1,))
    return every[starts + PAD].view(np.uint8).reshape(-1, width)


def rows(buf: U8, starts: I64, lens: I64, words: int) -> U64:
    """(m, words) little-endian words holding each token's bytes, zero beyond its length."""
    w = windows(buf, starts, 8 * words).view(np.uint64)
    w &= np.take(_WORD_MASKS[:, :words], lens, axis=0)
    return w


def _any(flags: U8) -> Mask:
    """Rows of a (m, 24) 0/1 byte matrix with a 1."""
    w = flags.view(np.uint64)
    return (w[:, 0] | w[:, 1] | w[:, 2]) != 0  # type: ignore[no-any-return]


def _count(flags: U8) -> I64:
    """Ones per row of a (m, 24) 0/1 byte matrix."""
    w = flags.view(np.uint64)
    return (((w[:, 0] + w[:, 1] + w[:, 2]) * _ONES) >> np.uint64(56)).view(np.int64)


def right(buf: U8, starts: I64, lens: I64) -> tuple[U8, U8]:
    """Tokens right-aligned in 24 columns, and the 0/1 matrix of their columns."""
    m = windows(buf, starts + lens - W, W)
    return m, np.take(_RIGHT, np.minimum(lens, W), axis=0)


def unsigned(buf: U8, starts: I64, lens: I64) -> tuple[U64, Mask]:
    """Tokens of 1 to 19 digits as uint64 (exact)."""
    return unsigned_matrix(*right(buf, starts, lens), lens)


def unsigned_matrix(m: U8, inside: U8, lens: I64) -> tuple[U64, Mask]:
    """:func:`unsigned` of tokens already in a matrix (:func:`right`)."""
    digit = m - np.uint8(0x30)  # wraps: anything but a digit is > 9
    ok = ~_any((digit > 9).view(np.uint8) & inside) & (lens >= 1) & (lens <= 19)
    return (digit * inside) @ _POW10, ok


def integers(buf: U8, starts: I64, lens: I64) -> tuple[F64, Mask]:
    """``-?digits`` tokens (the suffix already cut) as float64; up to 18 digits."""
    neg = np.take(buf, starts + PAD) == 0x2D
    value, ok = unsigned(buf, starts + neg, lens - neg)
    ok &= lens - neg <= 18
    signed = value.astype(np.int64)
    return np.where(neg, -signed, signed).astype(np.float64), ok


def floats(buf: U8, starts: I64, lens: I64) -> tuple[F64, Mask]:
    """Decimal tokens ``-?D*(.D*)?([eE][+-]?D+)?`` with a mantissa digit, as Python's
    float() reads them; finite only."""
    m, inside = right(buf, starts, lens)
    m *= inside  # zero outside the token: neither digit nor dot
    lead = (W - np.minimum(lens, W)) + W * np.arange(lens.shape[0])
    neg = (m.reshape(-1)[lead] == 0x2D).view(np.uint8)
    digits = m - np.uint8(0x30)
    digit = (digits <= 9).view(np.uint8)
    dot = (m == 0x2E).view(np.uint8)
    ndig, ndot = _count(digit), _count(dot)
    # every character a digit, the one dot or the leading '-'
    plain = (ndig + ndot + neg == lens) & (ndot <= 1) & (ndig >= 1)
    short = plain & (lens <= 15)
    # up to 15 columns the digits, the dot a zero among them, sum exactly in a double
    value = (digits * digit).astype(np.float64) @ _F15
    frac = (ndot * (W - 1) - (dot @ _COLS).astype(np.int64)).clip(0, 19)  # digits after the dot
    scale = np.take(_FPOWERS, frac)
    low = np.fmod(value, scale)
    out = ((value - low) / (1 + 9 * ndot) + low) / scale  # the dot's zero taken out
    out *= 1 - 2 * neg.astype(np.float64)
    if bool(short.all()):
        return out, short
    long = np.flatnonzero(plain & ~short & (lens <= 19))
    if long.shape[0]:
        out[long], short[long] = _long_floats(m[long], digit[long], dot[long], neg[long] == 1)
    rest = np.flatnonzero(~short)
    if rest.shape[0]:
        v, ok = _general_floats(buf, starts[rest], lens[rest])
        out[rest] = v
        short[rest] = ok
    return out, short


def _long_floats(m: U8, digit: U8, dot: U8, neg: Mask) -> tuple[F64, Mask]:
    """16 to 19 characters without exponent: the same in uint64 (exact up to 2**53)."""
    value = ((m - np.uint8(0x30)) * digit) @ _POW10
    has_dot = _any(dot)
    frac = np.where(has_dot, (W - 1) - dot.argmax(axis=1), 0)
    low = value % np.take(_POWERS, frac)
    mantissa = np.where(has_dot, (value - low) // np.uint64(10) + low, value)
    out = mantissa.astype(np.float64) / np.take(_FPOWERS, frac)
    return np.where(neg, -out, out), mantissa <= _EXACT


def _general_floats(buf: U8, starts: I64, lens: I64) -> tuple[F64, Mask]:
    """Exponents, long tokens: validated here, converted by numpy's (correctly rounded) cast."""
    m = windows(buf, starts, W) * np.take(_LEFT, np.minimum(lens, W), axis=0)
    digit = (m >= 0x30) & (m <= 0x39)
    dot = m == 0x2E
    exp = (m == 0x65) | (m == 0x45)
    sign = (m == 0x2B) | (m == 0x2D)
    after_exp = np.zeros_like(exp)
    after_exp[:, 1:] = exp[:, :-1]
    lead_minus = np.zeros_like(exp)
    lead_minus[:, 0] = m[:, 0] == 0x2D
    e_at = np.where(exp.any(axis=1), exp.argmax(axis=1), lens)
    before_e = _cols < e_at[:, None]
    inside = _cols < lens[:, None]
    ok = (lens >= 1) & (lens <= W)
    ok &= ~(inside & ~(digit | dot | exp | sign)).any(axis=1)
    ok &= ~(sign & ~after_exp & ~lead_minus).any(axis=1)
    ok &= (dot.sum(axis=1) <= 1) & (exp.sum(axis=1) <= 1)
    ok &= ~(dot & ~before_e).any(axis=1)
    ok &= (digit & before_e).any(axis=1)
    ok &= (digit & ~before_e).any(axis=1) | (e_at == lens)
    out = np.zeros(lens.shape[0], np.float64)
    if ok.any():
        out[ok] = np.ascontiguousarray(m[ok]).view(f"S{W}").reshape(-1).astype(np.float64)
    ok &= np.isfinite(out)
    return out, ok


def _packed(words: list[bytes]) -> U64:
    return np.array([int.from_bytes(x, "little") for x in words], dtype=np.uint64)


_TRUE = _packed([b"t", b"T", b"true", b"True", b"TRUE"])
_FALSE = _packed([b"f", b"F", b"false", b"False", b"FALSE"])


def booleans(buf: U8, starts: I64, lens: I64) -> tuple[F64, Mask]:
    """InfluxDB's ten spellings of true and false as 1.0 / 0.0."""
    word = rows(buf, starts, np.minimum(lens, 8), 1)[:, 0]
    true = np.isin(word, _TRUE)
    ok = (true | np.isin(word, _FALSE)) & (lens <= 5)
    return true.astype(np.float64), ok
