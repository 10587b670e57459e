"""Counting the embedded backend's chunk decodes (what a read pays per stored chunk)."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.storage import chunks


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Chunk decodes from now on (until the monkeypatch is undone), one entry each."""
    decoded: list[int] = []
    decode = chunks.decode

    def counted(*args: Any) -> Any:
        decoded.append(1)
        return decode(*args)

    monkeypatch.setattr(chunks, "decode", counted)
    return decoded
