"""Slurm JWTs for slurmrestd, renewed before they expire.

Three sources, in order of preference:

- ``jwt_key_file``: the cluster's JWT signing key (``AuthAltParameters=jwt_key=``);
  the bridge signs its own HS256 tokens (claims ``sun``, ``iat``, ``exp``, as
  ``scontrol token`` does) and signs a new one when 80 % of the lifespan is gone;
- ``token_command``: a command that prints a token (``scontrol token
  lifespan=3600`` prints ``SLURM_JWT=...``), run again at 80 % of the
  token's own lifespan (read from its ``exp`` and ``iat``);
- ``token_file`` / ``token``: a token someone else renews (a Kubernetes
  Secret); the file is read again whenever it changes, and after a 401.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.errors import ConfigError, KelvinError
from services.common.tasks import wait_for

log = logging.getLogger(__name__)

RENEW_AT = 0.8
"""Renew once this share of a token's lifespan has passed."""


class TokenError(KelvinError):
    """No usable JWT: the source is missing, unreadable or empty."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(key: bytes, user: str, lifespan_s: int, now_s: int | None = None) -> str:
    """An HS256 Slurm JWT for ``user``, valid for ``lifespan_s`` from ``now_s``."""
    now = int(time.time()) if now_s is None else now_s
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"exp": now + lifespan_s, "iat": now, "sun": user}
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(mac)}"


def claims(token: str) -> dict[str, Any]:
    """The (unverified) claims of a JWT; {} if it has none readable."""
    try:
        body = token.split(".")[1]
        doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (IndexError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _renew_after(token: str, fallback_s: float) -> float:
    """Seconds since the epoch after which ``token`` should be replaced."""
    c = claims(token)
    exp, iat = c.get("exp"), c.get("iat")
    if isinstance(exp, int | float):
        start = iat if isinstance(iat, int | float) else time.time()
        return float(start + RENEW_AT * (exp - start))
    return time.time() + fallback_s


def _from_text(text: str) -> str:
    """A token from ``SLURM_JWT=...`` or a bare token (first non-empty line)."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.split("=", 1)[1].strip() if line.startswith("SLURM_JWT=") else line
    return ""


class TokenSource:
    """The current token; :meth:`get` renews it when due, :meth:`invalidate` after a 401."""

    def __init__(
        self,
        user: str,
        token: str | None = None,
        token_file: Path | None = None,
        jwt_key_file: Path | None = None,
        token_command: Sequence[str] | None = None,
        lifespan_s: int = 3600,
    ) -> None:
        if not (token or token_file or jwt_key_file or token_command):
            raise ConfigError(
                "slurm_bridge: slurmrestd needs a JWT: set jwt_key_file, token_command, "
                "token_file or token"
            )
        self.user = user
        self.static = token
        self.file = token_file
        self.key_file = jwt_key_file
        self.command = list(token_command) if token_command else None
        self.lifespan_s = lifespan_s
        self._token: str | None = None
        self._renew_s = 0.0
        self._file_stamp: tuple[float, int] | None = None
        self._lock = asyncio.Lock()
        self.renewals = 0

    def invalidate(self) -> None:
        self._renew_s = 0.0
        self._file_stamp = None

    async def get(self) -> str:
        async with self._lock:
            if self._token is None or time.time() >= self._renew_s or self._file_changed():
                self._token = await self._fetch()
                self.renewals += 1
            return self._token

    def _file_changed(self) -> bool:
        if self.file is None or self.key_file or self.command:
            return False
        try:
            st = self.file.stat()
        except OSError:
            return False
        return (st.st_mtime, st.st_size) != self._file_stamp

    async def _fetch(self) -> str:
        if self.key_file is not None:
            try:
                key = self.key_file.read_bytes()
            except OSError as exc:
                raise TokenError(f"jwt_key_file {self.key_file}: {exc.strerror}") from exc
            if not key:
                raise TokenError(f"jwt_key_file {self.key_file} is empty")
            token = sign(key, self.user, self.lifespan_s)
            self._renew_s = time.time() + RENEW_AT * self.lifespan_s
            return token
        if self.command:
            token = _from_text(await self._run_command())
            if not token:
                raise TokenError(f"token_command {self.command[0]} printed no token")
            self._renew_s = _renew_after(token, RENEW_AT * self.lifespan_s)
            log.info("slurm bridge: new JWT from %s", self.command[0])
            return token
        if self.file is not None:
            try:
                st = self.file.stat()
                token = _from_text(self.file.read_text(encoding="utf-8"))
            except OSError as exc:
                raise TokenError(f"token_file {self.file}: {exc.strerror}") from exc
            if not token:
                raise TokenError(f"token_file {self.file} holds no token")
            self._file_stamp = (st.st_mtime, st.st_size)
            self._renew_s = _renew_after(token, 60.0)
            return token
        assert self.static is not None
        self._renew_s = float("inf")
        return self.static

    async def _run_command(self) -> str:
        assert self.command is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
            )
            out, err = await wait_for(proc.communicate(), 30.0)
        except (OSError, TimeoutError) as exc:
            raise TokenError(f"token_command {self.command[0]}: {exc}") from exc
        if proc.returncode != 0:
            raise TokenError(
                f"token_command {self.command[0]}: exit {proc.returncode}: "
                f"{err.decode(errors='replace').strip()[:200]}"
            )
        return out.decode(errors="replace")
