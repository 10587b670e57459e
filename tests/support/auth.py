"""Credentials of a test service: fixed tokens per role, and the headers that carry them.

Services under test get all three tokens in their ``auth`` section, so none writes a
token file; clients send the admin token (which may do everything) unless a test
checks a role on purpose. MQTT clients log in to a collect agent the same way: the
token is the password (:data:`MQTT_LOGIN`).
"""

from __future__ import annotations

from typing import Any

from services.common.auth import Role

TOKENS = {
    Role.READ: "test-read-token-0000000000",
    Role.WRITE: "test-write-token-000000000",
    Role.ADMIN: "test-admin-token-00000000",
}
AUTH_SECTION: dict[str, Any] = {f"{role.value}_token": tok for role, tok in TOKENS.items()}
"""The ``auth`` settings section of a test service."""


def headers(role: Role = Role.ADMIN) -> dict[str, str]:
    """``Authorization`` of a client holding ``role``'s token."""
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def with_auth(overrides: dict[str, dict[str, Any]], **auth: Any) -> dict[str, dict[str, Any]]:
    """``overrides`` (a Config's sections) with the test credentials (plus ``auth`` keys)."""
    return {**overrides, "auth": {**AUTH_SECTION, **overrides.get("auth", {}), **auth}}


def write_config_yaml(**auth: Any) -> str:
    """The ``auth:`` section as YAML, for tests that start ``kelvin`` with ``--config``."""
    lines = ["auth:"] + [f"  {k}: {v}" for k, v in {**AUTH_SECTION, **auth}.items()]
    return "\n".join(lines) + "\n"


MQTT_USER = "test-client"
MQTT_LOGIN: dict[str, str] = {"username": MQTT_USER, "password": TOKENS[Role.ADMIN]}
"""``username``/``password`` keywords of an MQTT client (aiomqtt, paho, ``mp.connect``)
publishing to a test collect agent: the admin token, which may publish anything."""


def mosquitto_login(role: Role = Role.ADMIN) -> list[str]:
    """``mosquitto_pub`` arguments logging in with ``role``'s token."""
    return ["-u", MQTT_USER, "-P", TOKENS[role]]
