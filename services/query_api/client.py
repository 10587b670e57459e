"""A small synchronous client of the query API, used by the ``kelvin`` tool commands."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx

from services.common.auth import Role, local_token
from services.common.errors import KelvinError, NotFoundError

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "KELVIN_QUERY_API_URL"
TOKEN_ENV = "KELVIN_QUERY_API_TOKEN"


class ApiError(KelvinError):
    """The query API answered with an error (``status``: its HTTP status, 0 if unreachable)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def default_url() -> str:
    return os.environ.get(URL_ENV, DEFAULT_URL)


class Client:
    """Talks to one query API; raises NotFoundError / ApiError with the server's detail."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout_s: float = 300.0
    ) -> None:
        self.url = (url or default_url()).rstrip("/")
        # A local `kelvin up`'s generated admin token serves when none is given.
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        token = token or local_token(Role.ADMIN)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.status_code < 400:
            return resp
        try:
            body = resp.json()
            detail = body.get("detail") if isinstance(body, dict) else body
        except ValueError:
            detail = resp.text
        if resp.status_code == 404:
            raise NotFoundError(str(detail))
        if resp.status_code in (401, 403):
            raise ApiError(
                f"{self.url}: {detail} (pass --token or set {TOKEN_ENV})", resp.status_code
            )
        raise ApiError(f"{self.url}: HTTP {resp.status_code}: {detail}", resp.status_code)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the query API at {self.url}: {exc}") from exc
        self._check(resp)
        return resp.json() if resp.content else None

    def stream(self, path: str, params: Any) -> Iterator[bytes]:
        """GET ``path`` and yield the body as it arrives."""
        try:
            with self._http.stream("GET", path, params=params) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._check(resp)
                yield from resp.iter_bytes()
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the query API at {self.url}: {exc}") from exc
