"""MQTT client credentials: per-node passwords derived from one secret, password files, TLS.

Derived passwords: password = HMAC-SHA256(secret, ``kelvin-mqtt:`` + user).

A DaemonSet's pods share one Secret, so a per-node identity cannot come from
the Secret itself. Instead the collect agent holds one *node secret* and
accepts, for any user name, the password derived from it; an init container
that alone sees the secret writes the derived password of its node for the
main container. A pod that leaks its password leaks only its own node's
identity, and the ACL (``/%u/#``) keeps that identity to its own prefix.

The same password from a shell (DCDB pushers, other tools)::

    printf 'kelvin-mqtt:%s' "$USER" | openssl dgst -sha256 -hmac "$SECRET" | cut -d' ' -f2

``python -m services.common.mqtt_credentials --user NAME --out FILE`` (secret in
``KELVIN_MQTT_NODE_SECRET``) is what the chart's init containers run.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from services.common.errors import ConfigError

_LABEL = b"kelvin-mqtt:"
SECRET_ENV = "KELVIN_MQTT_NODE_SECRET"


def derive_password(secret: str, username: str) -> str:
    """The password of ``username`` under ``secret`` (64 hex characters)."""
    mac = hmac.new(secret.encode("utf-8"), _LABEL + username.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()


def read_password(password: str | None, password_file: Path | None, what: str) -> str | None:
    """A client's MQTT password: ``password``, else the first line of ``password_file``
    (the file an init container wrote). ``what`` names the setting in errors."""
    if password or password_file is None:
        return password
    try:
        text = password_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {password_file}: {exc.strerror or exc}") from exc
    return text.splitlines()[0].strip() if text.strip() else None


class _NamedTLS(ssl.SSLContext):
    """Verifies the broker's certificate for a fixed name, whatever host was dialled
    (paho passes the host it connects to as ``server_hostname``)."""

    server_name = ""

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(*args, **kwargs)


def client_tls(
    enabled: bool, ca: Path | None, what: str, server_name: str | None = None
) -> ssl.SSLContext | None:
    """The TLS context of an MQTT client: verify the broker against ``ca`` (None: the
    system's CAs), for ``server_name`` if given; None when TLS is off."""
    if not enabled:
        return None
    ctx = (
        _NamedTLS(ssl.PROTOCOL_TLS_CLIENT)
        if server_name
        else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    if isinstance(ctx, _NamedTLS):
        ctx.server_name = server_name or ""
    try:
        if ca is not None:
            ctx.load_verify_locations(cafile=str(ca))
        else:
            ctx.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: cannot load the CA {ca}: {exc}") from exc
    return ctx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.common.mqtt_credentials",
        description=f"Write the MQTT password of one user, derived from ${SECRET_ENV}.",
    )
    parser.add_argument("--user", required=True, help="MQTT user name (e.g. the node's name)")
    parser.add_argument("--out", required=True, type=Path, help="file to write (mode 0400)")
    args = parser.parse_args(argv)
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        print(f"error: {SECRET_ENV} is empty: the node secret is needed", file=sys.stderr)
        return 2
    if not args.user:
        print("error: --user is empty", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(derive_password(secret, args.user))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
