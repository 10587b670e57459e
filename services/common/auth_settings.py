"""The shared ``auth`` settings section (YAML ``auth:``, env ``KELVIN_AUTH_*``), for every service.

What each key means, token generation and the browser rule live in
:mod:`services.common.auth` (framework-free, so the pusher shares them); this
module reads the section (a light :class:`~services.common.config.SectionModel`:
the same YAML/env/flag precedence and errors as the pydantic-settings sections,
without pydantic, because ``kelvin run pusher`` reads it too on compute nodes)
and turns it into what a service's HTTP app needs (:class:`ServiceAuth`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from services.common.auth import (
    DEFAULT_TOKEN_FILE,
    AuthConfig,
    AuthError,
    BrowserPolicy,
    Credentials,
    Role,
    Tokens,
    build_credentials,
    is_hashed,
    resolve_tokens,
    stored_token,
)
from services.common.config import Config, SectionModel
from services.common.errors import ConfigError
from services.common.schema import Field

log = logging.getLogger(__name__)


class AuthSettings(SectionModel):
    """Credentials and browser checks shared by every service (see docs/security.md)."""

    section: ClassVar[str] = "auth"

    mode: Literal["token", "none"] = "token"
    """``token``: every route needs a credential of its role. ``none``: everything is open
    to anyone who can connect (``kelvin up --insecure``); a warning at start and a banner
    in the console say so."""
    read_token: str | None = Field(None, min_length=16)
    """Token of the ``read`` role (Grafana, dashboards, the console's views)."""
    write_token: str | None = Field(None, min_length=16)
    """Token of the ``write`` role (ingest: HTTP ``/write``, pushers)."""
    admin_token: str | None = Field(None, min_length=16)
    """Token of the ``admin`` role (configuration; includes read and write)."""
    token_file: Path | None = None
    """Where tokens not given above are generated once and kept (mode 0600); None =
    ``data/auth/tokens.json`` (``<--data-dir>/auth/tokens.json`` under ``kelvin up/run``)."""
    open_reads: bool | None = None
    """Whether reads need no token; None = only while the service is bound to loopback."""
    allowed_hosts: list[str] | None = None
    """Host header names accepted (``*`` any; ``.example.org`` every name under it; IP
    literals always pass); None = loopback names on a loopback bind, any otherwise."""
    allowed_origins: list[str] = []
    """Web origins (``https://grafana.example.org``) allowed to send requests besides
    the service's own pages."""

    def to_config(self) -> AuthConfig:
        try:
            return AuthConfig(
                mode=self.mode,
                read_token=self.read_token,
                write_token=self.write_token,
                admin_token=self.admin_token,
                token_file=self.token_file,
                open_reads=self.open_reads,
                allowed_hosts=None if self.allowed_hosts is None else tuple(self.allowed_hosts),
                allowed_origins=tuple(self.allowed_origins),
            )
        except AuthError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class ServiceAuth:
    """What one service's HTTP app enforces: who may call which role, and the browser rule."""

    config: AuthConfig
    tokens: Tokens | None
    """None under ``auth.mode: none``."""
    credentials: Credentials
    browser: BrowserPolicy

    @property
    def insecure(self) -> bool:
        return self.config.insecure

    def token(self, role: Role) -> str | None:
        """This service's own token of ``role``, for calling the other services (None when
        it holds only the token's sha256 verifier, or under ``auth.mode: none``)."""
        tok = self.tokens.by_role.get(role) if self.tokens is not None else None
        return None if tok is None or is_hashed(tok) else tok


def load_auth(config: Config) -> AuthConfig:
    return config.load(AuthSettings).to_config()


def client_token(config: Config, role: Role) -> str | None:
    """A token of ``role`` for a tool calling the services: the configured one, else the
    token file's (never generating one); None under ``auth.mode: none`` or when only its
    sha256 verifier is configured."""
    cfg = load_auth(config)
    if cfg.insecure:
        return None
    given = cfg.configured()[role]
    if given is not None:
        return None if is_hashed(given) else given  # a verifier is no credential to send
    return stored_token(cfg.token_file or DEFAULT_TOKEN_FILE, role)


def service_auth(config: Config, bind_host: str, what: str = "") -> ServiceAuth:
    """Resolve the ``auth`` section for a service bound to ``bind_host``.

    Missing tokens are read from, or generated into, the token file; a service
    running open says so at start (``what`` names it in the log line).
    """
    cfg = load_auth(config)
    try:
        tokens = None if cfg.insecure else resolve_tokens(cfg, DEFAULT_TOKEN_FILE)
        creds = build_credentials(cfg, tokens, bind_host)
    except AuthError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.insecure:
        log.warning(
            "%sauth.mode is 'none': anyone who can reach %s may read, write and change "
            "everything (started with --insecure or auth.mode: none)",
            f"{what}: " if what else "",
            bind_host,
        )
    return ServiceAuth(cfg, tokens, creds, BrowserPolicy.for_bind(cfg, bind_host))
