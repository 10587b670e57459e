"""Who may do what: roles, credentials and the one decision every service's routes share.

Three roles, each a separate credential:

- ``read``: readings, hierarchy, Grafana, the Prometheus API, status pages;
- ``write``: ingest (``/write``, remote write, MQTT publishes of readings);
- ``admin``: configuration (virtual sensors, metadata, import, plugin control,
  policy, hall model, kicking clients) and everything the other two may do.

A route declares the role it needs where it is declared (``requires(Role.ADMIN)``
in :mod:`services.common.http` for FastAPI apps; the pusher's own router takes a
``Role`` per route), so a test can enumerate every route and prove the rule.

Also here, for every service: the shared ``auth`` settings' meaning
(:class:`AuthConfig`, tokens generated once into a 0600 file, reads open on
loopback) and the browser rule (:func:`check_host_origin`: Host allow-list,
Origin check). This module has no web framework in it: the pusher uses it
without FastAPI. docs/security.md explains the whole model.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar


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


HASH_PREFIX = "sha256:"


def hashed(token: str) -> str:
    """The ``sha256:<hex>`` verifier of a token (what a service that never sends it may hold)."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def is_hashed(token: str) -> bool:
    return token.startswith(HASH_PREFIX)


_R = TypeVar("_R")


def match_token(given: bytes, known: Mapping[str, _R]) -> _R | None:
    """The value ``known`` holds for the credential ``given`` (its keys plain tokens or
    ``sha256:`` verifiers), compared in constant time against every key; None if none
    matches. Shared by HTTP and the MQTT endpoint (a token as the MQTT password)."""
    found: _R | None = None
    digest = (HASH_PREFIX + hashlib.sha256(given).hexdigest()).encode()
    for token, value in known.items():
        probe = digest if token.startswith(HASH_PREFIX) else given
        # No early exit: the time taken does not tell which token matched.
        if hmac.compare_digest(probe, token.encode()):
            found = value
    return found


@dataclass
class Credentials:
    """The tokens a service accepts, each with its role, and the roles open to anyone.

    ``open_roles`` holds the roles that need no credential (``kelvin up`` leaves
    reads open on loopback; ``auth.mode: none`` opens every role). A known token may
    be given as ``sha256:<hex digest>``: a service that only checks a role then never
    holds the token itself (the chart gives pushers on compute nodes only digests).
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
        return match_token(token.encode(), self.tokens) if token else None

    def decide(self, token: str | None, required: Role) -> Denied | None:
        """None when a request with ``token`` may call a route needing ``required``."""
        if required in self.open_roles:
            return None
        role = self.role_of(token)
        if role is None:
            what = "missing" if not token else "unknown"
            return Denied(
                401, f"{what} credential: this needs a token with the {required.value} role"
            )
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


# --------------------------------------------------------------------------- the auth settings

DEFAULT_TOKEN_FILE = Path("data/auth/tokens.json")
"""Where generated tokens live unless ``auth.token_file`` says otherwise (``kelvin up
--data-dir DIR`` makes it ``DIR/auth/tokens.json``)."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""Host names a loopback-bound service answers to by default (IP literals always pass)."""


class AuthError(ValueError):
    """The ``auth`` settings or the token file cannot be used (a configuration error)."""


