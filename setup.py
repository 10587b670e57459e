"""The optional compiled core (services/common/csrc): everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build goes on without
it and Kelvin runs its numpy code instead (services/common/native.py says which;
tests/common/test_native.py builds it with no compiler to hold the build to that).
"""

from pathlib import Path

from setuptools import Extension, setup


def native_extension() -> Extension:
    csrc = Path(__file__).resolve().parent / "services/common/csrc"
    return Extension(
        "services.common._native",
        sources=sorted(str(p.relative_to(csrc.parents[2])) for p in csrc.glob("*.c")),
        depends=[str(p.relative_to(csrc.parents[2])) for p in csrc.glob("*.h")],
        extra_compile_args=["-O2", "-std=c11", "-fno-strict-aliasing", "-Wall"],
        optional=True,
    )


if __name__ == "__main__":  # (setuptools runs this file as __main__)
    setup(ext_modules=[native_extension()])
