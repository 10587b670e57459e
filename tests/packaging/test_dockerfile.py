"""The image, checked statically (no Docker engine runs here): Dockerfile rules, build
context (.dockerignore), package data of the non-editable install, and the dev
entrypoint Tilt uses (run for real with watchfiles)."""

from __future__ import annotations

import fnmatch
import os
import re
import select
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.packaging.chart import CHART_DIR, ROOT
from tests.packaging.dockerfile import Stage, effective, parse, resolve

DOCKERFILE = ROOT / "Dockerfile"
GLOBAL_ARGS, STAGES = parse(DOCKERFILE)
RELEASE = STAGES[-1].name
"""`docker build .` builds the last stage."""
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def _runtime() -> Stage:
    return next(s for s in resolve(STAGES, RELEASE) if s.all("LABEL"))


def test_multi_stage_build_copies_only_the_venv() -> None:
    assert len(STAGES) >= 2
    copies = [i for s in resolve(STAGES, RELEASE) for i in s.all("COPY")]
    from_build = [i for i in copies if i.flags().get("from") == "build"]
    assert [i.args.split()[-1] for i in from_build] == ["/opt/kelvin"]
    assert not [i for i in copies if not i.flags().get("from")], "sources stay in the build stage"


def test_base_images_are_pinned_slim_python() -> None:
    bases = {s.base for s in STAGES if s.base not in {t.name for t in STAGES}}
    assert bases, "no external base image"
    for base in bases:
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and "@" not in name, base
        assert name == "python" and tag.startswith("3.11-slim"), base
    assert not re.search(r"(?im)^\s*ADD\s+https?://", DOCKERFILE.read_text())


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    user = effective(STAGES, RELEASE, "USER")
    assert user is not None
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric uid lets runAsNonRoot be verified"
    pod = VALUES["podSecurityContext"]
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"])
    dev = effective(STAGES, "dev", "USER")
    assert dev is not None and dev.args == user.args, "the dev image must not run as root"


def test_entrypoint_is_kelvin_and_the_chart_only_passes_args() -> None:
    entrypoint = effective(STAGES, RELEASE, "ENTRYPOINT")
    assert entrypoint is not None and entrypoint.exec_form() == ["kelvin"]
    cmd = effective(STAGES, RELEASE, "CMD")
    assert cmd is not None and cmd.exec_form() is not None, "CMD in exec form"
    assert PYPROJECT["project"]["scripts"]["kelvin"] == "services.cli:main"


def test_oci_labels() -> None:
    labels = dict(
        re.findall(
            r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', _runtime().all("LABEL")[0].args
        )
    )
    for key in ("title", "description", "version", "revision", "created", "licenses", "source"):
        assert labels.get(f"org.opencontainers.image.{key}"), f"label {key} missing"
    licence = PYPROJECT["project"]["license"]  # an SPDX expression (PEP 639), as setuptools wants
    assert labels["org.opencontainers.image.licenses"] == licence
    version_arg = next(i for i in _runtime().all("ARG") if i.args.startswith("VERSION="))
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (
        version_arg.args
        == f"VERSION={PYPROJECT['project']['version']}"
        == f"VERSION={chart['appVersion']}"
    )


def test_exposes_the_ports_the_chart_uses() -> None:
    exposed = {int(p) for i in _runtime().all("EXPOSE") for p in i.args.split()}
    chart_ports = {
        VALUES["queryApi"]["service"]["port"],
        VALUES["collectAgent"]["service"]["httpPort"],
        VALUES["collectAgent"]["service"]["mqttPort"],
        VALUES["pusher"]["port"],
        VALUES["allocator"]["service"]["port"],
    }
    assert exposed == chart_ports


