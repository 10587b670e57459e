"""A plugin section loaded over REST cannot make the pusher a file reader, a proxy or a shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from services.pusher.app import PusherService
from tests.pusher.conftest import FIXTURES, JsonServer, running
from tests.pusher.test_http import ADMIN, config

PROC = str(FIXTURES / "proc")


async def _load(svc: PusherService, name: str, section: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.port}", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as http:
        return await http.post(f"/api/v1/plugins/{name}/load", json=section)


async def test_files_only_under_proc_sys_and_the_configured_roots(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("42\n")
    (tmp_path / "link").symlink_to(secret)
    plugins = {"procfs": {"root": PROC, "files": ["meminfo"]}}
    async with running(config(tmp_path, {"admin_token": ADMIN}, plugins=plugins)) as svc:
        for name, section in {
            "etc": {"plugin": "procfs", "root": "/etc"},
            "file": {"plugin": "sysfs", "groups": [{"name": "g", "sensors": [
                {"name": "x", "path": str(secret)}]}]},
            # Symbolic links are resolved: /proc/self/root is "/".
            "escape": {"plugin": "sysfs", "groups": [{"name": "g", "sensors": [
                {"name": "x", "path": f"/proc/self/root{secret}"}]}]},
            "hall": {"plugin": "datacenter", "hall_file": str(secret)},
        }.items():  # fmt: skip
            r = await _load(svc, name, section)
            assert r.status_code == 400, (name, r.text)
            assert "outside the directories" in r.json()["detail"], name
            assert name not in svc.manager.instances
        # The configuration file's own root and /proc are allowed.
        r = await _load(svc, "again", {"plugin": "procfs", "root": PROC, "prefix": "/h/again"})
        assert r.status_code == 200, r.text
        r = await _load(svc, "real", {"plugin": "procfs", "files": ["meminfo"]})
        assert r.status_code == 200, r.text


async def test_no_command_and_only_the_configured_hosts(tmp_path: Path) -> None:
    allowed, other = JsonServer(), JsonServer()
    allowed.doc = other.doc = {"t": 21.5}
    plugins = {
        "crac": {
            "plugin": "rest",
            "endpoints": [
                {"name": "e", "url": allowed.url, "sensors": [{"name": "t", "path": "t"}]}
            ],
        }
    }
    try:
        async with running(config(tmp_path, {"admin_token": ADMIN}, plugins=plugins)) as svc:
            r = await _load(svc, "gpfs", {"command": ["/bin/sh", "-c", "id"]})
            assert r.status_code == 400 and "runs no command" in r.json()["detail"]
            r = await _load(
                svc,
                "opa",
                {"command": ["/bin/cat", "/etc/shadow"], "root": "/sys"},
            )
            assert r.status_code == 400 and "runs no command" in r.json()["detail"]
            proxy = {
                "plugin": "rest",
                "endpoints": [{"name": "e", "url": "http://localhost:9/x", "sensors": [
                    {"name": "t", "path": "t"}]}],
            }  # fmt: skip
            r = await _load(svc, "proxy", proxy)
            assert r.status_code == 400 and "rest_hosts" in r.json()["detail"], r.text
            proxy["endpoints"][0]["url"] = allowed.url + "/other"  # type: ignore[index]
            r = await _load(svc, "proxy", proxy)
            assert r.status_code == 200, "a host of the configuration file's rest endpoints"
    finally:
        allowed.close()
        other.close()
