"""Who may connect to the built-in MQTT endpoint and which topics each may publish.

Credentials, checked on CONNECT (user name + password):

* ``mqtt_users``: static users (a site's DCDB pushers, tools), each a *node* user;
* ``mqtt_node_secret``: any user name whose password is
  :func:`~services.common.mqtt_credentials.derive_password` of it (the chart's
  pushers: one identity per node from one Secret), also *node* users;
* Kelvin's own tokens as the password (any user name): the write token publishes
  like ``/write`` does, the admin token publishes anything.

Every PUBLISH of a restricted identity is checked against its ACL, the way
mosquitto's ``pattern`` lines work: sensor-name filters with ``%u`` (user name)
and ``%c`` (client id), MQTT ``+`` and ``#``. The filters apply to the sensor a
topic names, whatever its form: a DCDB topic, a KVB1 batch's prefix (the whole
subtree must be allowed), a ``/DCDB_MAP/...`` public name or metadata. Job records
(``/DCDB_JOBDATA/``) need the ``jobs`` grant. Decisions are cached per identity
and topic, in one bounded cache for the whole endpoint.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from services.common import codec
from services.common.auth import match_token
from services.common.errors import PayloadError, SensorNameError
from services.common.mqtt_credentials import derive_password

Role = Literal["anonymous", "admin", "write", "node"]
_CACHE_MAX = 200_000
"""(identity, topic) decisions kept for the whole endpoint; all are dropped past it."""


def _check_filter(f: str) -> str:
    levels = f.split("/")
    if f != "#" and not f.startswith("/"):
        raise ValueError(f"topic filter {f!r} must start with '/' (a sensor name) or be '#'")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"topic filter {f!r}: '#' must be a whole, last level")
        if "+" in level and level != "+":
            raise ValueError(f"topic filter {f!r}: '+' must be a whole level")
    return f


class MqttUserGrant(BaseModel):
    """What one user may publish (overrides ``node_topics`` for it)."""

    model_config = ConfigDict(extra="forbid")

    topics: list[str] | None = None
    """Sensor-name filters (``%u``, ``%c``, ``+``, ``#``); None = ``node_topics``."""
    jobs: bool = False
    """May publish job records (``/DCDB_JOBDATA/``): the allocator, a Slurm bridge."""

    @field_validator("topics")
    @classmethod
    def _valid_topics(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [_check_filter(f) for f in v]


class MqttAcl(BaseModel):
    """Per-topic ACL of the built-in endpoint (see :mod:`services.collect_agent.mqtt_auth`)."""

    model_config = ConfigDict(extra="forbid")

    node_topics: list[str] = ["/%u/#"]
    """Filters a node user (``mqtt_users``, derived passwords) may publish readings and
    metadata under: by default its own hierarchy level, the user name being the node's
    name (the chart's pushers publish under ``/<node>``)."""
    users: dict[str, MqttUserGrant] = {}
    """Per user name: its own filters and grants (e.g. ``{dcdb-rack7: {topics: [/rack7/#]}}``)."""
    write_topics: list[str] = ["#"]
    """Filters a login with Kelvin's write token may publish readings and metadata under."""

    @field_validator("node_topics", "write_topics")
    @classmethod
    def _valid_filters(cls, v: list[str]) -> list[str]:
        return [_check_filter(f) for f in v]


@dataclass(slots=True)
class Identity:
    """An authenticated connection's rights; ``topics`` None = every sensor."""

    username: str | None
    role: Role
    topics: tuple[tuple[str, ...], ...] | None
    jobs: bool
    allowed: set[bytes] = field(default_factory=set)
    """Topics found allowed (the hot path's one lookup); shared by its connections."""
    denied: dict[bytes, str] = field(default_factory=dict)
    """Topics found denied, with the reason."""

    @property
    def unrestricted(self) -> bool:
        return self.topics is None and self.jobs


_ANY = Identity(None, "anonymous", None, True)


def _substitute(f: str, username: str | None, client_id: str) -> tuple[str, ...] | None:
    """Compile one filter for one connection; None when a substitution is unsafe."""
    for mark, value in (("%u", username), ("%c", client_id)):
        if mark in f:
            # A '/', '+' or '#' in a name would widen the filter beyond one level.
            if not value or any(ch in value for ch in "/+#"):
                return None
            f = f.replace(mark, value)
    return tuple(f.split("/")) if f != "#" else ("#",)


def _matches(f: tuple[str, ...], levels: list[str]) -> bool:
    n = len(levels)
    for i, fl in enumerate(f):
        if fl == "#":
            return True  # also the parent level itself, as in MQTT
        if i >= n or (fl != "+" and fl != levels[i]):
            return False
    return len(f) == n


def _covers(f: tuple[str, ...], prefix_levels: list[str]) -> bool:
    """True when every sensor equal to or under the prefix matches ``f``."""
    if f[-1] != "#":
        return False
    k = len(f) - 1
    if len(prefix_levels) < k:
        return False
    return all(fl == "+" or fl == prefix_levels[i] for i, fl in enumerate(f[:k]))


class MqttAuth:
    """Authenticates CONNECTs and authorises PUBLISH topics (see the module docstring)."""

    def __init__(
        self,
        users: Mapping[str, str],
        node_secret: str | None,
        acl: MqttAcl,
        tokens: Callable[[], Mapping[str, str]] | None = None,
        anonymous: bool = False,
    ) -> None:
        """``tokens`` gives Kelvin's credentials as {token: "write"|"admin"|...}, each
        token plain or as its ``sha256:`` verifier (read tokens and other roles are not
        accepted); ``anonymous`` lets clients without a user name in with every right
        (Kelvin's auth off)."""
        self.users = {u: p.encode("utf-8") for u, p in users.items()}
        self.node_secret = node_secret or None
        self.acl = acl
        self.tokens = tokens
        self.anonymous = anonymous
        self._identities: dict[tuple[str, str | None, str], Identity] = {}
        self._cached = 0

    @property
    def required(self) -> bool:
        return not self.anonymous

    def authenticate(
        self, username: str | None, password: bytes | None
    ) -> tuple[Role, str | None] | str:
        """(role, user name) or the refusal reason: ``auth_missing`` / ``auth_failed``."""
        if username is None and password is None:
            return ("anonymous", None) if self.anonymous else "auth_missing"
        if not password:
            return "auth_failed" if username else "auth_missing"
        role: Role | None = None
        known = self.users.get(username or "")
        if known is not None and hmac.compare_digest(password, known):
            role = "node"
        if role is None and self.node_secret and username:
            derived = derive_password(self.node_secret, username).encode()
            if hmac.compare_digest(password, derived):
                role = "node"
        if role is None and self.tokens is not None:
            found = match_token(password, self.tokens())
            if found in ("admin", "write"):
                role = found  # type: ignore[assignment]
        if role is None:
            return "auth_failed"
        return role, username

    def identity(self, role: Role, username: str | None, client_id: str) -> Identity:
        """The rights of one connection, shared with others of the same identity."""
        if role in ("anonymous", "admin"):
            return _ANY
        if role == "write":
            patterns, jobs = self.acl.write_topics, False
        else:
            grant = self.acl.users.get(username or "")
            patterns = grant.topics if grant and grant.topics is not None else self.acl.node_topics
            jobs = bool(grant and grant.jobs)
        by_client = any("%c" in p for p in patterns)
        key = (role, username, client_id if by_client else "")
        ident = self._identities.get(key)
        if ident is None:
            compiled = [_substitute(p, username, client_id) for p in patterns]
            filters = tuple(f for f in compiled if f is not None)
            unrestricted = ("#",) in filters
            ident = Identity(username, role, None if unrestricted else filters, jobs)
            if len(self._identities) > 50_000:
                self._identities.clear()
            self._identities[key] = ident
        return ident

    def decide(self, ident: Identity, topic: bytes) -> str | None:
        """None if ``ident`` may publish on ``topic``, else the denial reason (cached)."""
        cached = ident.denied.get(topic)
        if cached is not None:
            return cached
        decision = self._decide(ident, topic)
        if self._cached >= _CACHE_MAX:
            for i in self._identities.values():
                i.allowed.clear()
                i.denied.clear()
            self._cached = 0
        if decision is None:
            ident.allowed.add(topic)
        else:
            ident.denied[topic] = decision
        self._cached += 1
        return decision

    @staticmethod
    def _decide(ident: Identity, topic: bytes) -> str | None:
        try:
            kind, name = codec.classify(topic.decode("utf-8"))
        except (UnicodeDecodeError, SensorNameError, PayloadError):
            return None  # not a valid topic: the ingestor rejects it with its own reason
        if kind is codec.TopicKind.JOBDATA:
            return None if ident.jobs else "denied_jobs"
        if ident.topics is None:
            return None
        if kind is codec.TopicKind.BATCH:
            levels = [""] if name == "/" else name.split("/")
            if any(_covers(f, levels) for f in ident.topics):
                return None
        else:
            levels = name.split("/")
            if any(_matches(f, levels) for f in ident.topics):
                return None
        if kind is codec.TopicKind.METADATA or kind is codec.TopicKind.MAP:
            return "denied_metadata"
        return "denied_topic"
