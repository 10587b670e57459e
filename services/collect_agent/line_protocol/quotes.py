"""Quoted string fields the fast path can take: ``key="text, with = and spaces"``.

InfluxDB's line scanner toggles "quoted" at a ``"`` only after the line's first
space and only while it has seen more unquoted ``=`` than ``,`` there; inside
quotes a newline does not end the line. A line (without backslashes) is plain
for the fast path when every quote in it opens right after a field's ``=`` or
closes right before ``,``, a space or the line's end, in pairs, and the scanner
would toggle at each of them (checked with running counts of the separators
outside the pairs). Then its quotes pair up as they look, no newline is
quoted, and the separators between each pair are text, not structure. Any
other line with a quote goes to the reference parser, with the lines it may
run on into.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from services.collect_agent.line_protocol.layout import COMMA, EQ, SP

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]
_CLOSE_BEFORE = np.array([0x2C, 0x20, 0x0A, 0x00], np.uint8)  # ',', ' ', newline, the body's end


def check(
    buf: U8, pad: int, starts: I64, q: I64, qseg: I64, seps: I64, codes: U8, seg: I64
) -> tuple[Mask, Mask]:
    """(segments whose quotes are not plain, separators inside plain quote pairs).

    ``q``/``qseg``: every quote's offset and segment; ``seps``/``codes``/``seg``: every
    separator of the body (layout.separators with nothing filtered)."""
    nseg = starts.shape[0]
    bad = np.bincount(qseg, minlength=nseg) % 2 == 1
    first_q = np.searchsorted(qseg, qseg)  # index of its segment's first quote
    opening = (np.arange(q.shape[0]) - first_q) % 2 == 0
    spaces = np.append(seps[codes == SP], np.iinfo(np.int64).max)  # none left: never before q
    fs = spaces[np.searchsorted(spaces, starts[qseg])]
    ok = fs < q
    before, after = buf[q - 1 + pad], buf[q + 1 + pad]
    ok &= np.where(opening, before == 0x3D, np.isin(after, _CLOSE_BEFORE))
    # separators between a segment's pairs are text: a quote count before them that is odd
    quotes_before = np.searchsorted(q, seps) - np.searchsorted(q, starts[seg])
    inside = quotes_before % 2 == 1
    counted = ~inside
    eqs = np.cumsum(counted & (codes == EQ))
    commas = np.cumsum(counted & (codes == COMMA))
    k_q = np.searchsorted(seps, q) - 1  # the last separator before each quote
    k_fs = np.minimum(np.searchsorted(seps, fs), seps.shape[0] - 1)  # the line's first space
    e = eqs[np.maximum(k_q, 0)] - eqs[k_fs]
    c = commas[np.maximum(k_q, 0)] - commas[k_fs]
    ok &= (k_q >= k_fs) & (e > c)  # InfluxDB's scanner toggles here, as the pairing says
    bad[qseg[~ok]] = True
    return bad, inside & ~bad[seg]
