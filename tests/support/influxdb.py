"""Start a real InfluxDB 1.x server (Debian ``influxdb``) on free loopback ports.

Every port it opens is moved off its default: HTTP on a free port, the RPC
``bind-address`` (8088) on another; graphite/collectd/opentsdb/udp/ifql stay
disabled. Data, WAL and meta live in a temporary directory; usage reporting,
the ``_internal`` monitor database and continuous queries are off.

    with influxdb(tmp_path) as server:
        settings = server.settings("test_db")   # InfluxSettings for the backend
        server.query("SHOW DATABASES")

A missing ``influxd`` fails under ``CI=true`` and skips elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.common.storage.settings import InfluxSettings
from tests.support.servers import free_port, require_binary, wait_port

_CONF = """\
reporting-enabled = false
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{dir}/meta"
  logging-enabled = false
[data]
  dir = "{dir}/data"
  wal-dir = "{dir}/wal"
  query-log-enabled = false
  index-version = "inmem"
[coordinator]
  log-queries-after = "0s"
[retention]
  enabled = true
[shard-precreation]
  enabled = false
[monitor]
  store-enabled = false
[subscriber]
  enabled = false
[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  auth-enabled = {auth}
  log-enabled = false
  suppress-write-log = true
  pprof-enabled = false
  max-body-size = 0
[logging]
  level = "warn"
  suppress-logo = true
[ifql]
  enabled = false
[continuous_queries]
  enabled = false
"""


class InfluxDB:
    """One ``influxd`` process; ``start()`` returns when ``/ping`` answers.

    With ``username``/``password`` the server runs with ``auth-enabled`` and
    that user is created as admin (InfluxDB lets the first admin be created
    without credentials).
    """

    def __init__(
        self, workdir: Path, *, username: str | None = None, password: str | None = None
    ) -> None:
        self.binary = require_binary("influxd", "influxdb")
        self.workdir = workdir
        self.username = username
        self.password = password
        self.port = free_port()
        self.rpc_port = free_port()
        while self.rpc_port == self.port:
            self.rpc_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> InfluxDB:
        data = self.workdir / f"influxdb-{self.port}"
        data.mkdir(parents=True, exist_ok=True)
        conf = data / "influxdb.conf"
        conf.write_text(
            _CONF.format(
                dir=data,
                rpc_port=self.rpc_port,
                http_port=self.port,
                auth="true" if self.username else "false",
            )
        )
        self.log_path = data / "influxd.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-config", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_port(self.port, proc=self.proc, timeout=30)
            if self.username:
                self.query(
                    f"CREATE USER \"{self.username}\" WITH PASSWORD '{self.password}' "
                    "WITH ALL PRIVILEGES",
                    auth=False,
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def query(self, q: str, database: str | None = None, auth: bool = True) -> dict[str, Any]:
        """Run one InfluxQL statement over HTTP (POST), return the decoded JSON."""
        params = {"q": q}
        if database:
            params["db"] = database
        if auth and self.username:
            params.update(u=self.username, p=self.password or "")
        body = urllib.parse.urlencode(params).encode()
        with urllib.request.urlopen(f"{self.url}/query", data=body, timeout=30) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    def settings(self, database: str, **overrides: Any) -> InfluxSettings:
        """Backend settings pointing at this server and ``database``."""
        base: dict[str, Any] = {"url": self.url, "database": database}
        if self.username:
            base.update(username=self.username, password=self.password)
        base.update(overrides)
        return InfluxSettings(**base)


@contextlib.contextmanager
def influxdb(
    workdir: Path, *, username: str | None = None, password: str | None = None
) -> Iterator[InfluxDB]:
    server = InfluxDB(workdir, username=username, password=password).start()
    try:
        yield server
    finally:
        server.stop()
