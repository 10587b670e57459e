"""Who may do what: roles, credentials and the one decision every service's routes share.

Three roles, each a separate credential:

- ``read``: readings, hierarchy, Grafana, the Prometheus API, status pages;
- ``write``: ingest (``/write``, remote write, MQTT publishes of readings);
- ``admin``: configuration (virtual sensors, metadata, import, plugin control,
  policy, hall model, kicking clients) and everything the other two may do.

A route declares the role it needs where it is declared (``requires(Role.ADMIN)``
in :mod:`services.common.http` for FastAPI apps; the pusher's own router takes a
``Role`` per route), so a test can enumerate every route and prove the rule.
This module has no web framework in it: the pusher uses it without FastAPI.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    """What a credential allows. ``admin`` includes ``read`` and ``write``."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


GRANTS: dict[Role, frozenset[Role]] = {
    Role.READ: frozenset({Role.READ}),
    Role.WRITE: frozenset({Role.WRITE}),
    Role.ADMIN: frozenset({Role.READ, Role.WRITE, Role.ADMIN}),
}
"""Role held -> roles it satisfies. A pusher's write credential cannot read, and
Grafana's read credential cannot write: neither role contains the other."""


def satisfies(held: Role, required: Role) -> bool:
    """Whether a credential of role ``held`` may call a route that requires ``required``."""
    return required in GRANTS[held]


@dataclass(frozen=True)
class Denied:
    """Why a request is refused: 401 (no or unknown credential) or 403 (too low a role)."""

    status: int
    message: str


@dataclass
class Credentials:
    """The tokens a service accepts, each with its role, and the roles open to anyone.

    ``open_roles`` holds the roles that need no credential (``kelvin up`` leaves
    reads open on loopback; ``auth.mode: none`` opens every role).
    """

    tokens: dict[str, Role] = field(default_factory=dict)
    open_roles: frozenset[Role] = frozenset()

    @classmethod
    def from_roles(
        cls, by_role: Mapping[Role, Iterable[str | None]], open_roles: Iterable[Role] = ()
    ) -> Credentials:
        """Build from role -> tokens (``None`` and empty tokens are ignored)."""
        tokens: dict[str, Role] = {}
        for role, given in by_role.items():
            for t in given:
                if t:
                    tokens[t] = role
        return cls(tokens, frozenset(open_roles))

    def role_of(self, token: str | None) -> Role | None:
        """The role of ``token``, compared in constant time against every known token."""
        if not token:
            return None
        found: Role | None = None
        given = token.encode()
        for known, role in self.tokens.items():
            # No early exit: the time taken does not tell which token matched.
            if hmac.compare_digest(given, known.encode()):
                found = role
        return found

    def decide(self, token: str | None, required: Role) -> Denied | None:
        """None when a request with ``token`` may call a route needing ``required``."""
        if required in self.open_roles:
            return None
        role = self.role_of(token)
        if role is None:
            what = "missing" if not token else "unknown"
            return Denied(401, f"{what} credential: this needs a {required.value} token")
        if not satisfies(role, required):
            return Denied(403, f"a {role.value} token may not do this: it needs {required.value}")
        return None


def token_from_headers(get: Callable[[str], str | None], query_p: str | None = None) -> str | None:
    """The credential of a request: ``Authorization: Bearer|Token <t>``, HTTP Basic's
    password (Telegraf, InfluxDB clients), or the InfluxDB ``p=`` query parameter."""
    header = get("authorization") or ""
    scheme, _, cred = header.partition(" ")
    scheme = scheme.lower()
    if scheme in ("bearer", "token"):
        return cred.strip() or None
    if scheme == "basic":
        try:
            return base64.b64decode(cred.strip()).decode().partition(":")[2] or None
        except (ValueError, UnicodeDecodeError):
            return None
    return query_p or None
