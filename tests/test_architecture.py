"""The layout rules of the repository, enforced."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
SERVICE_PACKAGES = ["pusher", "collect_agent", "query_api", "allocator", "slurm_bridge"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from services import cli` imports services.cli, not just `services`.
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def test_services_never_import_each_other() -> None:
    offences = []
    for pkg in SERVICE_PACKAGES:
        for path in (SERVICES / pkg).rglob("*.py"):
            for mod in _imports(path):
                parts = mod.split(".")
                # services.cli counts too: it imports every service.
                if parts[0] == "services" and len(parts) > 1 and parts[1] not in ("common", pkg):
                    offences.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offences, "services may import only services.common:\n" + "\n".join(offences)


def test_common_imports_no_service() -> None:
    offences = []
    for path in (SERVICES / "common").rglob("*.py"):
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] in SERVICE_PACKAGES:
                offences.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offences, "services.common must not depend on a service:\n" + "\n".join(offences)


def test_required_layout_exists() -> None:
    for rel in [
        "pyproject.toml", "README.md", "Tiltfile", ".ci/run", "charts", "k8s", "benchmarks",
        "services/common", "services/pusher", "services/collect_agent", "services/query_api",
        "services/allocator",
    ]:  # fmt: skip
        assert (ROOT / rel).exists(), f"{rel} is missing"


def test_tests_mirror_services() -> None:
    for pkg in ["common", *SERVICE_PACKAGES]:
        assert (ROOT / "tests" / pkg).is_dir(), f"tests/{pkg} must mirror services/{pkg}"


def test_every_module_has_a_docstring() -> None:
    missing = [
        str(p.relative_to(ROOT))
        for p in SERVICES.rglob("*.py")
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None
    ]
    assert not missing, "modules need a docstring saying what they are for:\n" + "\n".join(missing)


def test_the_pusher_imports_only_what_a_compute_node_needs(tmp_path: Path) -> None:
    """`kelvin run pusher` with its node plugins loads no web framework, numpy, pydantic,
    Prometheus or MQTT client library (each costs megabytes on every compute node)."""
    import json
    import subprocess
    import sys

    cfg = tmp_path / "k.yaml"
    cfg.write_text(
        json.dumps(
            {
                "pusher": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "state_dir": str(tmp_path / "state"),
                    "plugins": {"procfs": {}, "sysfs": {}},
                }
            }
        )
    )
    code = (
        "import json, sys\n"
        "from services.cli import build_config, build_parser\n"
        f"args = build_parser(tools=False).parse_args(['run', 'pusher', '--config', {str(cfg)!r}])\n"
        "cfg = build_config(args, 'run')\n"
        "from services.common.config import LoggingSettings\n"
        "cfg.load(LoggingSettings)\n"
        "import importlib\n"
        "importlib.import_module('services.pusher.app').create_service(cfg)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    heavy = {
        "numpy", "pydantic", "pydantic_core", "pydantic_settings", "fastapi", "starlette",
        "uvicorn", "anyio", "prometheus_client", "aiomqtt", "paho", "httpx", "scipy",
        "importlib.metadata", "email",
    }  # fmt: skip
    found = sorted(m for m in loaded if m in heavy or m.split(".")[0] in heavy)
    assert not found, f"the pusher's process imports {found}"
    assert "services.pusher.plugins.procfs" in loaded, "the configured plugins are loaded"
    assert "services.pusher.plugins.snmp" not in loaded, "plugins load only when configured"
