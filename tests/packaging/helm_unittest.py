"""Run the chart's unit tests (charts/kelvin/tests/*_test.yaml, helm-unittest's format) here.

The prometheus-community checklist asks for unit tests in the chart's `tests/`
directory, written for the helm-unittest plugin. No helm binary runs on our
machines, so this module runs them with Helm's engine as a library. It supports
the subset of helm-unittest the suites use and refuses anything else (an unknown
key or assertion is an error, not a silent pass), so the suites stay valid for
the real plugin.
"""

from __future__ import annotations

import base64
import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

SUITE_KEYS = {"suite", "templates", "values", "set", "release", "tests"}
TEST_KEYS = {"it", "values", "set", "template", "templates", "documentIndex"} | {
    "documentSelector",
    "release",
    "asserts",
}
ASSERT_OPTIONS = {"not", "template", "documentIndex", "documentSelector"}
_MISSING = object()
_TOKEN = re.compile(r"""\.?([A-Za-z0-9_$-]+)|\[(\d+)\]|\[["']([^"']+)["']\]""")


def lookup(doc: Any, path: str) -> Any:
    """helm-unittest's path syntax: `a.b[0].c`, `metadata.labels["app.kubernetes.io/name"]`."""
    pos = 0
    node = doc
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise ValueError(f"path {path!r}: cannot parse at {path[pos:]!r}")
        pos = m.end()
        key: Any = m.group(1) or m.group(3)
        if m.group(2) is not None:
            if not isinstance(node, list) or int(m.group(2)) >= len(node):
                return _MISSING
            node = node[int(m.group(2))]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return _MISSING
    return node


def set_path(values: dict[str, Any], path: str, value: Any) -> None:
    """`set:` keys are --set style dotted paths."""
    parts = path.split(".")
    for part in parts[:-1]:
        values = values.setdefault(part, {})
    values[parts[-1]] = value


def merge(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            merge(dst[key], value)
        else:
            dst[key] = value
    return dst


def _subset(sub: Any, whole: Any) -> bool:
    if isinstance(sub, dict):
        return isinstance(whole, dict) and all(
            k in whole and _subset(v, whole[k]) for k, v in sub.items()
        )
    return bool(sub == whole)


def _empty(value: Any) -> bool:
    return value is _MISSING or value in (None, "", 0, [], {})


Check = Callable[[Any, dict[str, Any]], tuple[bool, str]]


def _path(doc: Any, p: dict[str, Any]) -> Any:
    value = lookup(doc, p["path"])
    if p.get("decodeBase64") and isinstance(value, str):
        value = base64.b64decode(value).decode()
    return value


CHECKS: dict[str, Check] = {
    "equal": lambda d, p: (_path(d, p) == p["value"], f"{p['path']} = {_path(d, p)!r}"),
    "notEqual": lambda d, p: (_path(d, p) != p["value"], f"{p['path']} = {_path(d, p)!r}"),
    "exists": lambda d, p: (lookup(d, p["path"]) is not _MISSING, f"{p['path']} missing"),
    "notExists": lambda d, p: (lookup(d, p["path"]) is _MISSING, f"{p['path']} exists"),
    "isKind": lambda d, p: (d.get("kind") == p["of"], f"kind {d.get('kind')}"),
    "isAPIVersion": lambda d, p: (d.get("apiVersion") == p["of"], f"{d.get('apiVersion')}"),
    "contains": lambda d, p: (
        isinstance(lookup(d, p["path"]), list)
        and (
            any(_subset(p["content"], x) for x in lookup(d, p["path"]))
            if p.get("any")
            else p["content"] in lookup(d, p["path"])
        ),
        f"{p['path']} = {lookup(d, p['path'])!r}",
    ),
    "isSubset": lambda d, p: (
        _subset(p["content"], lookup(d, p["path"])),
        f"{p['path']} = {lookup(d, p['path'])!r}",
    ),
    "matchRegex": lambda d, p: (
        isinstance(_path(d, p), str) and re.search(p["pattern"], _path(d, p)) is not None,
        f"{p['path']} = {_path(d, p)!r}",
    ),
    "isNullOrEmpty": lambda d, p: (_empty(lookup(d, p["path"])), f"{lookup(d, p['path'])!r}"),
    "lengthEqual": lambda d, p: (
        isinstance(lookup(d, p["path"]), list) and len(lookup(d, p["path"])) == p["count"],
        f"{p['path']} = {lookup(d, p['path'])!r}",
    ),
}
ANTONYMS = {
    "notContains": "contains",
    "notMatchRegex": "matchRegex",
    "isNotNullOrEmpty": "isNullOrEmpty",
    "isNotSubset": "isSubset",
}


@dataclass
class Case:
    suite: str
    it: str
    path: Path
    spec: dict[str, Any]
    suite_spec: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.path.stem}: {self.it}"


