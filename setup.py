"""The optional compiled core (services/common/csrc): everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build goes on without
it and Kelvin runs its numpy code instead (services/common/native.py says which).
"""

from pathlib import Path

from setuptools import Extension, setup

SOURCES = sorted(str(p) for p in Path("services/common/csrc").glob("*.c"))

setup(
    ext_modules=[
        Extension(
            "services.common._native",
            sources=SOURCES,
            depends=[str(p) for p in Path("services/common/csrc").glob("*.h")],
            extra_compile_args=["-O2", "-std=c11", "-fno-strict-aliasing", "-Wall"],
            optional=True,
        )
    ]
)
