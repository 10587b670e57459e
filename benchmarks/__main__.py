"""Run benchmarks: ``python -m benchmarks [NAME ...] [--quick]`` (``make bench`` runs all).

Each ``benchmarks/bench_<name>.py`` defines ``main(quick: bool) -> str`` that
measures Kelvin beside its reference in the same run and returns a Markdown
table (ratios included). Results go to stdout; copy them, with the machine and
date this prints, into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
from pathlib import Path


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def main() -> int:
    here = Path(__file__).parent
    available = sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("names", nargs="*", help=f"which (default all): {', '.join(available)}")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = ap.parse_args()
    names = args.names or available
    unknown = sorted(set(names) - set(available))
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(available)}")
    print(f"# Kelvin benchmarks — {datetime.date.today().isoformat()} — {machine()}\n")
    for name in names:
        mod = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"## {name}\n")
        sys.stdout.flush()
        print(mod.main(quick=args.quick))
        print()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
