"""The bridge's pieces without a cluster: host lists, Slurm records, the node map, JWTs, files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common.errors import ConfigError
from services.slurm_bridge.hostlist import HostlistError, compress, expand
from services.slurm_bridge.install import render_lua, write_files
from services.slurm_bridge.model import SlurmDataError, parse_job, parse_node
from services.slurm_bridge.nodemap import HallLayout, NodeMap, NodeMapError
from services.slurm_bridge.tokens import TokenSource, claims, sign


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[1,3-4],gpu7", ["n1", "n3", "n4", "gpu7"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[9-10]", ["n9", "n10"]),
        ("", []),
    ],
)
def test_host_lists_expand_as_slurm_does(text: str, names: list[str]) -> None:
    assert expand(text) == names
    if names:
        assert expand(compress(names)) == names


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[a-b]", "n[3-1]", "n[[1]]", "n[1-99999999]"])
def test_bad_host_lists_are_refused_with_the_text(bad: str) -> None:
    with pytest.raises(HostlistError, match="host list"):
        expand(bad)


def test_compress_writes_ranges() -> None:
    assert compress(["n01", "n02", "n03", "n05", "gpu1"]) == "n[01-03,05],gpu1"


def _job(**kw: object) -> dict[str, object]:
    return {
        "job_id": 7, "job_state": "PENDING", "priority": 0, "admin_comment": "kelvin",
        "node_count": 3, "nodes": "", "required_nodes": "", "partition": "kelvin",
        "comment": "kelvin:comm=0.3", "submit_time": 100, "time_limit": 10, **kw,
    }  # fmt: skip


def test_a_held_kelvin_job_and_its_request() -> None:
    job = parse_job(_job())
    assert (job.id, job.managed, job.held, job.size, job.comm_share) == ("7", True, True, 3, 0.3)
    assert job.time_limit_s == 600 and job.pending and not job.active
    running = parse_job(_job(job_state="RUNNING", priority=5, nodes="n[01-03]", start_time=5))
    assert running.nodes == ("n01", "n02", "n03") and running.active and not running.held
    assert not parse_job(_job(admin_comment="", partition="other")).managed
    assert parse_job(_job(admin_comment="", partition="p"), frozenset({"p"})).managed
    assert parse_job(_job(time_limit=None)).time_limit_s is None


def test_a_record_without_its_state_is_an_error_naming_it() -> None:
    with pytest.raises(SlurmDataError, match="'job_state'"):
        parse_job({"job_id": 1})


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("idle", [], "idle"),
        ("allocated", [], "allocated"),
        ("mixed", [], "allocated"),
        ("idle", ["DRAIN"], "drained"),
        ("allocated", ["DRAIN"], "draining"),
        ("down", [], "down"),
        ("idle", ["NOT_RESPONDING"], "down"),
        ("idle", ["MAINTENANCE", "RESERVED"], "reserved"),
        ("idle", ["COMPLETING"], "completing"),
    ],
)
def test_node_states_reduce_to_what_placement_needs(
    state: str, flags: list[str], expected: str
) -> None:
    assert parse_node({"name": "n1", "state": state, "state_flags": flags}).state == expected


LAYOUT = HallLayout("h", 1, 2, 2, frozenset({0, 1, 3}))  # node 2 absent


def test_node_names_map_present_nodes_in_index_order() -> None:
    m = NodeMap.build(LAYOUT, "n[1-3]", None)
    assert m.index_of == {"n1": 0, "n2": 1, "n3": 3}
    assert m.names([3, 0]) == ["n3", "n1"] and m.indices(["n3", "x", "n1"]) == [0, 3]
    assert m.check_slurm(["n1", "n2", "n3", "login1"]) == ["login1"]


def test_an_explicit_map_takes_indices_and_positions() -> None:
    m = NodeMap.build(LAYOUT, None, {"a": 0, "b": "row0/rack1/slot1"})
    assert m.index_of == {"a": 0, "b": 3}


@pytest.mark.parametrize(
    ("names", "mapping", "message"),
    [
        ("n[1-2]", None, "has 2 names; hall 'h' has 3 present nodes"),
        (None, {"a": 0, "b": 0}, "map to hall node 0"),
        (None, {"a": 2}, "hall node 2, which hall 'h' does not have"),
        (None, {"a": "row0/rack5/slot0"}, "outside hall 'h'"),
        (None, {"a": "rack1"}, "expected a hall index"),
        (None, None, "exactly one of node_names"),
    ],
)
def test_an_inconsistent_map_is_refused_at_start(
    names: str | None, mapping: dict[str, object] | None, message: str
) -> None:
    with pytest.raises(NodeMapError, match=message):
        NodeMap.build(LAYOUT, names, mapping)


def test_mapped_nodes_slurm_does_not_have_are_an_error() -> None:
    with pytest.raises(NodeMapError, match="Slurm has no node n3"):
        NodeMap.build(LAYOUT, "n[1-3]", None).check_slurm(["n1", "n2"])


def test_signed_tokens_are_slurm_hs256_jwts() -> None:
    key = os.urandom(32)
    token = sign(key, "root", 600, now_s=1000)
    head, body, mac = token.split(".")
    expected = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4)) == expected
    assert claims(token) == {"exp": 1600, "iat": 1000, "sun": "root"}


async def test_tokens_are_renewed_before_they_expire(tmp_path: Path) -> None:
    key = tmp_path / "jwt.key"
    key.write_bytes(os.urandom(32))
    src = TokenSource("slurm", jwt_key_file=key, lifespan_s=60)
    first = await src.get()
    assert await src.get() == first and src.renewals == 1
    src._renew_s = time.time() - 1  # as if 80 % of the lifespan had passed
    second = await src.get()
    assert src.renewals == 2 and claims(second)["exp"] >= claims(first)["exp"]


async def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("SLURM_JWT=aaa\n")
    src = TokenSource("slurm", token_file=f)
    assert await src.get() == "aaa"
    f.write_text("bbb-longer\n")
    assert await src.get() == "bbb-longer"


async def test_a_token_command_is_run_for_each_renewal() -> None:
    cmd = [sys.executable, "-c", "import time; print(f'SLURM_JWT=t{time.time_ns()}')"]
    src = TokenSource("slurm", token_command=cmd)
    first = await src.get()
    assert first.startswith("t")
    src.invalidate()
    assert await src.get() != first


def test_the_lua_gets_the_sites_partitions_and_operators() -> None:
    lua = render_lua(["kelvin", "gpu"], "kelvin", [0, 64030])
    assert 'local KELVIN_PARTITIONS = { "kelvin", "gpu" }' in lua
    assert "local KELVIN_OPERATORS = { 0, 64030 }" in lua and "@" not in lua
    with pytest.raises(ConfigError, match="partition name"):
        render_lua(['x"; os.execute("rm -rf /")'], "", [0])


def test_the_notify_script_always_exits_zero_at_once(tmp_path: Path) -> None:
    write_files(tmp_path, "http://127.0.0.1:9", token_file=tmp_path / "missing")
    env = {"SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_JOB_ID": "12"}
    started = time.monotonic()
    r = subprocess.run([str(tmp_path / "kelvin-notify.sh")], env=env, timeout=10)
    assert r.returncode == 0 and time.monotonic() - started < 2
    assert json.loads('{"event":"start","job_id":"12"}')  # the body it sends is JSON


def test_kelvin_slurm_files_writes_the_controllers_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import UP_WHEN_CONFIGURED, main

    rc = main(["slurm", "files", "--dir", str(tmp_path), "--bridge-url", "http://b:8084",
               "--partitions", "kelvin", "--operators", "0,64030"])  # fmt: skip
    assert rc == 0
    assert 'KELVIN_PARTITIONS = { "kelvin" }' in (tmp_path / "job_submit.lua").read_text()
    assert os.access(tmp_path / "kelvin-notify.sh", os.X_OK)
    assert (tmp_path / "kelvin-notify.conf").read_text() == "KELVIN_BRIDGE_URL=http://b:8084\n"
    out = capsys.readouterr().out
    assert f"PrologSlurmctld={tmp_path}/kelvin-notify.sh" in out and "JobSubmitPlugins=lua" in out
    assert (
        main(
            [
                "slurm",
                "files",
                "--dir",
                str(tmp_path),
                "--bridge-url",
                "b:1",
            ]
        )
        == 2
    )
    assert UP_WHEN_CONFIGURED == {"slurm-bridge": "slurm_bridge"}  # `kelvin up` runs it on demand
