"""A fake Kubernetes API server on loopback, for the spool janitor's tests.

A fake because a real cluster (kube-apiserver with etcd, a kubelet, a controller
manager) cannot run on this machine: there is no kind, k3s or kube-apiserver in the
package registries here, and no container runtime a test may use. It answers the REST
calls the janitor makes, as the API server does: bearer-token auth (401), GET of one
object (404), lists with ``labelSelector`` (equality terms) and ``limit``/``continue``
paging, and POST that stores a Job or answers 409 AlreadyExists. Hooks let a test act
between calls (an HPA changing replicas, another janitor creating a Job first).
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

Obj = dict[str, Any]

RESOURCES = {
    ("apps/v1", "statefulsets"): "StatefulSet",
    ("v1", "persistentvolumeclaims"): "PersistentVolumeClaim",
    ("v1", "pods"): "Pod",
    ("batch/v1", "jobs"): "Job",
}


def _status(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip


class FakeKube:
    """Objects by (group/version, resource) -> name; the calls it was sent in ``calls``."""

    def __init__(
        self, namespace: str = "kelvin", token: str = "janitor-token", tls: bool = False
    ) -> None:
        """``tls``: serve HTTPS with a self-signed certificate for 127.0.0.1 (:attr:`ca`)."""
        self.namespace, self.token = namespace, token
        self.objects: dict[tuple[str, str], dict[str, Obj]] = {k: {} for k in RESOURCES}
        self.calls: list[tuple[str, str]] = []
        self.page_size = 2
        """Items per list page at most (so that paging is exercised)."""
        self.on_get: Callable[[str, str], None] | None = None
        """Called before a GET of one object (group/version, name)."""
        self.on_create: Callable[[Obj], None] | None = None
        """Called with a POSTed Job before it is stored (may store one of its name first)."""
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="fake-kube-"))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.scheme = "http"
        if tls:
            self.scheme = "https"
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.ca, self._cert("server")[1])
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_address[1]}"

    @property
    def ca(self) -> Path:
        """The server's (self-signed) certificate: the CA a client trusts."""
        return self._cert("server")[0]

    def _cert(self, name: str) -> tuple[Path, Path]:
        cert, key = self._dir / f"{name}.crt", self._dir / f"{name}.key"
        if not cert.exists():
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                 "-keyout", str(key), "-out", str(cert)],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        return cert, key

    def other_ca(self) -> Path:
        """A certificate that did not sign this server's."""
        return self._cert("other")[0]

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def token_file(self, token: str | None = None) -> Path:
        """A file holding ``token`` (default: the one this server accepts), as a pod has it."""
        path = self._dir / f"token-{len(list(self._dir.iterdir()))}"
        path.write_text((self.token if token is None else token) + "\n")
        return path

    # ------------------------------------------------------------------ state
    def put(self, gv: str, resource: str, obj: Obj) -> Obj:
        obj = {"apiVersion": gv, "kind": RESOURCES[(gv, resource)], **obj}
        obj["metadata"] = {"namespace": self.namespace, **obj["metadata"]}
        self.objects[(gv, resource)][obj["metadata"]["name"]] = obj
        return obj

    def jobs(self) -> dict[str, Obj]:
        return self.objects[("batch/v1", "jobs")]

    def posts(self) -> int:
        return sum(1 for m, _ in self.calls if m == "POST")

    # ------------------------------------------------------------------ HTTP
    def _route(self, path: str) -> tuple[tuple[str, str], str] | None:
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 5 and parts[1] == "v1":
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 6:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        if rest[0] != "namespaces" or rest[1] != self.namespace or len(rest) > 4:
            return None
        key = (gv, rest[2])
        if key not in RESOURCES:
            return None
        return key, rest[3] if len(rest) == 4 else ""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        kube = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Obj) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                kube.calls.append((method, url.path))
                if self.headers.get("Authorization") != f"Bearer {kube.token}":
                    self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                    return
                route = kube._route(url.path)
                if route is None:
                    self._send(404, _status(404, "NotFound", f"no route {url.path}"))
                    return
                key, name = route
                if method == "GET" and name:
                    if kube.on_get is not None:
                        kube.on_get(key[0], name)
                    with kube._lock:
                        obj = kube.objects[key].get(name)
                    if obj is None:
                        self._send(404, _status(404, "NotFound", f"{key[1]} {name!r} not found"))
                    else:
                        self._send(200, obj)
                elif method == "GET":
                    self._send(200, kube._list(key, parse_qs(url.query)))
                elif method == "POST" and not name and key == ("batch/v1", "jobs"):
                    length = int(self.headers.get("Content-Length") or 0)
                    job = json.loads(self.rfile.read(length))
                    if kube.on_create is not None:
                        kube.on_create(job)
                    with kube._lock:
                        jname = job["metadata"]["name"]
                        if jname in kube.jobs():
                            msg = f'jobs.batch "{jname}" already exists'
                            self._send(409, _status(409, "AlreadyExists", msg))
                            return
                        stored = kube.put("batch/v1", "jobs", job)
                    self._send(201, stored)
                else:
                    self._send(405, _status(405, "MethodNotAllowed", method))

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler

    def _list(self, key: tuple[str, str], query: dict[str, list[str]]) -> Obj:
        terms = [t.split("=", 1) for t in (query.get("labelSelector") or [""])[0].split(",") if t]
        with self._lock:
            items = [
                o
                for _, o in sorted(self.objects[key].items())
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in terms)
            ]
        start = int((query.get("continue") or ["0"])[0])
        limit = min(int((query.get("limit") or ["500"])[0]), self.page_size)
        page = items[start : start + limit]
        more = str(start + limit) if start + limit < len(items) else ""
        return {"kind": RESOURCES[key] + "List", "apiVersion": key[0], "items": page,
                "metadata": {"continue": more} if more else {}}  # fmt: skip
