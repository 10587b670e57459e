"""The fast paths against the reference: the same readings, errors and counts, always.

Both fast paths are held to it: the compiled one (services/common/csrc/lineproto.c)
and the numpy one (its fallback), each test once per ``core``.

The reference (:mod:`services.collect_agent.line_protocol.scan`) is checked
against a real influxd in test_line_protocol_influxd.py; here every body of a
random corpus (see lp_corpus.py) must come out of ``parse`` exactly as out of
``parse_reference``: sensor, timestamp and the value's bits of every reading,
in order; every refused line with its line number and reason; lines and
string fields counted alike.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collect_agent.line_protocol import LineProtocol, ParseResult, numbers
from services.collect_agent.line_protocol.table import SpanTable
from tests.collect_agent import lp_corpus
from tests.support.native import CORES, core_param, require_native

NOW = 1_764_500_000_123_456_789
PRECISIONS = ["ns", "u", "ms", "s", "m", "h"]


@pytest.fixture(params=CORES)
def core(request: pytest.FixtureRequest) -> str:
    return core_param(request.param)


def make(core: str, measurements: dict[str, str] | None = None) -> LineProtocol:
    lp = LineProtocol(measurements, "/influx", core=core)  # type: ignore[arg-type]
    assert lp.core == core
    return lp


def same(body: str | bytes, precision: str, lp: LineProtocol) -> ParseResult:
    fast = lp.parse(body, precision, NOW)
    ref = lp.parse_reference(body, precision, NOW)
    assert list(fast.batch.sensors) == list(ref.batch.sensors), body
    assert fast.batch.timestamps_ns.tolist() == ref.batch.timestamps_ns.tolist(), body
    assert fast.batch.values.view(np.int64).tolist() == ref.batch.values.view(np.int64).tolist()
    assert [(n, r) for n, r, _ in fast.errors] == [(n, r) for n, r, _ in ref.errors], body
    assert (fast.lines, fast.string_fields) == (ref.lines, ref.string_fields), body
    return fast


@pytest.mark.parametrize("seed", range(25))
def test_random_bodies(seed: int, core: str) -> None:
    r = random.Random(seed)
    lp = make(core, {"mapped": "/dc/x"})  # tables kept across bodies, as in the agent
    for _ in range(6):
        same(lp_corpus.body(r, r.randint(1, 60), r.choice(PRECISIONS)), r.choice(PRECISIONS), lp)


@pytest.mark.parametrize("seed", range(10))
def test_uniform_bodies(seed: int, core: str) -> None:
    """One shape per body: the template path, which takes most of these lines itself."""
    r = random.Random(1000 + seed)
    lp = make(core)
    fast = lines = 0
    for _ in range(4):
        precision = r.choice(PRECISIONS)
        body = lp_corpus.uniform_body(r, r.randint(1, 300), precision)
        lines += same(body, precision, lp).lines
        fast += lp.fast.parse(body.encode(), 1, NOW).lines
    assert fast > lines // 2


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    body=st.text(alphabet=' ,=\\"\n\t#abcxyz0123456789².-+/iutfTFeé\x00\r', max_size=200),
    precision=st.sampled_from(PRECISIONS),
)
def test_fuzzed_bytes(body: str, precision: str, core: str) -> None:
    same(body, precision, make(core, {"mapped": "/dc/x"}))


@pytest.mark.parametrize("seed", range(5))
def test_bodies_cut_anywhere_and_with_random_bytes(seed: int, core: str) -> None:
    """Bodies cut at any byte (mid-token, mid-quote, mid-timestamp) with a few bytes set to
    anything (NUL, high bytes, bytes that are not UTF-8): the same answer as the reference."""
    r = random.Random(500 + seed)
    lp = make(core)
    whole = (lp_corpus.uniform_body(r, 30) + lp_corpus.body(r, 30)).encode()
    for _ in range(50):
        cut = bytearray(whole[: r.randint(0, len(whole))])
        for _ in range(r.randint(0, 4)):
            if cut:
                cut[r.randrange(len(cut))] = r.randrange(256)
        same(bytes(cut), r.choice(PRECISIONS), lp)


def test_hand_picked_edges(core: str) -> None:
    for body in [
        "m v=1",  # no newline at the end
        "m v=1\n\n\nm v=2\n",
        "m\\ x v=1\nm,a=b\\ c v=2",  # an escape sends one line to the reference
        'm s="a\nb",v=1\nm v=2\n',  # a quoted newline
        "m v=1 5\\\nm v=2",  # an escaped newline
        "# c\n  \n\t\n m v=1",
        "m v=1 1 \nm v=1  1",
        "m,a=1 v=1,w=2,x=3 7\nm,a=1 v=4 8\nm,a=1 w=5 9",  # further fields named by key id
        "mapped,a=1 v=1",
        "m,time=1 v=1\nm time=1\nm time=1,v=2",
        "m v=-0,w=-0i,x=0.0,y=-0.0",
        "m v=1e22,w=1e23,x=123456789012345.6,y=0.1234567890123456789",
        "m v=1 9223372036854775806\nm v=1 9223372036854775807\nm v=1 9223372036 ",
        "m," + ",".join(f"k{i}=v" for i in range(40)) + " v=1",  # deeper than Kelvin allows
        "m," + "k=" + "v" * 300 + " v=1",  # a key past the fast path's lookup width
    ]:
        for precision in ("ns", "s"):
            same(body, precision, make(core, {"mapped": "/dc/x"}))


def test_quoted_strings_the_fast_path_takes_and_those_it_leaves(core: str) -> None:
    plain = 'm,host=a s="x, y=z w",v=1,t="" 5\nm,host=b v=2,s="q" 6\n'
    lp = make(core)
    got = same(plain, "ns", lp)
    assert got.string_fields == 3 and got.batch.values.tolist() == [1.0, 2.0]
    assert lp.fast.parse(plain.encode(), 1, NOW).lines == 2, "both taken by the fast path"
    for body in [
        'm,t=a"b v=1 1\nm v=2 2',  # a quote in a tag is text
        'm a,b="x=",c="y" 1\nm v=2 2\nm v=3 3',  # InfluxDB does not toggle at the first quote
        'm s="x"y,v=1 1\nm v=2 2',  # text after the closing quote
        'm s="two\nlines",v=1 1\nm v=2 2',  # a quoted newline
        'm s="open,v=1 1\nm v=2 2\nm v="x" 3',
        'm s="a" "b" 1\nm v=1 2',
    ]:
        assert lp.fast.parse(body.encode(), 1, NOW).rest, body
        same(body, "ns", lp)


def test_a_hash_collision_costs_speed_not_correctness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every string hashes alike: the tables refuse all but the first, and those lines
    go to the reference, which names them right."""
    monkeypatch.setattr(
        SpanTable, "_hash", lambda self, rows, lens: np.full(lens.shape[0], 7, np.uint64)
    )
    lp = make("numpy")
    body = "".join(f"m,host=n{i} v={i}.5 {i}\n" for i in range(50))
    got = same(body, "ns", lp)
    assert got.batch.sensors[:3] == ["/influx/m/n0/v", "/influx/m/n1/v", "/influx/m/n2/v"]
    same(body, "ns", lp)


