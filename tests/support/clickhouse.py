"""Start real ClickHouse servers (Debian ``clickhouse-server``) and ZooKeeper on loopback.

- :class:`ClickHouse`: one server (single-server mode of the backend).
- :class:`ClickHouseCluster`: one ZooKeeper (standalone ``QuorumPeerMain``) and
  ``shards x replicas`` servers sharing a ``<remote_servers>`` entry, each with its
  own ports, data directory and ``{shard}``/``{replica}`` macros.

Configs are small on purpose (two threads per query, small caches, short
replication timeouts) so that a 5-process cluster fits a shared 2-core machine.
A missing binary fails under ``CI=true`` and skips elsewhere.

Session fixtures (import them into a ``conftest.py`` to use them):
``clickhouse_server`` (one server; give each test its own database) and
``clickhouse_cluster`` (the 2 x 2 cluster; leave every process running).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.storage.settings import ClickHouseSettings
from tests.support.servers import free_port, require_binary, wait_port

_SERVER = """\
<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{dir}/server.log</log><errorlog>{dir}/error.log</errorlog></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <interserver_http_port>{inter}</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>{dir}/data/</path>
  <tmp_path>{dir}/tmp/</tmp_path>
  <user_files_path>{dir}/user_files/</user_files_path>
  <format_schema_path>{dir}/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>33554432</mark_cache_size>
  <uncompressed_cache_size>33554432</uncompressed_cache_size>
  <max_concurrent_queries>64</max_concurrent_queries>
  <keep_alive_timeout>10</keep_alive_timeout>
  <background_pool_size>2</background_pool_size>
  <background_schedule_pool_size>4</background_schedule_pool_size>
  <merge_tree>
    <max_replicated_merges_in_queue>4</max_replicated_merges_in_queue>
  </merge_tree>
{cluster}
</yandex>
"""

_USERS = """\
<?xml version="1.0"?>
<yandex>
  <profiles><default>
    <max_threads>2</max_threads>
    <max_memory_usage>1000000000</max_memory_usage>
    <connect_timeout_with_failover_ms>200</connect_timeout_with_failover_ms>
    <distributed_ddl_task_timeout>60</distributed_ddl_task_timeout>
  </default></profiles>
  <users><{user}><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
    <profile>default</profile><quota>default</quota></{user}></users>
  <quotas><default></default></quotas>
</yandex>
"""

_CLUSTER = """\
  <remote_servers><{name}>{shards}</{name}></remote_servers>
  <zookeeper><node><host>127.0.0.1</host><port>{zk}</port></node>
    <session_timeout_ms>3000</session_timeout_ms><operation_timeout_ms>2000</operation_timeout_ms>
  </zookeeper>
  <macros><shard>{shard}</shard><replica>{replica}</replica></macros>
  <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
