"""Logging for every service: one format, credentials masked, a rate limiter for bad input."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:]*)(?::[^\s/@]*)?@"
)


def mask_url(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: ``http://user:***@host``
    (a user alone may be a token, so ``http://***@host``)."""

    def repl(m: re.Match[str]) -> str:
        user = m.group("user")
        has_password = m.group(0)[len(m.group("scheme")) + len(user) :].startswith(":")
        return f"{m.group('scheme')}{user}:***@" if has_password else f"{m.group('scheme')}***@"

    return _USERINFO.sub(repl, text) if "@" in text else text


class _MaskingFormatter(logging.Formatter):
    """Every line, traceback included, with URL credentials masked (storage and broker URLs
    reach the log inside exception messages, not only where a URL is logged on purpose)."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_url(super().format(record))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": mask_url(record.getMessage()),
        }
        if record.exc_info:
            doc["exc"] = mask_url(self.formatException(record.exc_info))
        return json.dumps(doc)


def setup(level: str = "INFO", json_format: bool = False) -> None:
    """Configure the root logger once (idempotent)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_kelvin", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler._kelvin = True  # type: ignore[attr-defined]
    handler.setFormatter(
        _JsonFormatter()
        if json_format
        else _MaskingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn's own handlers would print every line twice.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    # uvicorn's per-server start/stop lines and httpx's line per request (the
    # pusher polls the allocator every second) are noise at INFO.
    if level != "DEBUG":
        for noisy in ("uvicorn.error", "httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


class RateLimitedLog:
    """Log at most ``burst`` messages per ``period_s`` per key; count the rest.

    Bad input from a hostile or broken client must not flood the log, yet the
    operator must learn that it happens: suppressed lines are summarised.
    """

    def __init__(self, logger: logging.Logger, period_s: float = 10.0, burst: int = 5) -> None:
        self.logger = logger
        self.period_s = period_s
        self.burst = burst
        self._windows: dict[str, tuple[float, int, int]] = {}

    def warning(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        start, shown, hidden = self._windows.get(key, (now, 0, 0))
        if now - start >= self.period_s:
            if hidden:
                self.logger.warning(
                    "%d more %r messages suppressed in the last %.0f s", hidden, key, now - start
                )
            start, shown, hidden = now, 0, 0
        if shown < self.burst:
            self.logger.warning(msg, *args)
            shown += 1
        else:
            hidden += 1
        if len(self._windows) > 10_000:
            self._windows.clear()
        self._windows[key] = (start, shown, hidden)
