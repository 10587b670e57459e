"""The optional compiled core: a build with no C compiler goes on, and Kelvin runs without it.

The compiled and numpy variants of each fast path are held to the same answers by
their own tests (tests/support/native.py parametrizes them); these check the
switch between them: setup.py's build without a compiler, and what each user of
the core picks when the module is absent or turned off.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from services.collect_agent.line_protocol import LineProtocol
from services.common import native
from services.common.rings import Rings

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import runpy, sys
from setuptools import Distribution
ext = runpy.run_path("setup.py", run_name="kelvin_setup")["native_extension"]()
dist = Distribution({"ext_modules": [ext], "script_name": "setup.py"})
cmd = dist.get_command_obj("build_ext")
cmd.build_lib, cmd.build_temp = sys.argv[1], sys.argv[2]
dist.run_command("build_ext")
print("build finished")
"""


def test_the_build_goes_on_without_a_c_compiler(tmp_path: Path) -> None:
    env = {**os.environ, "CC": "/nonexistent/cc", "LDSHARED": "/nonexistent/cc -shared"}
    out, tmp = tmp_path / "lib", tmp_path / "tmp"
    got = subprocess.run(
        [sys.executable, "-c", BUILD, str(out), str(tmp)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert "build finished" in got.stdout
    assert 'building extension "services.common._native" failed' in got.stdout + got.stderr
    assert not list(out.rglob("_native*")), "nothing built, nothing half-built"


def _without_core(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    real = importlib.import_module

    def refuse(name: str, *args: object) -> ModuleType:
        if name == "services.common._native":
            raise ImportError(why)
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(native.importlib, "import_module", refuse)
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_encoders", None)


def test_without_the_module_every_user_takes_its_numpy_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_core(monkeypatch, "No module named 'services.common._native'")
    assert native.module() is None and native.encoders() is None
    assert native.describe().startswith("not built (No module named")
    assert "pip install -e ." in native.describe()
    lp = LineProtocol()
    assert lp.core == "numpy"
    got = lp.parse(b"cpu,host=n1 user=1.5,idle=97i 7\nbad\n", "ns", 0)
    assert got.batch.sensors == ["/influx/cpu/n1/user", "/influx/cpu/n1/idle"]
    assert got.batch.values.tolist() == [1.5, 97.0] and [e[0] for e in got.errors] == [2]
    with pytest.raises(RuntimeError, match="not built"):
        LineProtocol(core="compiled")
    rings = Rings(16)
    assert rings._core is None
    rings.put(["a", "b", "a"], None, np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    assert rings.ordered("a")[1].tolist() == [1.0, 3.0]


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_kelvin_native_0_turns_the_core_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KELVIN_NATIVE", value)
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_encoders", None)
    assert native.module() is None
    assert native.describe() == "turned off (KELVIN_NATIVE=0)"
    assert LineProtocol().core == "numpy"
