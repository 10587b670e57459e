"""Label matchers, with regular expressions in RE2 syntax as Prometheus (Go's regexp) has them.

Python's ``re`` accepts what RE2 refuses (lookaround, backreferences) and reads
``\\d``, ``\\w`` and ``$`` differently, so matchers compile with Google's RE2.
Prometheus anchors every pattern: ``^(?:pattern)$``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is the user's input, not a log line


class RegexError(ValueError):
    pass


@lru_cache(maxsize=4096)
def compile_anchored(pattern: str) -> Any:
    """``^(?:pattern)$`` compiled by RE2; RegexError names what RE2 refused."""
    try:
        return re2.compile(f"^(?:{pattern})$", options=_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise RegexError(f"error parsing regexp: {detail}: `{pattern}`") from None


@dataclass(frozen=True)
class Matcher:
    """``name op value`` with op one of ``= != =~ !~``."""

    name: str
    op: str
    value: str
    _rx: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def make(cls, name: str, op: str, value: str) -> Matcher:
        rx = compile_anchored(value) if op in ("=~", "!~") else None
        return cls(name, op, value, rx)

    def matches(self, got: str) -> bool:
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        hit = self._rx.match(got) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        from services.query_api.promql.printer import go_quote

        return f"{self.name}{self.op}{go_quote(self.value)}"
