"""Roles and the one decision: who may call a route that needs a given role."""

from __future__ import annotations

import base64
import concurrent.futures
import json
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from services.common.auth import (
    LOOPBACK_NAMES,
    AuthConfig,
    AuthError,
    BrowserPolicy,
    Credentials,
    Role,
    build_credentials,
    check_host_origin,
    hashed,
    resolve_tokens,
    satisfies,
    token_from_headers,
)
from services.common.http import requires, route_role

CREDS = Credentials.from_roles(
    {Role.READ: ["r-tok"], Role.WRITE: ["w-tok"], Role.ADMIN: ["a-tok", None, ""]}
)


@pytest.mark.parametrize(
    ("held", "required", "ok"),
    [
        (Role.ADMIN, Role.READ, True),
        (Role.ADMIN, Role.WRITE, True),
        (Role.ADMIN, Role.ADMIN, True),
        (Role.WRITE, Role.WRITE, True),
        (Role.WRITE, Role.READ, False),
        (Role.WRITE, Role.ADMIN, False),
        (Role.READ, Role.READ, True),
        (Role.READ, Role.WRITE, False),
        (Role.READ, Role.ADMIN, False),
    ],
)
def test_grants(held: Role, required: Role, ok: bool) -> None:
    assert satisfies(held, required) is ok


def test_decide_distinguishes_missing_unknown_and_too_low() -> None:
    assert CREDS.decide("a-tok", Role.ADMIN) is None
    missing = CREDS.decide(None, Role.READ)
    assert missing is not None and missing.status == 401 and "missing" in missing.message
    unknown = CREDS.decide("nope", Role.READ)
    assert unknown is not None and unknown.status == 401 and "unknown" in unknown.message
    low = CREDS.decide("r-tok", Role.WRITE)
    assert low is not None and low.status == 403
    assert CREDS.role_of("") is None, "empty tokens are never credentials"


def test_open_roles_need_no_credential_but_others_still_do() -> None:
    c = Credentials.from_roles({Role.ADMIN: ["a"]}, open_roles=[Role.READ])
    assert c.decide(None, Role.READ) is None
    assert c.decide(None, Role.WRITE) is not None


def test_token_from_headers_takes_the_forms_influx_clients_send() -> None:
    def h(value: str | None) -> dict[str, str]:
        return {"authorization": value} if value else {}

    assert token_from_headers(h("Bearer abc").get) == "abc"
    assert token_from_headers(h("Token abc").get) == "abc"
    basic = base64.b64encode(b"user:secret").decode()
    assert token_from_headers(h(f"Basic {basic}").get) == "secret"
    assert token_from_headers(h("Basic !!!").get) is None
    assert token_from_headers(h(None).get, "qp") == "qp"
    assert token_from_headers(h(None).get) is None


async def test_requires_refuses_by_role_and_declares_it() -> None:
    app = FastAPI()
    app.state.credentials = lambda: CREDS

    @app.post("/cfg", dependencies=[requires(Role.ADMIN)])
    async def cfg() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/unset", dependencies=[requires(Role.READ)])
    async def unset() -> dict[str, bool]:
        return {"ok": True}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.post("/cfg")).status_code == 401
        assert (await c.post("/cfg", headers={"authorization": "Bearer w-tok"})).status_code == 403
        assert (await c.post("/cfg", headers={"authorization": "Bearer a-tok"})).status_code == 200
        app.state.credentials = None  # never configured: refuse, never open
        assert (await c.get("/unset", headers={"authorization": "Bearer a-tok"})).status_code == 401
    roles = {
        r.path: route_role([d.call for d in r.dependant.dependencies])  # type: ignore[attr-defined]
        for r in app.routes
        if hasattr(r, "dependant")
    }
    assert roles["/cfg"] is Role.ADMIN and roles["/unset"] is Role.READ


# --------------------------------------------------------------------------- tokens


def test_missing_tokens_are_generated_once_into_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "auth" / "tokens.json"
    first = resolve_tokens(AuthConfig(token_file=path))
    assert first.generated and first.file == path
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert len(set(first.by_role.values())) == 3
    assert all(len(t) >= 40 for t in first.by_role.values())
    again = resolve_tokens(AuthConfig(token_file=path))
    assert not again.generated and again.by_role == first.by_role
    assert json.loads(path.read_text()) == {r.value: t for r, t in first.by_role.items()}


def test_configured_tokens_win_and_need_no_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    cfg = AuthConfig(
        read_token="r" * 20, write_token="w" * 20, admin_token="a" * 20, token_file=path
    )
    got = resolve_tokens(cfg)
    assert got.file is None and not path.exists()
    partial = resolve_tokens(AuthConfig(admin_token="a" * 20, token_file=path))
    assert partial.by_role[Role.ADMIN] == "a" * 20 and partial.by_role[Role.READ] != "r" * 20


def test_services_starting_together_share_one_set(tmp_path: Path) -> None:
    path = tmp_path / "auth" / "tokens.json"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        sets = list(pool.map(lambda _: resolve_tokens(AuthConfig(token_file=path)), range(16)))
    assert sum(s.generated for s in sets) == 1
    assert len({tuple(sorted(s.by_role.values())) for s in sets}) == 1


def test_a_token_file_others_can_read_or_that_is_damaged_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    resolve_tokens(AuthConfig(token_file=path))
    path.chmod(0o644)
    with pytest.raises(AuthError, match="readable by others"):
        resolve_tokens(AuthConfig(token_file=path))
    path.write_text("{not json")
    path.chmod(0o600)
    with pytest.raises(AuthError, match="not JSON"):
        resolve_tokens(AuthConfig(token_file=path))
    path.write_text('{"read": "short"}')
    with pytest.raises(AuthError, match="no usable 'read' token"):
        resolve_tokens(AuthConfig(token_file=path))