@dataclass(frozen=True)
class AuthConfig:
    """The shared ``auth`` section (YAML ``auth:``, env ``KELVIN_AUTH_*``), as every service reads it.

    - ``mode``: ``token`` (default) or ``none`` (everything open; only on purpose).
    - ``read_token`` / ``write_token`` / ``admin_token``: each optional; missing ones
      are generated once, at random, and kept 0600 in ``token_file``.
    - ``open_reads``: None = reads need no token only while bound to loopback.
    - ``allowed_hosts``: Host header names accepted (``*`` = any); None = loopback
      names on a loopback bind, any name otherwise (tokens guard it then).
    - ``allowed_origins``: browser origins besides the service's own that may send
      requests (e.g. a Grafana in browser-access mode).
    """

    mode: str = "token"
    read_token: str | None = None
    write_token: str | None = None
    admin_token: str | None = None
    token_file: Path | None = None
    open_reads: bool | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("token", "none"):
            raise AuthError(f"auth.mode: expected 'token' or 'none', got {self.mode!r}")
        for role in Role:
            tok = self.configured()[role]
            if tok is not None and is_hashed(tok):
                digest = tok[len(HASH_PREFIX) :]
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise AuthError(
                        f"auth.{role.value}_token: a sha256: verifier needs 64 lower-case hex digits"
                    )
            elif tok is not None and (len(tok) < 16 or tok != tok.strip()):
                raise AuthError(
                    f"auth.{role.value}_token: a token needs at least 16 characters and no "
                    "surrounding whitespace (leave it out to have one generated)"
                )

    @property
    def insecure(self) -> bool:
        return self.mode == "none"

    def configured(self) -> dict[Role, str | None]:
        return {
            Role.READ: self.read_token,
            Role.WRITE: self.write_token,
            Role.ADMIN: self.admin_token,
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AuthConfig:
        """Build from plain values (a YAML section merged with ``KELVIN_AUTH_*``; for
        services without pydantic-settings, such as the pusher). Lists may be given
        as comma-separated strings, booleans as ``true``/``false``/``null``."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AuthError(
                f"auth: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(known))}"
            )
        d = dict(data)
        if isinstance(d.get("open_reads"), str):
            d["open_reads"] = _bool_or_none(d["open_reads"], "auth.open_reads")
        for key in ("allowed_hosts", "allowed_origins"):
            v = d.get(key)
            if isinstance(v, str):
                v = [p.strip() for p in v.split(",") if p.strip()]
            if v is not None:
                d[key] = tuple(str(x) for x in v)
        if d.get("token_file") is not None:
            d["token_file"] = Path(d["token_file"])
        return cls(**d)


def _bool_or_none(v: str, what: str) -> bool | None:
    low = v.strip().lower()
    if low in ("", "null", "none"):
        return None
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise AuthError(f"{what}: expected true, false or null, got {v!r}")


def generate_token() -> str:
    """A random token: 32 bytes from the OS's CSPRNG, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Tokens:
    """The three tokens a service accepts, and where they came from."""

    by_role: dict[Role, str]
    file: Path | None
    """The token file read or written; None when every token was configured."""
    generated: bool
    """True when this call created the file (print the tokens once, then never again)."""


def resolve_tokens(config: AuthConfig, default_file: Path = DEFAULT_TOKEN_FILE) -> Tokens:
    """Configured tokens, the missing ones from the token file (created once if absent).

    The file is created atomically (written aside, then linked into place), so
    services starting together from one data directory end up with one set.
    """
    given = config.configured()
    if all(given.values()):
        return Tokens({r: t for r, t in given.items() if t}, None, False)
    path = config.token_file or default_file
    stored, generated = _load_or_create(path)
    return Tokens({r: given[r] or stored[r] for r in Role}, path, generated)


def _load_or_create(path: Path) -> tuple[dict[Role, str], bool]:
    if not path.exists():
        fresh = {r.value: generate_token() for r in Role}
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(fresh, fh)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # fails if another process created it first: use theirs
                return {r: fresh[r.value] for r in Role}, True
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise AuthError(
                f"auth.token_file {path}: cannot create it ({exc.strerror}); set auth.token_file "
                "to a writable place, or give read_token, write_token and admin_token"
            ) from exc
    return _read_token_file(path), False


def _read_token_file(path: Path) -> dict[Role, str]:
    try:
        mode = path.stat().st_mode & 0o777
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AuthError(f"auth.token_file {path}: cannot read it ({exc.strerror})") from exc
    except ValueError as exc:
        raise AuthError(
            f"auth.token_file {path}: not JSON ({exc}); delete it to generate new tokens"
        ) from exc
    if mode & 0o077:
        raise AuthError(f"auth.token_file {path}: readable by others (mode {mode:o}); chmod 600 it")
    out: dict[Role, str] = {}
    for r in Role:
        tok = doc.get(r.value) if isinstance(doc, dict) else None
        if not isinstance(tok, str) or len(tok) < 16:
            raise AuthError(
                f"auth.token_file {path}: no usable {r.value!r} token (expected a JSON object "
                '{"read": ..., "write": ..., "admin": ...}); delete it to generate new tokens'
            )
        out[r] = tok
    return out


def is_loopback(host: str) -> bool:
    """Whether a bind address (or Host name) is loopback only."""
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def build_credentials(config: AuthConfig, tokens: Tokens | None, bind_host: str) -> Credentials:
    """The credentials of a service bound to ``bind_host`` (``auth.mode: none`` opens all)."""
    if config.insecure:
        return Credentials({}, frozenset(Role))
    if tokens is None:
        raise AuthError("auth.mode is 'token' but no tokens were resolved")
    open_reads = is_loopback(bind_host) if config.open_reads is None else config.open_reads
    return Credentials.from_roles(
        {r: [t] for r, t in tokens.by_role.items()}, [Role.READ] if open_reads else []
    )


# --------------------------------------------------------------------------- browsers

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class BrowserPolicy:
    """Which Host names and foreign Origins a service accepts (see :func:`check_host_origin`)."""

    hosts: frozenset[str] | None
    """Accepted Host names, lower case, no port; a leading ``.`` accepts every name under it;
    None = any name."""
    origins: frozenset[str] = frozenset()
    """Foreign origins (``scheme://host[:port]``) allowed besides the service's own."""

    @classmethod
    def for_bind(cls, config: AuthConfig, bind_host: str) -> BrowserPolicy:
        """The configured allow-lists; by default loopback names on a loopback bind."""
        origins = frozenset(o.rstrip("/").lower() for o in config.allowed_origins)
        if config.allowed_hosts is not None:
            names = {h.strip().lower() for h in config.allowed_hosts if h.strip()}
            return cls(None if "*" in names else frozenset(names), origins)
        if is_loopback(bind_host):
            return cls(frozenset(LOOPBACK_NAMES), origins)
        return cls(None, origins)


def _split_host(value: str) -> tuple[str, str]:
    """``name[:port]`` or ``[v6][:port]`` -> (name lower case, port or '')."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return (v[1:end], v[end + 2 :]) if end > 0 else (v, "")
    name, _, port = v.partition(":")
    if ":" in port:  # a bare IPv6 address without brackets
        return v, ""
    return name, port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _host_allowed(name: str, hosts: frozenset[str] | None) -> bool:
    # An IP literal cannot be a rebound DNS name: a page on the attacker's address
    # can only reach the attacker, so kubelet probes and scrapers by pod IP pass.
    if hosts is None or _is_ip(name) or name in hosts:
        return True
    return any(h.startswith(".") and name.endswith(h) for h in hosts)


_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _origin_netloc(origin: str) -> tuple[str, str, str] | None:
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not rest or "/" in rest:
        return None
    name, port = _split_host(rest)
    return scheme, name, port or _DEFAULT_PORTS.get(scheme, "")


def check_host_origin(
    method: str,
    host: str | None,
    origin: str | None,
    fetch_site: str | None,
    policy: BrowserPolicy,
) -> Denied | None:
    """None when a request may proceed; else why not (403, reason in ``message``).

    - The Host header must name the service (``policy.hosts``) or be an IP literal:
      this defeats DNS rebinding, where a web page's own name resolves to Kelvin.
    - A request carrying an ``Origin`` must come from the service's own origin (the
      Host it was sent to) or from ``policy.origins``; ``Origin: null`` never passes.
      Kelvin answers no CORS, so this loses nothing a browser would have allowed.
    - A state-changing request marked ``Sec-Fetch-Site: cross-site`` is refused even
      without an Origin (text/plain and form POSTs from another site).

    Clients that are not browsers (curl, Telegraf, Grafana's server) send no Origin.
    """
    name, port = _split_host(host or "")
    if not name:
        return Denied(400, "host: the request has no Host header")
    if not _host_allowed(name, policy.hosts):
        return Denied(
            403,
            f"host: {name!r} is not a name this service answers to (auth.allowed_hosts); "
            "a web page whose own name points here (DNS rebinding) is refused",
        )
    if origin is not None:
        if origin.rstrip("/").lower() in policy.origins:
            return None
        parsed = _origin_netloc(origin)
        # A Host without a port was reached on its scheme's default port, and behind a
        # TLS-terminating ingress the browser's https origin arrives as plain http.
        same = parsed is not None and parsed[1] == name and (not port or parsed[2] == port)
        if not same:
            return Denied(
                403,
                f"origin: requests from the web page at {origin!r} are refused "
                "(add it to auth.allowed_origins to allow it)",
            )
        return None
    if method.upper() not in SAFE_METHODS and (fetch_site or "").lower() == "cross-site":
        return Denied(403, "origin: a state-changing request from another site is refused")
    return None


def local_token(role: Role, environ: Mapping[str, str] = os.environ) -> str | None:
    """A token of ``role`` for a command-line tool on this machine, never creating one:
    ``KELVIN_AUTH_<ROLE>_TOKEN``, else the token file (``KELVIN_AUTH_TOKEN_FILE`` or the
    default) when it exists and is readable."""
    given = environ.get(f"KELVIN_AUTH_{role.value.upper()}_TOKEN")
    if given:
        return given
    return stored_token(Path(environ.get("KELVIN_AUTH_TOKEN_FILE") or DEFAULT_TOKEN_FILE), role)


def stored_token(path: Path, role: Role) -> str | None:
    """``role``'s token in the token file at ``path``; None when there is none to read."""
    try:
        return _read_token_file(path)[role] if path.is_file() else None
    except AuthError:
        return None
