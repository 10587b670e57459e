"""Kelvin's optional compiled core: ``services.common._native``, C sources in ``csrc/``.

``pip install -e .`` (so ``make up`` and ``make test``) builds it when a C compiler
and Python's headers are there. Without them the install goes on without it, and
every user of the core runs its numpy code instead: the same answers, bit for bit
(the tests hold both to that), only slower. :func:`describe` says which is active;
``KELVIN_NATIVE=0`` turns the core off (to compare, or to rule it out).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

ABI = 2
"""What the Python side expects (``KELVIN_NATIVE_ABI`` in csrc/native.h): a module built
from older sources is not used."""

_loaded: tuple[ModuleType | None, str] | None = None


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("KELVIN_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "turned off (KELVIN_NATIVE=0)"
    try:
        module = importlib.import_module("services.common._native")
    except ImportError as exc:
        return None, (
            f"not built ({exc}); `pip install -e .` builds it where a C compiler and "
            "the Python headers are installed"
        )
    if getattr(module, "ABI", None) != ABI:
        return None, "built from older sources; rebuild it with `pip install -e .`"
    module.init_pow10(_pow10_table())
    return module, "compiled core"


def _pow10_table() -> bytes:
    """Schubfach's g(e) for e = -292..324 (csrc/encode.c): 10^e scaled into [2^127, 2^128),
    rounded down, plus one; exact, from Python's integers. (hi, lo) little-endian pairs."""
    out = bytearray()
    for e in range(-292, 325):
        if e >= 0:
            p = 10**e
            shift = p.bit_length() - 128  # 10^e = g * 2^shift
            g = (p >> shift if shift >= 0 else p << -shift) + 1
        else:
            p = 10**-e  # not a power of two: floor(log2(10^e)) = -p.bit_length()
            g = (1 << (p.bit_length() + 127)) // p + 1
        assert 1 << 127 <= g < 1 << 128
        out += (g >> 64).to_bytes(8, "little") + (g & ((1 << 64) - 1)).to_bytes(8, "little")
    return bytes(out)


_PROBES = (0.0, -0.0, 1.0, -1.5, 0.1, 1e-5, 1.5e-6, 1e15, 1e16, 2.5e-320, 5e-324,
           1.7976931348623157e308, 123456789.125, 0.30000000000000004, 250.123)  # fmt: skip


_encoders: tuple[ModuleType | None] | None = None


def encoders() -> ModuleType | None:
    """The compiled core if its JSON and CSV encoders write doubles byte for byte as the
    installed orjson (whose layout the query API's answers have), else None: checked
    once, on a few probes."""
    global _encoders
    if _encoders is None:
        core = module()
        if core is not None and core.HAVE_DOUBLES:
            import orjson

            want = orjson.dumps(list(_PROBES)).decode()[1:-1].split(",")
            if [core.format_double(v) for v in _PROBES] != want:
                core = None
        _encoders = (core,)
    return _encoders[0]


def module() -> ModuleType | None:
    """The compiled core, or None when it is absent, stale or turned off."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded[0]


def describe() -> str:
    """Why the compiled core is or is not in use, for the logs."""
    module()
    assert _loaded is not None
    return _loaded[1]
