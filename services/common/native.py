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

ABI = 1
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
    return module, "compiled core"


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
