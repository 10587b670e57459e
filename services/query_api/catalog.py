"""What sensors exist: stored ones (storage) and virtual ones (their definitions), as one view.

Virtual sensors are not in the storage's sensor table (their results are a
cache, not readings), so browsing, units and wildcards merge them in here.
"""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass
from typing import Any

from services.common import names
from services.common.storage.base import StorageBackend


@dataclass(frozen=True, slots=True)
class Entry:
    """One child under a prefix, for the hierarchy browser."""

    name: str
    is_sensor: bool
    has_children: bool
    is_virtual: bool = False

    @property
    def label(self) -> str:
        return self.name.rsplit("/", 1)[-1]


class Catalog:
    """Merged view of stored and virtual sensors; virtual definitions cached for ``ttl_s``."""

    def __init__(self, storage: StorageBackend, ttl_s: float = 1.0) -> None:
        self.storage = storage
        self.ttl_s = ttl_s
        self._defs: dict[str, dict[str, Any]] | None = None
        self._loaded_at = 0.0

    def invalidate(self) -> None:
        """Forget cached definitions (after a define or delete in this process)."""
        self._defs = None

    async def virtual_defs(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        if self._defs is None or now - self._loaded_at > self.ttl_s:
            self._defs = await self.storage.list_virtual()
            self._loaded_at = now
        return self._defs

    async def virtual(self, name: str) -> dict[str, Any] | None:
        return (await self.virtual_defs()).get(name)

    async def exists(self, name: str) -> bool:
        return name in await self.virtual_defs() or await self.storage.has_sensor(name)

    async def unit(self, name: str) -> str | None:
        """The sensor's unit: a virtual sensor's declared unit, else its metadata's."""
        vdef = await self.virtual(name)
        if vdef is not None:
            return str(vdef.get("unit") or "") or None
        meta = await self.storage.get_metadata(name)
        return meta.unit if meta is not None else None

    async def children(self, prefix: str) -> list[Entry] | None:
        """Direct children of ``prefix``; None when nothing exists at or below it."""
        kids: dict[str, Entry] = {
            c.name: Entry(c.name, c.is_sensor, c.has_children)
            for c in await self.storage.children(prefix)
        }
        for vname in await self.virtual_defs():
            child = names.child_of(vname, prefix)
            if child is None:
                continue
            old = kids.get(child)
            is_leaf = child == vname
            kids[child] = Entry(
                child,
                (old.is_sensor if old else False) or is_leaf,
                (old.has_children if old else False) or not is_leaf,
                (old.is_virtual if old else False) or is_leaf,
            )
        if not kids and prefix != "/" and not await self.exists(prefix):
            return None
        return [kids[k] for k in sorted(kids)]

    async def sensors(self, prefix: str = "/") -> list[str]:
        """Every stored and virtual sensor name under ``prefix``, sorted."""
        found = set(await self.storage.sensors(prefix))
        found.update(v for v in await self.virtual_defs() if names.is_under(v, prefix))
        return sorted(found)

    async def expand(self, pattern: str) -> list[str]:
        """Names matching a wildcard pattern: ``*`` matches within one level, ``**`` any levels."""
        if "*" not in pattern:
            return [pattern] if await self.exists(pattern) else []
        fixed = pattern.split("*", 1)[0]
        base = names.parent(fixed + "x") if not fixed.endswith("/") else fixed.rstrip("/") or "/"
        rx = compile_pattern(pattern)
        return [n for n in await self.sensors(base) if rx.fullmatch(n)]

    async def suggest(self, name: str, limit: int = 3) -> list[str]:
        """Sensors whose names are close to ``name``, a typo in any level ("did you mean").

        Level by level from the root: the same segment where it exists, else the
        closest few children (difflib); at most ``limit`` paths are followed, so
        the cost is a few ``children`` lookups however large the hierarchy.
        """
        beam: list[tuple[float, str]] = [(1.0, "/")]
        segments = [s for s in name.split("/") if s]
        for depth, seg in enumerate(segments):
            last = depth == len(segments) - 1
            found: list[tuple[float, str]] = []
            for score, prefix in beam:
                kids = {
                    e.label: e for e in await self.children(prefix) or () if e.is_sensor or not last
                }
                if seg in kids:
                    found.append((score, kids[seg].name))
                    continue
                for label in difflib.get_close_matches(seg, list(kids), n=limit, cutoff=0.6):
                    ratio = difflib.SequenceMatcher(None, seg, label).ratio()
                    found.append((score * ratio, kids[label].name))
            beam = sorted(found, reverse=True)[:limit]
            if not beam:
                return []
        return [n for _, n in beam if n != name]

    async def missing(self, name: str) -> str:
        """The message for a sensor that does not exist, with the closest names."""
        close = await self.suggest(name)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return f"sensor {name!r} does not exist{hint}"


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``*`` = any characters except ``/``; ``**`` = any characters; ``?`` = one character."""
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    out = []
    for p in parts:
        if p == "**":
            out.append(".*")
        elif p == "*":
            out.append("[^/]*")
        elif p == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(p))
    return re.compile("".join(out))
