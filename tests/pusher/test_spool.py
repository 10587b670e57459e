"""The on-disk keep of readings unsent at stop: round trip, absence, damage."""

from __future__ import annotations

from pathlib import Path

from services.pusher import spool
from services.pusher.formats import Message


def test_round_trip_then_the_file_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "state" / "unsent.bin"
    msgs = [
        Message("/KELVIN_BATCH//n/t", b"KVB1" + bytes(range(40)), 7),
        Message("/n/x", b"\x00" * 16, 1),
    ]
    assert spool.save(path, msgs) == 8
    assert spool.load(path) == msgs
    assert not path.exists()
    assert spool.load(path) == []


def test_a_damaged_file_is_set_aside_not_half_read(tmp_path: Path) -> None:
    path = tmp_path / "unsent.bin"
    spool.save(path, [Message("/n/x", b"\x01" * 32, 2)])
    path.write_bytes(path.read_bytes()[:-9])  # cut into the last record
    assert spool.load(path) == []
    assert not path.exists() and (tmp_path / "unsent.damaged").exists()
