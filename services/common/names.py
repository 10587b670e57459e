"""Hierarchical sensor names: one name is one MQTT topic is one sensor.

A name is a path such as ``/dc/row0/rack3/node2/power``: a leading ``/``,
levels separated by ``/``, none empty, no MQTT wildcards (``+`` ``#``), no NUL,
bounded in total length, depth and level length. Control topics of the DCDB
protocol (``/DCDB_MAP/...``) are not sensor names; see :mod:`services.common.codec`.
"""

from __future__ import annotations

from functools import lru_cache

from services.common.errors import SensorNameError

MAX_NAME_BYTES = 1024
"""Longest accepted name in UTF-8 bytes (MQTT allows 65535; storage keys must stay small)."""
MAX_LEVELS = 32
"""Deepest accepted hierarchy."""
MAX_LEVEL_CHARS = 255
"""Longest accepted single level."""

_FORBIDDEN = ("+", "#", "\x00")


def validate(name: str) -> str:
    """Return ``name`` unchanged if it is a valid sensor name, else raise SensorNameError."""
    return _validate_cached(name)


@lru_cache(maxsize=65536)
def _validate_cached(name: str) -> str:
    # Cached because the same few thousand topics arrive over and over on the ingest path.
    if not isinstance(name, str):
        raise SensorNameError(f"sensor name must be a string, got {type(name).__name__}")
    if not name.startswith("/"):
        raise SensorNameError(f"sensor name {name!r} must start with '/'")
    if len(name) == 1:
        raise SensorNameError("sensor name '/' has no levels; expected e.g. '/host0/power'")
    for ch in _FORBIDDEN:
        if ch in name:
            what = "NUL byte" if ch == "\x00" else f"MQTT wildcard {ch!r}"
            raise SensorNameError(f"sensor name {name!r} contains a {what}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise SensorNameError(f"sensor name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
    levels = name[1:].split("/")
    if len(levels) > MAX_LEVELS:
        raise SensorNameError(
            f"sensor name {name!r} has {len(levels)} levels; at most {MAX_LEVELS} are allowed"
        )
    for i, level in enumerate(levels):
        if not level:
            raise SensorNameError(
                f"sensor name {name!r} has an empty level at position {i + 1} ('//' or trailing '/')"
            )
        if len(level) > MAX_LEVEL_CHARS:
            raise SensorNameError(
                f"sensor name {name!r}: level {i + 1} is longer than {MAX_LEVEL_CHARS} characters"
            )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SensorNameError(f"sensor name {name!r} is not valid UTF-8") from exc
    return name


def validate_prefix(prefix: str) -> str:
    """Validate a hierarchy prefix for browsing: ``/`` (the root) or a valid name.

    A trailing ``/`` is tolerated and removed.
    """
    if prefix in ("", "/"):
        return "/"
    if prefix.endswith("/"):
        prefix = prefix[:-1]
    return validate(prefix)


def levels(name: str) -> list[str]:
    """``/a/b/c`` -> ``['a', 'b', 'c']``."""
    return name[1:].split("/") if name != "/" else []


def parent(name: str) -> str:
    """``/a/b/c`` -> ``/a/b``; the parent of a top-level name is ``/``."""
    head = name.rsplit("/", 1)[0]
    return head or "/"


def join(prefix: str, *parts: str) -> str:
    """Join a prefix and relative parts into a name, without validating."""
    base = "" if prefix == "/" else prefix.rstrip("/")
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return f"{base}/{tail}" if tail else (base or "/")


def is_under(name: str, prefix: str) -> bool:
    """True if ``name`` equals ``prefix`` or lies below it in the hierarchy."""
    if prefix == "/":
        return True
    return name == prefix or name.startswith(prefix + "/")


def child_of(name: str, prefix: str) -> str | None:
    """The direct child of ``prefix`` on the way to ``name`` (full name), or None."""
    if not is_under(name, prefix) or name == prefix:
        return None
    base = "" if prefix == "/" else prefix
    rest = name[len(base) + 1 :]
    return f"{base}/{rest.split('/', 1)[0]}"