def test_the_tables_start_again_past_their_bound(core: str) -> None:
    lp = make(core)
    lp.fast.max_sensors = 10
    for k in range(5):
        got = same("".join(f"m,host=n{k}{i} v={i} {i}\n" for i in range(8)), "ns", lp)
        assert len(got.batch) == 8
        assert len(lp.fast) <= 10 + 2 * 8  # (a series and a field per line at most)


def test_numbers_convert_as_python_does() -> None:
    r = random.Random(5)
    tokens = [lp_corpus.value(r).encode() for _ in range(3000)]
    tokens += [repr(r.random() * 10 ** r.randint(-20, 20)).encode() for _ in range(2000)]
    body = b" ".join(tokens)
    buf = numbers.padded(body)
    lens = np.array([len(t) for t in tokens])
    starts = np.concatenate(([0], np.cumsum(lens + 1)[:-1]))
    got, ok = numbers.floats(buf, starts, lens)
    taken = 0
    for t, v, fine in zip(tokens, got.tolist(), ok.tolist(), strict=True):
        if fine:
            taken += 1
            assert repr(v) == repr(float(t)), t
    assert taken > 2500


@pytest.mark.parametrize("action", ["parse", "clear", "init"])
def test_the_compiled_tables_refuse_a_parse_or_clear_from_inside_a_parse(action: str) -> None:
    """The naming callbacks run Python code: one that parses with, clears or re-creates
    the tables it is called from gets a RuntimeError, not freed slots under the parse;
    the tables work on afterwards."""
    core = require_native()
    calls: list[bytes] = []

    def field(head: str, key: bytes) -> str:
        return head + "/" + key.decode()

    def head(key: bytes) -> str:
        calls.append(key)
        if len(calls) == 1:  # the first time only
            if action == "parse":
                tables.parse(b"m v=1", 1, 0, 1 << 62, 1000)
            elif action == "clear":
                tables.clear()
            else:
                tables.__init__(head, field, 7)
        return "/x"

    tables = core.LineTables(head, field, 7)
    with pytest.raises(RuntimeError, match="during a parse"):
        tables.parse(b"m,h=a v=1 1\n", 1, 0, 1 << 62, 1000)
    got = tables.parse(b"m,h=a v=1 1\nm,h=a v=2 2\n", 1, 0, 1 << 62, 1000)
    assert got[0] == ["/x/v", "/x/v"] and got[4] == 2
    assert calls == [b"m,h=a", b"m,h=a"]
