"""Where the keys, fields and timestamps of plain lines are: a body's separators at once.

A plain line has no backslash, tab or NUL (and its quotes, if any, pair up
around string values: their separators are taken out first, see :mod:`.quotes`),
so every space, comma, ``=`` and newline left in it is a separator, and its separators must read
``(,=)* SP =(,=)* [SP] NL`` (tags, then fields, then an optional timestamp)
with no empty token between two of them. :func:`layout` checks that for every
line together and returns the positions of each line's key and each field's
key and value; lines that fail are reported, for the reference parser.

When every line of the body has the same separators (a body of one kind of
metric, the usual case), the separators form a matrix, one row per line, and
a single row is checked as the template for all: that costs a few operations
whatever the body; otherwise a table of allowed (section, previous separator,
separator) triples checks every separator in a few more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]

# A separator's class is its low nibble: newline 0xA, space 0x0, comma 0xC, '=' 0xD.
NL, COMMA, EQ, SP = 0x0A, 0x0C, 0x0D, 0x00


def _allowed() -> Mask:
    """[section, previous separator, separator] of a plain line's separator sequence."""
    ok = np.zeros((4, 16, 16), bool)
    ok[0, NL, [COMMA, SP]] = True  # measurement, then a tag or the fields
    ok[0, COMMA, EQ] = True
    ok[0, EQ, [COMMA, SP]] = True
    ok[1, SP, EQ] = True  # fields: key=value(,key=value)*
    ok[1, EQ, [COMMA, SP, NL]] = True
    ok[1, COMMA, EQ] = True
    ok[2, SP, NL] = True  # the timestamp
    return ok.reshape(-1)


_ALLOWED = _allowed()


@dataclass(slots=True)
class Layout:
    """Positions (body offsets) in the plain lines of a body, and the lines that are not."""

    lines: I64
    """Segment (0-based line) of each plain line, ascending."""
    key_start: I64
    key_len: I64
    f_line: I64
    """Per field, in line order: index into ``lines``."""
    f_first: Mask
    """Whether the field is the first of its line."""
    fk_start: I64
    fk_len: I64
    v_start: I64
    v_len: I64
    t_line: I64
    """Indices into ``lines`` of the lines with a timestamp."""
    t_start: I64
    t_len: I64
    bad: I64
    """Segments whose separators are not those of a plain line."""


def separators(buf: U8, pad: int, n: int) -> tuple[I64, U8, I64]:
    """(offset, class, segment) of every separator of the body ``buf[pad : pad + n]``
    (zero after it); each segment's list ends with its newline (the body's end counts
    as one)."""
    raw = buf[pad : pad + n]
    seps = np.flatnonzero((raw == 0x20) | (raw == 0x2C) | (raw == 0x3D) | (raw == 0x0A))
    codes = buf[seps + pad] & np.uint8(0x0F)
    if n and raw[-1] != 0x0A:  # the body's end as a newline
        seps = np.concatenate((seps, [n]))
        codes = np.concatenate((codes, np.array([NL], np.uint8)))
    is_nl = codes == NL
    return seps, codes, np.cumsum(is_nl) - is_nl


def layout(starts: I64, seps: I64, codes: U8, seg: I64) -> Layout:
    lines = np.flatnonzero(codes == NL)
    k = int(lines[0]) + 1 if lines.shape[0] else 0
    if k and seps.shape[0] == k * lines.shape[0]:
        grid = codes.reshape(-1, k)
        shape = _template(grid[0].tolist())
        if shape is not None and bool((grid == grid[0]).all()):
            return _uniform(starts, seps.reshape(-1, k), seg[lines], *shape)
    return _general(starts, seps, codes, seg)


def _template(codes: list[int]) -> tuple[int, list[int], int | None] | None:
    """(key space column, field '=' columns, timestamp space column) of a plain line's
    separator sequence, or None when it is not one."""
    section, prev = 0, NL
    eqs: list[int] = []
    spaces: list[int] = []
    for col, c in enumerate(codes):
        if not _ALLOWED[min(section, 3) * 256 + prev * 16 + c]:
            return None
        if c == EQ and section == 1:
            eqs.append(col)
        if c == SP:
            spaces.append(col)
            section += 1
        prev = c
    return spaces[0], eqs, spaces[1] if len(spaces) > 1 else None


