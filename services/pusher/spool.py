"""Readings left unsent at shutdown, kept on disk until a broker acknowledges them.

When the pusher stops while no broker takes its readings (a rolling update
during a broker outage, a node reboot), the buffered readings are encoded as
the MQTT messages they would have been and written to ``<state_dir>/unsent.bin``
(atomically: a temporary file, fsync, rename). The next start sends them first
and removes the file only once every one of them is acknowledged (PUBACK), so
a kill -9 or a power cut before that loses nothing: the file is still there and
its readings go out again at the following start (at-least-once; the collect
agent's storage stores a reading once per sensor and timestamp). A stop before
they are all acknowledged writes the file anew with what is still unsent.

Records: ``u32 topic length, topic (UTF-8), u32 payload length, payload, u32
readings``, little-endian, after an 8-byte magic. A damaged file is set aside
(``.damaged``), never half-read silently.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from pathlib import Path

from services.pusher.formats import Message

log = logging.getLogger(__name__)

MAGIC = b"KPSPOOL1"
_U32 = struct.Struct("<I")


def save(path: Path, messages: list[Message]) -> int:
    """Write ``messages`` atomically (replacing the file); returns the readings saved."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        for m in messages:
            topic = m.topic.encode("utf-8")
            f.write(_U32.pack(len(topic)) + topic + _U32.pack(len(m.payload)))
            f.write(m.payload)
            f.write(_U32.pack(m.readings))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)
    return sum(m.readings for m in messages)


def read(path: Path) -> list[Message]:
    """The messages saved at the last stop, the file left in place; [] if there is none.

    A damaged file is moved to ``<name>.damaged`` (and logged) and reads as empty.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[Message] = []
    try:
        if not data.startswith(MAGIC):
            raise ValueError("bad magic")
        pos = len(MAGIC)
        while pos < len(data):
            (n,) = _U32.unpack_from(data, pos)
            topic = data[pos + 4 : pos + 4 + n].decode("utf-8")
            pos += 4 + n
            (n,) = _U32.unpack_from(data, pos)
            payload = data[pos + 4 : pos + 4 + n]
            if len(payload) != n:
                raise ValueError("truncated payload")
            pos += 4 + n
            (readings,) = _U32.unpack_from(data, pos)
            pos += 4
            out.append(Message(topic, payload, readings))
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        damaged = path.with_suffix(".damaged")
        os.replace(path, damaged)
        log.error("unsent readings in %s are damaged (%s); moved to %s", path, exc, damaged)
        return []
    return out


def remove(path: Path) -> None:
    """Forget the file (its readings were all acknowledged)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        _sync_dir(path.parent)


def load(path: Path) -> list[Message]:
    """The messages saved at the last stop, and the file removed ([] if there is none).

    For tools that take the readings over; the pusher itself uses :func:`read` and
    removes the file only when its readings are acknowledged.
    """
    out = read(path)
    remove(path)
    return out


def _sync_dir(directory: Path) -> None:
    # The rename (or unlink) is durable only once the directory is.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
