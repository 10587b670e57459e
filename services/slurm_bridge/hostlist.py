"""Slurm host lists: ``n[01-04,7],gpu1`` <-> ``["n01", "n02", "n03", "n04", "n7", "gpu1"]``.

Slurm writes node sets compactly (``scontrol show hostnames`` expands them);
the bridge reads them from job records and writes exact lists back, so both
directions live here. Ranges keep their zero padding (``[08-10]`` gives
``08 09 10``); several bracket groups in one name multiply (``r[1-2]n[1-2]``).
"""

from __future__ import annotations

import re

from services.common.errors import KelvinError

MAX_HOSTS = 1_000_000
"""Longest list one expression may expand to (a typo like ``n[1-999999999]`` is refused)."""


class HostlistError(KelvinError, ValueError):
    """A host list that is not valid Slurm syntax."""


def expand(text: str) -> list[str]:
    """Every host name of a Slurm host list, in order (duplicates kept)."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        if item:
            out.extend(_expand_one(item, text))
        if len(out) > MAX_HOSTS:
            raise HostlistError(f"host list {text[:60]!r} expands to more than {MAX_HOSTS} names")
    return out


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"host list {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"host list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


_GROUP = re.compile(r"\[([^\]]*)\]")


def _expand_one(item: str, whole: str) -> list[str]:
    m = _GROUP.search(item)
    if m is None:
        return [item]
    prefix, rest = item[: m.start()], item[m.end() :]
    tails = _expand_one(rest, whole) if rest else [""]
    names: list[str] = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"host list {whole!r}: range {part!r} is not N or N-M")
        width = len(lo) if lo.startswith("0") or (sep and len(lo) == len(hi)) else 0
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise HostlistError(f"host list {whole!r}: range {part!r} runs backwards")
        if (b - a + 1) * len(tails) > MAX_HOSTS:
            raise HostlistError(f"host list {whole[:60]!r} expands to more than {MAX_HOSTS} names")
        names.extend(f"{prefix}{k:0{width}d}{t}" for k in range(a, b + 1) for t in tails)
    return names


_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)$")


def compress(names: list[str]) -> str:
    """A compact host list for ``names`` (order kept within each prefix run)."""
    parts: list[str] = []
    run: tuple[str, int, list[int]] | None = None  # prefix, digit width, numbers
    for name in names:
        m = _TAIL_NUMBER.match(name)
        if m is None:
            if run:
                parts.append(_format_run(*run))
                run = None
            parts.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") else 0
        if run and run[0] == prefix and run[1] == width:
            run[2].append(int(digits))
        else:
            if run:
                parts.append(_format_run(*run))
            run = (prefix, width, [int(digits)])
    if run:
        parts.append(_format_run(*run))
    return ",".join(parts)


def _format_run(prefix: str, width: int, numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    ranges: list[str] = []
    lo = prev = numbers[0]
    for k in [*numbers[1:], None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        ranges.append(f"{lo:0{width}d}" if lo == prev else f"{lo:0{width}d}-{prev:0{width}d}")
        if k is not None:
            lo = prev = k
    return f"{prefix}[{','.join(ranges)}]"
