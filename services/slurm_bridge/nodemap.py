"""Which Slurm node is which hall node: the explicit mapping, validated at start.

Two ways to write it (``slurm_bridge`` settings):

- ``node_names: "n[01-40]"`` — a Slurm host list, one name per *present* hall
  node in index order (``i = row*racks*slots + rack*slots + slot``);
- ``node_map: {n01: 0, gpu1: "row1/rack4/slot3", ...}`` — each Slurm node to a
  hall index or a ``row/rack/slot`` position.

At start the mapping is checked against the allocator's hall (every target
exists and is present, no node twice) and against Slurm (every mapped name
is a Slurm node). Slurm nodes outside the mapping are not Kelvin's to place:
jobs on them are ignored. Hall nodes nobody maps are never given out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.common.errors import ConfigError
from services.slurm_bridge import hostlist

_POSITION = re.compile(r"^row(\d+)/rack(\d+)/(?:slot|node)(\d+)$")


class NodeMapError(ConfigError):
    """The hall <-> Slurm mapping is inconsistent."""


@dataclass(frozen=True)
class HallLayout:
    """What the bridge needs of the allocator's hall (``GET /api/v1/hall``)."""

    name: str
    rows: int
    racks: int
    slots: int
    present: frozenset[int]

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> HallLayout:
        try:
            present = frozenset(int(n["index"]) for n in doc["nodes"] if n.get("present", True))
            return cls(
                str(doc["name"]), int(doc["rows"]), int(doc["racks"]), int(doc["slots"]), present
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise NodeMapError(f"allocator hall document unreadable: {exc!r}") from exc

    @property
    def n(self) -> int:
        return self.rows * self.racks * self.slots


class NodeMap:
    """Slurm node name <-> hall index, both ways."""

    def __init__(self, pairs: dict[str, int], layout: HallLayout) -> None:
        self.layout = layout
        self.index_of = dict(pairs)
        self.name_of = {i: name for name, i in pairs.items()}

    @classmethod
    def build(
        cls, layout: HallLayout, node_names: str | None, node_map: dict[str, Any] | None
    ) -> NodeMap:
        if (node_names is None) == (node_map is None):
            raise NodeMapError(
                "slurm_bridge: set exactly one of node_names (a host list in hall order, e.g. "
                "'n[01-40]') and node_map ({slurm name: hall index or 'rowR/rackK/slotS'})"
            )
        if node_names is not None:
            names = hostlist.expand(node_names)
            order = sorted(layout.present)
            if len(names) != len(order):
                raise NodeMapError(
                    f"slurm_bridge.node_names {node_names!r} has {len(names)} names; hall "
                    f"{layout.name!r} has {len(order)} present nodes (one name each, in index order)"
                )
            pairs = dict(zip(names, order, strict=True))
            if len(pairs) != len(names):
                raise NodeMapError(f"slurm_bridge.node_names {node_names!r} repeats a name")
        else:
            assert node_map is not None
            pairs = {str(k): cls._index(layout, str(k), v) for k, v in node_map.items()}
        seen: dict[int, str] = {}
        for name, i in pairs.items():
            if i in seen:
                raise NodeMapError(
                    f"slurm_bridge: Slurm nodes {seen[i]!r} and {name!r} map to hall node {i}"
                )
            if i not in layout.present:
                raise NodeMapError(
                    f"slurm_bridge: Slurm node {name!r} maps to hall node {i}, which hall "
                    f"{layout.name!r} does not have (0..{layout.n - 1}, present only)"
                )
            seen[i] = name
        return cls(pairs, layout)

    @staticmethod
    def _index(layout: HallLayout, name: str, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        m = _POSITION.match(str(value).strip("/"))
        if m is None:
            raise NodeMapError(
                f"slurm_bridge.node_map[{name!r}] = {value!r}: expected a hall index or "
                "'rowR/rackK/slotS'"
            )
        row, rack, slot = (int(g) for g in m.groups())
        if not (row < layout.rows and rack < layout.racks and slot < layout.slots):
            raise NodeMapError(
                f"slurm_bridge.node_map[{name!r}] = {value!r} is outside hall {layout.name!r} "
                f"({layout.rows} rows x {layout.racks} racks x {layout.slots} slots)"
            )
        return row * layout.racks * layout.slots + rack * layout.slots + slot

    def check_slurm(self, slurm_names: Iterable[str]) -> list[str]:
        """Mapped names Slurm does not know (an error at start); returns Slurm's unmapped ones."""
        known = set(slurm_names)
        missing = sorted(set(self.index_of) - known)
        if missing:
            raise NodeMapError(
                f"slurm_bridge: Slurm has no node {', '.join(missing[:10])}"
                f"{' ...' if len(missing) > 10 else ''} (mapped to the hall); check node_names/"
                "node_map against `sinfo -N`"
            )
        return sorted(known - set(self.index_of))

    def indices(self, names: Iterable[str]) -> list[int]:
        """Hall indices of the mapped ones among ``names``."""
        return sorted(self.index_of[n] for n in names if n in self.index_of)

    def names(self, indices: Iterable[int]) -> list[str]:
        return [self.name_of[i] for i in indices]
