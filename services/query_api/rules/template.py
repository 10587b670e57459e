"""Alert label and annotation templates: the part of Go's text/template that alert rules use.

``{{ $labels.node }}``, ``{{ $value }}``, ``{{ $externalLabels.site }}`` (and the
``.Labels``/``.Value`` forms), pipelines and calls of ``humanize``,
``humanize1024``, ``humanizePercentage``, ``humanizeDuration``, ``printf``,
``toUpper``, ``toLower``, ``title``, ``reReplaceAll``, ``stripPort``; ``{{-``/``-}}``
trim spaces, ``{{/* */}}`` is a comment. Control structures (``if``, ``range``, ...)
and ``query`` are refused when the rule file is loaded, naming the construct.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.query_api.promql.printer import go_float
from services.query_api.promql.regex import RegexError, compile_anchored

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|`[^`]*`|\||[^\s|]+)')
_CONTROL = {
    "if",
    "else",
    "end",
    "range",
    "with",
    "define",
    "template",
    "block",
    "break",
    "continue",
}


class TemplateError(ValueError):
    pass


@dataclass(frozen=True)
class Data:
    labels: Mapping[str, str]
    value: float
    external: Mapping[str, str]


def _number(x: Any) -> float:
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            raise TemplateError(f"cannot convert {x!r} to a number") from None
    return float(x)


def _g4(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


def _small(v: float) -> tuple[float, str]:
    """Scale ``0 < |v| < 1`` up by thousands: (value, SI prefix) as Prometheus' humanizers do."""
    prefix = ""
    for p in "munpfazy":
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return v, prefix


def humanize(x: Any, base: float = 1000.0, big: str = "kMGTPEZY") -> str:
    v = _number(x)
    if v == 0 or not math.isfinite(v):
        return _g4(v)
    if abs(v) >= 1:
        prefix = ""
        for p in big:
            if abs(v) < base:
                break
            prefix = p + ("i" if base == 1024 else "")
            v /= base
        return _g4(v) + prefix
    if base == 1024:
        return _g4(v)
    v, prefix = _small(v)
    return _g4(v) + prefix


def humanize_duration(x: Any) -> str:
    v = _number(x)
    if not math.isfinite(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        s, m, h, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {h}h {m}m {s}s"
        if h:
            return f"{sign}{h}h {m}m {s}s"
        if m:
            return f"{sign}{m}m {s}s"
        return f"{sign}{_g4(v)}s"
    v, prefix = _small(v)
    return f"{_g4(v)}{prefix}s"


def _printf(fmt: str, *args: Any) -> str:
    py = fmt.replace("%v", "%s")
    conv = [go_float(a) if isinstance(a, float) and "%v" in fmt else a for a in args]
    try:
        return py % tuple(conv)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"printf {fmt!r}: {exc}") from None


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    try:
        compile_anchored(pattern)  # RE2 syntax, as Go's regexp
    except RegexError as exc:
        raise TemplateError(str(exc)) from None
    return re.sub(pattern, re.sub(r"\$(\d+)", r"\\\1", repl), text)


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize": humanize,
    "humanize1024": lambda x: humanize(x, 1024.0),
    "humanizePercentage": lambda x: _g4(_number(x) * 100) + "%",
    "humanizeDuration": humanize_duration,
    "printf": _printf,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "title": lambda s: str(s).title(),
    "reReplaceAll": _re_replace_all,
    "stripPort": lambda s: str(s).rsplit(":", 1)[0] if ":" in str(s) else str(s),
}


def _text(v: Any) -> str:
    return go_float(v) if isinstance(v, float) else str(v)


class Template:
    """A parsed template; :meth:`render` fills it for one alert."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.parts: list[str | list[list[str]]] = []
        pos = 0
        text = source
        for m in _ACTION.finditer(text):
            lit = text[pos : m.start()]
            if m.group(1):
                lit = lit.rstrip()
            if lit:
                self.parts.append(lit)
            body = m.group(2).strip()
            pos = m.end()
            if m.group(3):
                rest = text[pos:]
                pos += len(rest) - len(rest.lstrip())
            if body.startswith("/*") and body.endswith("*/"):
                continue
            self.parts.append(self._pipeline(body))
        if text[pos:]:
            self.parts.append(text[pos:])
        if "{{" in "".join(p for p in self.parts if isinstance(p, str)):
            raise TemplateError(f"unclosed action in {source!r}")
        self.render(Data({}, 0.0, {}))  # unknown variables fail at load, not at the first alert

    @staticmethod
    def _pipeline(body: str) -> list[list[str]]:
        words = [w for w in _TOKEN.findall(body) if w]
        if not words:
            raise TemplateError("empty action {{ }}")
        if words[0] in _CONTROL or words[0] == "query":
            raise TemplateError(
                f"template construct {words[0]!r} is not supported by Kelvin's alert templates"
            )
        commands: list[list[str]] = [[]]
        for w in words:
            if w == "|":
                commands.append([])
            else:
                commands[-1].append(w)
        for cmd in commands:
            if not cmd:
                raise TemplateError(f"empty command in pipeline {body!r}")
            head = cmd[0]
            if (
                not head.startswith(("$", ".", '"', "`"))
                and not _is_number(head)
                and head not in FUNCTIONS
            ):
                raise TemplateError(
                    f"function {head!r} is not supported by Kelvin's alert templates"
                )
        return commands

    def render(self, data: Data) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value: Any = None
            for i, cmd in enumerate(part):
                args = [self._operand(a, data) for a in cmd[1:]]
                if i > 0:
                    args.append(value)
                head = cmd[0]
                if head in FUNCTIONS:
                    value = FUNCTIONS[head](*args)
                elif args:
                    raise TemplateError(f"{head} is not a function")
                else:
                    value = self._operand(head, data)
            out.append(_text(value))
        return "".join(out)

    @staticmethod
    def _operand(word: str, data: Data) -> Any:
        if word.startswith('"'):
            return bytes(word[1:-1], "utf-8").decode("unicode_escape")
        if word.startswith("`"):
            return word[1:-1]
        if _is_number(word):
            return float(word)
        if word in ("$value", ".Value"):
            return data.value
        for prefix, src in (("$labels", data.labels), (".Labels", data.labels),
                            ("$externalLabels", data.external), (".ExternalLabels", data.external)):  # fmt: skip
            if word == prefix:
                return "map[" + " ".join(f"{k}:{v}" for k, v in sorted(src.items())) + "]"
            if word.startswith(prefix + "."):
                return src.get(word[len(prefix) + 1 :], "")
        raise TemplateError(f"unknown variable {word!r} (use $labels, $value, $externalLabels)")


def _is_number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False
