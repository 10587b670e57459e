"""MQTT session state of the built-in endpoint, with MQTT 5 Session Expiry.

A publish-only server's session is small: the QoS 2 packet ids it has
acknowledged with PUBREC and not yet seen released (so a resent QoS 2 message
is not stored twice). What MQTT says about its lifetime:

* 3.1.1, clean session 1: the session lasts as long as the connection;
  clean session 0: it is kept after the connection ends (here: until the
  bounds below push it out).
* 5: Clean Start 1 discards an existing session at CONNECT; the session then
  lives ``Session Expiry Interval`` seconds after the connection ends (absent or
  0: it ends with the connection; 0xFFFFFFFF: never, capped here at
  ``max_expiry_s``). A DISCONNECT may change the interval, but not from 0.

Bounds: at most ``max_sessions`` sessions and ``max_ids`` stored packet ids; past
them the detached sessions that would expire first go first (counted).
A session belongs to the user name that created it: another user gets its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.collect_agent.metrics import AgentMetrics

NEVER = 0xFFFFFFFF


@dataclass(slots=True)
class Session:
    owner: str | None
    expiry_s: float
    """Seconds kept after the connection ends (0: ends with it; inf: no expiry)."""
    awaiting_rel: set[int] = field(default_factory=set)
    expires_at: float | None = None
    """Monotonic deadline while detached; None while a connection holds it."""
    detached_at: float = 0.0


class SessionStore:
    """Sessions by client id (see the module docstring)."""

    def __init__(
        self,
        metrics: AgentMetrics,
        max_sessions: int = 10_000,
        max_ids: int = 1_000_000,
        max_expiry_s: float = 86_400.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.max_sessions = max_sessions
        self.max_ids = max_ids
        self.max_expiry_s = max_expiry_s
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        metrics.sessions.set_function(lambda: len(self.sessions))

    def expiry(self, level: int, clean: bool, requested: int | None) -> tuple[float, int | None]:
        """(seconds kept after disconnect, the value to announce in CONNACK or None)."""
        if level < 5:
            return (0.0 if clean else math.inf), None
        asked = requested or 0
        granted = min(asked, self.max_expiry_s) if asked != NEVER else self.max_expiry_s
        return float(granted), (int(granted) if granted != asked else None)

    def open(
        self, client_id: str, owner: str | None, clean: bool, expiry_s: float
    ) -> tuple[Session, bool]:
        """The session a CONNECT gets, and whether it existed (Session Present)."""
        old = self.sessions.get(client_id)
        if old is not None and (clean or old.owner != owner or self._expired(old)):
            del self.sessions[client_id]
            old = None
        if old is not None:
            old.expiry_s = expiry_s
            old.expires_at = None
            return old, True
        session = Session(owner, expiry_s)
        if expiry_s > 0:
            self.sessions[client_id] = session
            self._bound()
        return session, False

    def detach(self, client_id: str, session: Session) -> None:
        """The connection holding ``session`` ended."""
        if self.sessions.get(client_id) is not session:
            return
        if session.expiry_s <= 0:
            del self.sessions[client_id]
        else:
            session.detached_at = self.clock()
            session.expires_at = session.detached_at + session.expiry_s
            self._bound()

    def sweep(self) -> None:
        """Drop expired detached sessions."""
        for cid in [c for c, s in self.sessions.items() if self._expired(s)]:
            del self.sessions[cid]
            self.metrics.sessions_ended.labels("expired").inc()

    def _expired(self, s: Session) -> bool:
        return s.expires_at is not None and s.expires_at <= self.clock()

    def _bound(self) -> None:
        if len(self.sessions) <= self.max_sessions:
            ids = sum(len(s.awaiting_rel) for s in self.sessions.values())
            if ids <= self.max_ids:
                return
        detached = sorted(
            (s.expires_at, s.detached_at, cid)
            for cid, s in self.sessions.items()
            if s.expires_at is not None
        )
        ids = sum(len(s.awaiting_rel) for s in self.sessions.values())
        for _, _, cid in detached:
            if len(self.sessions) <= self.max_sessions and ids <= self.max_ids:
                break
            ids -= len(self.sessions.pop(cid).awaiting_rel)
            self.metrics.sessions_ended.labels("limit").inc()