def load_cases(tests_dir: Path) -> list[Case]:
    cases = []
    for path in sorted(tests_dir.glob("*_test.yaml")):
        suite = yaml.safe_load(path.read_text())
        unknown = set(suite) - SUITE_KEYS
        assert not unknown, f"{path.name}: unsupported suite keys {unknown}"
        for test in suite["tests"]:
            unknown = set(test) - TEST_KEYS
            assert not unknown, f"{path.name}: {test.get('it')}: unsupported keys {unknown}"
            cases.append(Case(suite.get("suite", path.stem), test["it"], path, test, suite))
    return cases


def _values(case: Case) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for layer in (case.suite_spec, case.spec):
        for f in layer.get("values", []):
            merge(values, yaml.safe_load((case.path.parent / f).read_text()) or {})
        for key, value in (layer.get("set") or {}).items():
            set_path(values, key, value)
    return values


def _templates(spec: dict[str, Any]) -> list[str]:
    found = spec.get("templates") or ([spec["template"]] if "template" in spec else [])
    return [t.removeprefix("templates/") for t in found]


def _documents(files: dict[str, str], patterns: list[str]) -> list[Any]:
    docs = []
    for path, text in sorted(files.items()):
        rel = path.split("/templates/", 1)[-1]
        if any(fnmatch.fnmatch(rel, p) for p in patterns):
            docs.extend(d for d in yaml.safe_load_all(text) if d is not None)
    return docs


def _select(docs: list[Any], where: dict[str, Any]) -> list[Any]:
    if "documentSelector" in where:
        sel = where["documentSelector"]
        docs = [d for d in docs if lookup(d, sel["path"]) == sel["value"]]
    if where.get("documentIndex", -1) >= 0:
        index = where["documentIndex"]
        docs = docs[index : index + 1]
    return docs


def run(case: Case, chart: Any) -> None:
    """Render as the case says and check its assertions; AssertionError names the failure."""
    release = {**(case.suite_spec.get("release") or {}), **(case.spec.get("release") or {})}
    error = ""
    files: dict[str, str] = {}
    try:
        files = chart.render(
            _values(case),
            name=release.get("name", "RELEASE-NAME"),
            namespace=release.get("namespace", "NAMESPACE"),
        )
    except helm.HelmError as exc:
        error = str(exc)
    for n, assertion in enumerate(case.spec["asserts"]):
        (kind,) = [k for k in assertion if k not in ASSERT_OPTIONS]
        params = assertion[kind] or {}
        negate = bool(assertion.get("not"))
        where = f"{case.id}: assert #{n + 1} ({kind})"
        if kind in ("failedTemplate", "notFailedTemplate"):
            failed = bool(error) != (kind == "notFailedTemplate")
            if "errorMessage" in params:
                message = error.splitlines()[0].rsplit("): ", 1)[-1] if error else ""
                failed = failed and message == params["errorMessage"]
            assert failed != negate, f"{where}: render error {error!r}"
            continue
        assert not error, f"{where}: the chart did not render: {error}"
        patterns = _templates(assertion) or _templates(case.spec) or _templates(case.suite_spec)
        assert patterns, f"{where}: no template named"
        docs = _documents(files, patterns)
        if kind == "hasDocuments":
            ok = len(docs) == params["count"]
            assert ok != negate, f"{where}: {len(docs)} documents from {patterns}"
            continue
        docs = _select(docs, {**case.spec, **assertion})
        assert docs, f"{where}: no document rendered from {patterns}"
        if kind in ANTONYMS:
            kind, negate = ANTONYMS[kind], not negate
        check = CHECKS.get(kind)
        assert check is not None, f"{where}: unsupported assertion {kind}"
        for doc in docs:
            ok, detail = check(doc, params)
            assert ok != negate, f"{where}: {detail}"