"""


def _binary() -> str:
    return require_binary("clickhouse-server", "clickhouse-server")


class ClickHouse:
    """One ``clickhouse-server`` process; ``start()`` returns when ``/ping`` answers."""

    def __init__(
        self,
        workdir: Path,
        *,
        user: str = "default",
        password: str = "",
        cluster_xml: str = "",
        name: str = "ch",
    ) -> None:
        self.binary = _binary()
        self.dir = workdir / name
        self.user, self.password = user, password
        self.http_port, self.tcp_port, self.inter_port = free_port(), free_port(), free_port()
        self.cluster_xml = cluster_xml
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "config.xml"
        conf.write_text(
            _SERVER.format(
                dir=self.dir,
                http=self.http_port,
                tcp=self.tcp_port,
                inter=self.inter_port,
                cluster=self.cluster_xml,
            )
        )
        (self.dir / "users.xml").write_text(_USERS.format(user=self.user, password=self.password))
        return conf

    def start(self, timeout_s: float = 30.0) -> ClickHouse:
        conf = self.write_config()
        with open(self.dir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, f"--config-file={conf}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        try:
            wait_port(self.http_port, proc=self.proc, timeout=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, as a crashed node."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def query(self, sql: str, body: bytes | None = None, timeout: float = 60) -> str:
        """Run one statement over HTTP; the answer as text (an error raises RuntimeError)."""
        params = urllib.parse.urlencode({"user": self.user, "password": self.password})
        data = sql.encode() if body is None else body
        url = f"{self.url}/?{params}" + (
            "" if body is None else "&" + urllib.parse.urlencode({"query": sql})
        )
        try:
            with urllib.request.urlopen(url, data=data, timeout=timeout) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(exc.read().decode(errors="replace")) from None

    def settings(self, database: str, **overrides: Any) -> ClickHouseSettings:
        base: dict[str, Any] = {
            "urls": [self.url],
            "database": database,
            "username": self.user,
            "password": self.password,
        }
        base.update(overrides)
        return ClickHouseSettings(**base)


class ZooKeeper:
    """A standalone ZooKeeper 3.8 (Debian ``zookeeper``) on a free loopback port."""

    JAR = "/usr/share/java/zookeeper.jar"

    def __init__(self, workdir: Path) -> None:
        self.java = require_binary("java", "default-jre-headless")
        if not os.path.exists(self.JAR):
            require_binary("zookeeper-not-installed", "zookeeper")
        self.dir = workdir / "zookeeper"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ZooKeeper:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime=500\ndataDir={data}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=20000\n"
            "4lw.commands.whitelist=ruok\nsnapCount=1000000\n"
        )
        (self.dir / "log4j.properties").write_text("log4j.rootLogger=WARN\n")
        with open(self.dir / "zookeeper.log", "ab") as out:
            self.proc = subprocess.Popen(
                [
                    self.java,
                    "-Xmx96m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Dzookeeper.admin.enableServer=false",
                    "-cp",
                    f"{self.dir}:{self.JAR}",
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(cfg),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until ZooKeeper grants a session. ClickHouse 18.16 crashes (SIGSEGV in its
        DDL worker) when it starts while ZooKeeper listens but refuses sessions, which
        it does for a moment after answering ``ruok``."""
        deadline = time.monotonic() + timeout_s
        # ConnectRequest: protocol 0, last zxid 0, timeout 4000 ms, session 0, empty password
        hello = struct.pack(">iqiq", 0, 0, 4000, 0) + struct.pack(">i", 16) + bytes(16)
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(struct.pack(">i", len(hello)) + hello)
                    answer = s.recv(64)
                    if len(answer) >= 28 and struct.unpack(">q", answer[12:20])[0] != 0:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"zookeeper on port {self.port} not serving after {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class ClickHouseCluster:
    """ZooKeeper plus ``shards x replicas`` ClickHouse servers in one named cluster."""

    def __init__(
        self, workdir: Path, shards: int = 2, replicas: int = 2, name: str = "kelvin"
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.zk = ZooKeeper(workdir)
        self.nodes: list[list[ClickHouse]] = [
            [ClickHouse(workdir, name=f"ch-s{s + 1}r{r + 1}") for r in range(replicas)]
            for s in range(shards)
        ]
        shard_xml = "".join(
            "<shard><internal_replication>true</internal_replication>"
            + "".join(
                f"<replica><host>127.0.0.1</host><port>{n.tcp_port}</port></replica>" for n in shard
            )
            + "</shard>"
            for shard in self.nodes
        )
        for s, shard in enumerate(self.nodes):
            for r, n in enumerate(shard):
                n.cluster_xml = _CLUSTER.format(
                    name=name, shards=shard_xml, zk=self.zk.port, shard=s + 1, replica=f"r{r + 1}"
                )

    @property
    def all_nodes(self) -> list[ClickHouse]:
        return [n for shard in self.nodes for n in shard]

    def start(self) -> ClickHouseCluster:
        try:
            self.zk.start()
            for n in self.all_nodes:
                n.write_config()
            procs = []
            for n in self.all_nodes:  # start all, then wait: they boot in parallel
                with open(n.dir / "stdout.log", "ab") as out:
                    n.proc = subprocess.Popen(
                        [n.binary, f"--config-file={n.dir / 'config.xml'}"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=n.dir,
                    )
                procs.append(n)
            for n in procs:
                wait_port(n.http_port, proc=n.proc, timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def settings(self, database: str, **overrides: Any) -> ClickHouseSettings:
        base: dict[str, Any] = {
            "urls": [n.url for n in self.all_nodes],
            "database": database,
            "cluster": self.name,
        }
        base.update(overrides)
        return ClickHouseSettings(**base)

    def wait_replicated(self, table: str, timeout_s: float = 60.0) -> None:
        """Until every replica of every shard has fetched every part of ``table``."""
        deadline = time.monotonic() + timeout_s
        for n in self.all_nodes:
            while True:
                try:
                    n.query(f"SYSTEM SYNC REPLICA {table}", timeout=timeout_s)
                    break
                except (RuntimeError, OSError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def stop(self) -> None:
        """SIGKILL everything: the data is temporary, and a clean shutdown costs seconds."""
        for n in self.all_nodes:
            n.kill()
        self.zk.stop()

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouse]:
    """One clickhouse-server for the session."""
    server = ClickHouse(tmp_path_factory.mktemp("clickhouse")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def clickhouse_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseCluster]:
    """ZooKeeper + 2 shards x 2 replicas for the session (~0.6 s to start here)."""
    cluster = ClickHouseCluster(tmp_path_factory.mktemp("chcluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
