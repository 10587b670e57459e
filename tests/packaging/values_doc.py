"""The chart README's values table, generated from values.yaml and its `# --` comments.

The same convention as helm-docs: a `# -- text` comment (continued by further `#`
lines) describes the key below it; a described map is one row, an undescribed one
is expanded into its keys. `python -m tests.packaging.values_doc` rewrites the table
in charts/kelvin/README.md; a test fails when the README is stale.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.packaging.chart import CHART_DIR

BEGIN = "<!-- values-table:begin (python -m tests.packaging.values_doc) -->"
END = "<!-- values-table:end -->"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$")


def described_keys(text: str) -> list[tuple[tuple[str, ...], str]]:
    """(key path, description) for every mapping key outside lists, in file order."""
    out: list[tuple[tuple[str, ...], str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    list_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            continue
        if list_indent is not None:
            if indent > list_indent or (indent == list_indent and stripped.startswith("-")):
                continue
            list_indent = None
        if stripped == "# --" or stripped.startswith("# -- "):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending and stripped.startswith("#  "):
                pending.append(stripped[1:].strip())
            else:
                pending = []
            continue
        if stripped.startswith("-"):
            list_indent = indent
            continue
        m = _KEY.match(line)
        if not m:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), m.group(2))
        out.append((path, " ".join(pending)))
        pending = []
        stack.append((indent, m.group(2)))
    return out


def _lookup(values: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def _type(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}[
        type(value)
    ]


def table(values_path: Path = CHART_DIR / "values.yaml") -> str:
    text = values_path.read_text()
    values = yaml.safe_load(text)
    keys = described_keys(text)
    described = {path for path, desc in keys if desc}
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    covered: list[tuple[str, ...]] = []
    for path, desc in keys:
        if any(path[: len(c)] == c for c in covered):
            continue
        value = _lookup(values, path)
        if isinstance(value, dict) and value:
            if not desc:
                continue
            if any(len(d) > len(path) and d[: len(path)] == path for d in described):
                # its keys have their own rows
                rows.append(f"| `{'.'.join(path)}` | object | see below | {desc} |")
                continue
            covered.append(path)
        default = json.dumps(value).replace("|", "\\|")
        rows.append(f"| `{'.'.join(path)}` | {_type(value)} | `{default}` | {desc} |")
    return "\n".join(rows)


def render_readme(readme: str) -> str:
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    path = CHART_DIR / "README.md"
    path.write_text(render_readme(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
