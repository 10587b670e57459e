"""The few Kubernetes API calls the spool janitor makes: plain REST with the pod's token.

No client library: the janitor gets one StatefulSet, lists claims, pods and Jobs, and
creates Jobs. In a pod it authenticates with its projected service-account token and
verifies the API server with the cluster's CA (``/var/run/secrets/kubernetes.io/
serviceaccount``), the way every in-cluster client does.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import httpx

from services.common.errors import KelvinError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Obj = dict[str, Any]


class KubeApiError(KelvinError):
    """The API server refused a call or could not be reached."""


class Conflict(KubeApiError):
    """409: the object exists already (created by another janitor run)."""


class KubeApi:
    """A namespace's API: ``get``/``list``/``create`` on paths below ``/api`` and ``/apis``."""

    def __init__(
        self,
        server: str,
        namespace: str,
        token: Path | None = None,
        ca: Path | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """``token``: a file read for every call (the kubelet rotates projected tokens)."""
        self.namespace = namespace
        self.token = token
        verify: ssl.SSLContext | bool = True
        if ca is not None:
            verify = ssl.create_default_context(cafile=str(ca))
        self._http = httpx.Client(base_url=server.rstrip("/"), verify=verify, timeout=timeout_s)

    @classmethod
    def in_cluster(cls, namespace: str | None = None, sa_dir: Path = SERVICE_ACCOUNT) -> KubeApi:
        """The API server of the pod's cluster, as the pod's service account."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if not host:
            raise KubeApiError(
                "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set): "
                "give --api-server, --token-file and --namespace"
            )
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        ns = namespace or (sa_dir / "namespace").read_text().strip()
        return cls(f"https://{host}:{port}", ns, sa_dir / "token", sa_dir / "ca.crt")

    def close(self) -> None:
        self._http.close()

    def _headers(self) -> dict[str, str]:
        if self.token is None:
            return {}
        return {"Authorization": f"Bearer {self.token.read_text().strip()}"}

    def _call(self, method: str, path: str, **kw: Any) -> Obj:
        try:
            r = self._http.request(method, path, headers=self._headers(), **kw)
        except httpx.HTTPError as exc:
            raise KubeApiError(f"{method} {path}: {exc}") from exc
        if r.status_code == 409:
            raise Conflict(f"{method} {path}: 409 {r.text[:200]}")
        if r.status_code >= 300:
            raise KubeApiError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        body: Obj = r.json()
        return body

    def path(self, group: str, resource: str, name: str = "") -> str:
        """``/api/v1/namespaces/<ns>/pods`` for group "" , ``/apis/<group>/...`` otherwise."""
        base = "/api/v1" if not group else f"/apis/{group}"
        tail = f"/{name}" if name else ""
        return f"{base}/namespaces/{self.namespace}/{resource}{tail}"

    def get(self, group: str, resource: str, name: str) -> Obj:
        return self._call("GET", self.path(group, resource, name))

    def list(self, group: str, resource: str, selector: str = "") -> list[Obj]:
        """Every item, page by page (``limit``/``continue``)."""
        items: list[Obj] = []
        params: dict[str, str] = {"limit": "500"}
        if selector:
            params["labelSelector"] = selector
        while True:
            page = self._call("GET", self.path(group, resource), params=params)
            items += page.get("items") or []
            more = (page.get("metadata") or {}).get("continue")
            if not more:
                return items
            params["continue"] = more

    def create(self, group: str, resource: str, obj: Obj) -> Obj:
        """POST ``obj``; :class:`Conflict` if one of its name exists."""
        return self._call("POST", self.path(group, resource), json=obj)