def _uniform(
    starts: I64, grid: I64, segs: I64, key_sp: int, eqs: list[int], ts_sp: int | None
) -> Layout:
    """Every line has the template's separators: positions are columns of the grid."""
    begin = starts[segs]
    gaps = grid[:, 1:] - grid[:, :-1]
    bad = np.zeros(0, np.int64)
    if int(gaps.min()) <= 1 or int((grid[:, 0] - begin).min()) <= 0:  # an empty token
        short = (grid[:, 0] <= begin) | (gaps <= 1).any(axis=1)
        bad = segs[short]
        grid, segs, begin = grid[~short], segs[~short], begin[~short]
    nlines, nf = grid.shape[0], len(eqs)
    eq = grid[:, eqs]
    fk_start = grid[:, [e - 1 for e in eqs]] + 1
    v_start = eq + 1
    v_end = grid[:, [e + 1 for e in eqs]]
    if ts_sp is None:
        t_line = t_start = t_len = np.zeros(0, np.int64)
    else:
        t_line = np.arange(nlines)
        t_start = grid[:, ts_sp] + 1
        t_len = grid[:, -1] - t_start
    first = np.zeros(nf, bool)
    first[0] = True
    return Layout(
        lines=segs,
        key_start=begin,
        key_len=grid[:, key_sp] - begin,
        f_line=np.arange(nlines) if nf == 1 else np.repeat(np.arange(nlines), nf),
        f_first=np.ones(nlines, bool) if nf == 1 else np.tile(first, nlines),
        fk_start=fk_start.reshape(-1),
        fk_len=(eq - fk_start).reshape(-1),
        v_start=v_start.reshape(-1),
        v_len=(v_end - v_start).reshape(-1),
        t_line=t_line,
        t_start=t_start,
        t_len=t_len,
        bad=bad,
    )


def _general(starts: I64, seps: I64, codes: U8, seg: I64) -> Layout:
    """Lines of different shapes: every separator checked against its predecessor."""
    prev = np.empty_like(codes)
    prev[:1] = NL
    prev[1:] = codes[:-1]
    line_first = prev == NL
    tok = np.empty_like(seps)
    tok[1:] = seps[:-1] + 1
    tok[line_first] = starts[seg[line_first]]
    is_sp = codes == SP
    before = np.cumsum(is_sp) - is_sp
    section = before - before[line_first][np.cumsum(line_first) - 1]
    state = np.minimum(section, 3) * 256 + prev.astype(np.int64) * 16 + codes
    ok = _ALLOWED[state] & (seps > tok)
    bad = np.zeros(0, np.int64)
    if not ok.all():
        bad = np.unique(seg[~ok])
        keep = ~np.isin(seg, bad)
        seps, codes, seg, tok, section, prev = (
            seps[keep], codes[keep], seg[keep], tok[keep], section[keep], prev[keep]
        )  # fmt: skip
        is_sp = codes == SP
    at_key_sp = is_sp & (section == 0)
    ordinal = np.cumsum(at_key_sp) - 1  # of each separator's line among the lines kept
    key_sp = np.flatnonzero(at_key_sp)
    lines = seg[key_sp]
    key_start = starts[lines]
    eq = np.flatnonzero((codes == EQ) & (section == 1))
    ts_sp = np.flatnonzero(is_sp & (section == 1))
    t_start = seps[ts_sp] + 1
    return Layout(
        lines=lines,
        key_start=key_start,
        key_len=seps[key_sp] - key_start,
        f_line=ordinal[eq],
        f_first=prev[eq] == SP,
        fk_start=tok[eq],
        fk_len=seps[eq] - tok[eq],
        v_start=seps[eq] + 1,
        v_len=seps[eq + 1] - seps[eq] - 1,
        t_line=ordinal[ts_sp],
        t_start=t_start,
        t_len=seps[ts_sp + 1] - t_start,
        bad=bad,
    )
