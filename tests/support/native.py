"""The compiled core in tests: each fast path is tested as compiled and as numpy code.

A test of the compiled variant needs ``services.common._native`` built
(``pip install -e .`` with a C compiler); without it the test skips, and fails
under ``CI=true``, where ``make test`` builds it.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from services.common import native

CORES = ["compiled", "numpy"]


def require_native() -> ModuleType:
    core = native.module()
    if core is not None:
        return core
    msg = f"the compiled core is {native.describe()}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


def core_param(core: str) -> str:
    """``core`` for a test parametrized over :data:`CORES` (skips compiled when absent)."""
    if core == "compiled":
        require_native()
    return core
