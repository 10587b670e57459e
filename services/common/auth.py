"""Bearer-token auth for the REST APIs of every service."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, status


def bearer(get_token: Callable[[], str | None]) -> Callable[[Request], Coroutine[Any, Any, None]]:
    """A FastAPI dependency: require ``Authorization: Bearer <token>`` when a token is set.

    ``get_token`` is read on every call so that a configuration reload takes effect.
    With no token configured the check passes (development default).
    """

    async def check(request: Request) -> None:
        token = get_token()
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="missing or wrong bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="kelvin"'},
            )

    return check
