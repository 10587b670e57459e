"""File descriptors: every listener stays below the process's limit and survives running out.

* :func:`raise_nofile_limit`: the soft RLIMIT_NOFILE raised to the hard limit at start
  (Linux's default soft limit, 1024, is what a flood of idle connections exhausts).
* :func:`connection_cap`: a listener's connection limit kept below the descriptor limit
  with a margin, so clients never take the descriptors the spool, storage and logs need.
* :func:`quiet_accept_errors`: asyncio's own accept loop (uvicorn's listeners) logs a
  traceback for every ``accept()`` that fails for lack of descriptors and retries a
  second later; the handler this installs counts each failure and logs once per episode.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any

from services.common.logs import RateLimitedLog

log = logging.getLogger(__name__)

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept() errors that mean "out of descriptors or memory", not a peer's fault."""
_NOFILE_CEILING = 1 << 20
"""Soft limit used when the hard limit is unlimited (Linux's default fs.nr_open)."""


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return soft, target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return soft, soft


def connection_cap(configured: int, nofile: int) -> int:
    """A connection limit kept below the descriptor limit with a margin for the rest."""
    margin = max(64, nofile // 8)
    return max(1, min(configured, nofile - margin))


_accept_log = RateLimitedLog(log, 30.0, burst=1)


def quiet_accept_errors(sock: socket.socket, what: str, on_error: Callable[[str], None]) -> None:
    """On the running loop: an ``accept()`` on ``sock`` out of descriptors is counted
    (``on_error`` gets the errno's name) and logged at most once per 30 s; anything else
    goes to the handler that was there before (another listener's, or asyncio's)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    fd = sock.fileno()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, where = context.get("exception"), context.get("socket")
        if (
            isinstance(exc, OSError)
            and exc.errno in RESOURCE_ERRNOS
            and where is not None
            and where.fileno() == fd
        ):
            name = errno.errorcode.get(exc.errno or 0, "other")
            on_error(name)
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            _accept_log.warning(
                f"accept:{what}",
                "%s: cannot accept connections: %s (RLIMIT_NOFILE %d); retrying every "
                "second until descriptors free up",
                what, name, soft,
            )  # fmt: skip
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
