"""Listening sockets with a clear error when a port is taken."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from services.common.errors import PortInUseError


def bind_tcp(
    host: str, port: int, what: str, flag: str | None = None, backlog: int = 1024
) -> socket.socket:
    """Bind and listen; raise PortInUseError naming the service, port and flag.

    ``port`` 0 picks a free port (tests); read it back with ``sock.getsockname()``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP;
    # with proto 0 every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # REUSEADDR only skips TIME_WAIT of our own past runs; it does not let
        # two live listeners share a port on Linux (that would be REUSEPORT).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        hint = f"; choose another with {flag}" if flag else ""
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"{what}: port {port} on {host} is already in use by another process{hint}"
            ) from exc
        if exc.errno == errno.EACCES:
            raise PortInUseError(f"{what}: no permission to listen on {host}:{port}{hint}") from exc
        raise PortInUseError(
            f"{what}: cannot listen on {host}:{port}: {exc.strerror}{hint}"
        ) from exc
    sock.setblocking(False)
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Listener:
    """A port a service will listen on (what ``kelvin run``/``up`` checks before starting)."""

    host: str
    port: int
    what: str
    """e.g. ``collect agent MQTT``"""
    flag: str | None = None
    """The command-line flag that moves it."""


def check_free(listeners: list[Listener]) -> None:
    """Bind and release every listener's port; one PortInUseError naming all that are taken
    (or claimed twice), so a user fixes them in one go, before anything starts."""
    problems: list[str] = []
    seen: dict[tuple[str, int], Listener] = {}
    for li in listeners:
        if li.port == 0:
            continue
        other = seen.get((li.host, li.port))
        if other is not None:
            hint = f"; move one with {li.flag or other.flag}" if li.flag or other.flag else ""
            problems.append(f"{other.what} and {li.what} both want {li.host}:{li.port}{hint}")
            continue
        seen[(li.host, li.port)] = li
        try:
            bind_tcp(li.host, li.port, li.what, li.flag, backlog=1).close()
        except PortInUseError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise PortInUseError(problems[0])
    if problems:
        raise PortInUseError(
            f"{len(problems)} ports are not available:\n  " + "\n  ".join(problems)
        )