def test_bad_auth_settings_say_what_is_expected() -> None:
    with pytest.raises(AuthError, match="expected 'token' or 'none'"):
        AuthConfig(mode="off")
    with pytest.raises(AuthError, match="at least 16 characters"):
        AuthConfig(admin_token="short")
    with pytest.raises(AuthError, match="64 lower-case hex"):
        AuthConfig(read_token="sha256:abc")
    with pytest.raises(AuthError, match="unknown key"):
        AuthConfig.from_mapping({"moed": "none"})
    cfg = AuthConfig.from_mapping(
        {"open_reads": "null", "allowed_hosts": "a.example.org, b", "token_file": "/x/t.json"}
    )
    assert cfg.open_reads is None and cfg.allowed_hosts == ("a.example.org", "b")
    assert cfg.token_file == Path("/x/t.json")


def test_reads_are_open_only_on_loopback_unless_configured() -> None:
    tokens = resolve_tokens(
        AuthConfig(read_token="r" * 20, write_token="w" * 20, admin_token="a" * 20)
    )
    loop = build_credentials(AuthConfig(), tokens, "127.0.0.1")
    assert loop.decide(None, Role.READ) is None and loop.decide(None, Role.WRITE) is not None
    wide = build_credentials(AuthConfig(), tokens, "0.0.0.0")
    assert wide.decide(None, Role.READ) is not None
    forced = build_credentials(AuthConfig(open_reads=False), tokens, "::1")
    assert forced.decide(None, Role.READ) is not None
    open_all = build_credentials(AuthConfig(mode="none"), None, "0.0.0.0")
    assert open_all.decide(None, Role.ADMIN) is None


def test_a_sha256_verifier_accepts_the_token_but_not_itself() -> None:
    creds = Credentials.from_roles({Role.ADMIN: [hashed("the-admin-token-123")]})
    assert creds.role_of("the-admin-token-123") is Role.ADMIN
    assert creds.role_of(hashed("the-admin-token-123")) is None
    assert creds.role_of("another-token-12345") is None


# --------------------------------------------------------------------------- browsers

LOCAL = BrowserPolicy(frozenset(LOOPBACK_NAMES))


@pytest.mark.parametrize(
    ("method", "host", "origin", "site", "ok"),
    [
        ("GET", "127.0.0.1:8080", None, None, True),
        ("GET", "localhost:8080", None, None, True),
        ("GET", "[::1]:8080", None, None, True),
        ("GET", "10.1.2.3:8080", None, None, True),  # an IP literal cannot be rebound
        ("GET", "evil.example.com:8080", None, None, False),  # DNS rebinding
        ("POST", "127.0.0.1:8080", "http://127.0.0.1:8080", "same-origin", True),
        ("POST", "localhost:8080", "http://evil.example.com", "cross-site", False),  # form POST
        ("POST", "localhost:8080", "null", "cross-site", False),  # sandboxed page
        ("POST", "localhost:8080", "http://localhost:9999", "same-site", False),  # other port
        ("POST", "localhost:8080", None, "cross-site", False),  # no Origin, still cross-site
        ("GET", "localhost:8080", None, "cross-site", True),  # a link from elsewhere
        ("GET", "localhost:8080", "http://evil.example.com", "cross-site", False),  # fetch()
        ("POST", "localhost:8080", None, None, True),  # curl, Telegraf
        ("GET", "", None, None, False),
    ],
)
def test_host_and_origin(
    method: str, host: str, origin: str | None, site: str | None, ok: bool
) -> None:
    assert (check_host_origin(method, host, origin, site, LOCAL) is None) is ok


def test_configured_hosts_suffixes_and_origins() -> None:
    cfg = AuthConfig(
        allowed_hosts=("kelvin.example.org", ".kelvin.svc"),
        allowed_origins=("https://grafana.example.org",),
    )
    p = BrowserPolicy.for_bind(cfg, "0.0.0.0")
    assert check_host_origin("GET", "kelvin.example.org", None, None, p) is None
    assert check_host_origin("GET", "kelvin-query-api.kelvin.svc:8080", None, None, p) is None
    assert check_host_origin("GET", "kelvin.svc.evil.org", None, None, p) is not None
    # behind a TLS-terminating ingress the browser's origin is https, the Host plain
    assert (
        check_host_origin("POST", "kelvin.example.org", "https://kelvin.example.org", None, p)
        is None
    )
    assert (
        check_host_origin("POST", "kelvin.example.org", "https://grafana.example.org", None, p)
        is None
    )
    assert (
        check_host_origin("POST", "kelvin.example.org", "https://other.example.org", None, p)
        is not None
    )
    anywhere = BrowserPolicy.for_bind(AuthConfig(), "0.0.0.0")
    assert check_host_origin("GET", "any.name.example", None, None, anywhere) is None
    assert BrowserPolicy.for_bind(AuthConfig(), "127.0.0.1").hosts == frozenset(LOOPBACK_NAMES)


def test_tools_never_send_a_verifier(tmp_path: Path) -> None:
    from services.common.auth_settings import client_token
    from services.common.settings import Config

    cfg = Config(overrides={"auth": {"admin_token": hashed("x" * 20), "read_token": "r" * 20,
                                     "token_file": str(tmp_path / "none.json")}})  # fmt: skip
    assert client_token(cfg, Role.ADMIN) is None
    assert client_token(cfg, Role.READ) == "r" * 20