def test_read_only_root_filesystem_needs_only_the_chart_volumes() -> None:
    """Writable paths are /tmp (emptyDir) and /var/lib/kelvin/* (volumes); bytecode is prebuilt."""
    env = _runtime().env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    for key in ("HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert env[key].startswith("/tmp"), key
    runs = " ".join(i.args for i in _runtime().all("RUN"))
    for d in ("spool", "allocator", "pusher"):
        assert f"/var/lib/kelvin/{d}" in runs, d
    build_runs = " ".join(i.args for i in STAGES[0].all("RUN"))
    assert "compileall" in build_runs


def test_package_dir_matches_the_python_of_the_base_image() -> None:
    package_dir = _runtime().env()["KELVIN_PACKAGE_DIR"]
    tag = GLOBAL_ARGS["PYTHON_IMAGE"].partition(":")[2]
    minor = re.match(r"(3\.\d+)", tag)
    assert minor and package_dir == f"/opt/kelvin/lib/python{minor.group(1)}/site-packages/services"


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parents = [path] + [str(p) for p in Path(path).parents if str(p) != "."]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip("/")
        regex = (
            re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        )
        if any(re.fullmatch(regex, p) for p in parents):
            ignored = not negate
    return ignored


def test_build_context_holds_only_what_the_image_needs() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sent = [
        "pyproject.toml",
        "README.md",
        "services/cli.py",
        "services/common/halls/reference-40.D.txt",
        "setup.py",
        "services/common/csrc/encode.c",
    ]
    kept_out = [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "charts/kelvin/values.yaml",
        "services/__pycache__/cli.cpython-311.pyc",
        "services/common/__pycache__/x.pyc",
        "data/kelvin.sqlite",
        "services/common/_native.cpython-311-x86_64-linux-gnu.so",  # a local in-place build
    ]
    for path in sent:
        assert not _dockerignored(path, patterns), f"{path} must be in the build context"
    for path in kept_out:
        assert _dockerignored(path, patterns), f"{path} must not be in the build context"
    for stage in STAGES:
        for inst in stage.all("COPY"):
            if inst.flags().get("from") or inst.heredoc:
                continue
            sources = [w for w in inst.args.split() if not w.startswith("--")][:-1]
            for src in sources:
                assert not _dockerignored(src, patterns), f"COPY {src} is .dockerignored"


def test_non_editable_install_keeps_every_data_file() -> None:
    """The image installs Kelvin as a wheel: files not in package-data would be missing."""
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["*"]
    missing = []
    for path in (ROOT / "services").rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".py", ".pyc", ".pyi"):
            continue
        if path.suffix in (".c", ".h", ".so"):  # the compiled core: the wheel has it built
            continue
        if not any(fnmatch.fnmatch(path.name, p) for p in patterns):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_plain_dockerfile_syntax_that_buildah_and_the_legacy_builder_take() -> None:
    """No `# syntax=` frontend (pulled from a registry) and nothing only BuildKit knows."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"(?im)^#\s*syntax\s*=", text)
    for stage in STAGES:
        for inst in stage.instructions:
            assert not inst.heredoc, f"{stage.name}: heredoc in {inst.keyword}"
            assert "--mount=" not in inst.args, f"{stage.name}: RUN --mount"
            assert "--chmod" not in inst.args, f"{stage.name}: COPY --chmod"


def _dev_entrypoint() -> str:
    dev = next(s for s in STAGES if s.name == "dev")
    (copy,) = [i for i in dev.all("COPY") if i.args.split()[-1] == "/usr/local/bin/kelvin-dev"]
    entrypoint = effective(STAGES, "dev", "ENTRYPOINT")
    assert entrypoint is not None and entrypoint.exec_form() == ["kelvin-dev"]
    return (ROOT / copy.args.split()[0]).read_text()


def test_dev_entrypoint_restarts_kelvin_when_python_changes(tmp_path: Path) -> None:
    """The Tilt image's entrypoint, run here with the real watchfiles and kelvin commands."""
    script = tmp_path / "kelvin-dev"
    script.write_text(_dev_entrypoint())
    script.chmod(0o755)
    package = tmp_path / "services"
    package.mkdir()
    env = {
        **os.environ,
        "KELVIN_PACKAGE_DIR": str(package),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.Popen(
        [str(script), "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdout is not None
    try:
        runs = 0
        # Bounded only so that a failure ends: two `kelvin --version` runs and a watcher
        # start take a few seconds, many more on a loaded 2-core machine.
        deadline = time.monotonic() + 120
        while runs < 2 and time.monotonic() < deadline:
            if runs == 1:
                # The watcher starts after the first run; change a file until it notices.
                (package / "changed.py").write_text(f"x = {time.monotonic()}\n")
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline().decode()
                assert line.startswith("kelvin "), line
                runs += 1
        assert runs == 2, "kelvin was not restarted after a .py change"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.parametrize("stage", [s.name for s in STAGES])
def test_no_secrets_in_image_environment(stage: str) -> None:
    for s in resolve(STAGES, stage):
        for key in s.env():
            assert not re.search(r"TOKEN|PASSWORD|SECRET", key), f"{stage}: ENV {key}"
