"""The optional compiled core (services/common/csrc): everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build goes on without
it and Kelvin runs its numpy code instead (services/common/native.py says which;
tests/common/test_native.py builds it with no compiler to hold the build to that).
"""

from pathlib import Path

from setuptools import Extension, setup


def native_extension() -> Extension | None:
    """The compiled core, or None without its sources: the image's dependency layer
    installs from pyproject.toml alone, and an extension of no sources would leave a
    module without an entry point in build/, newer than the sources copied in later."""
    csrc = Path(__file__).resolve().parent / "services/common/csrc"
    if not list(csrc.glob("*.c")):
        return None
    return Extension(
        "services.common._native",
        sources=sorted(str(p.relative_to(csrc.parents[2])) for p in csrc.glob("*.c")),
        depends=[str(p.relative_to(csrc.parents[2])) for p in csrc.glob("*.h")],
        extra_compile_args=["-O2", "-std=c11", "-fno-strict-aliasing", "-Wall"],
        optional=True,
    )


if __name__ == "__main__":  # (setuptools runs this file as __main__)
    ext = native_extension()
    setup(ext_modules=[ext] if ext is not None else [])
