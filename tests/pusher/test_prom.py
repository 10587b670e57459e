"""The pusher's own /metrics page reads as Prometheus' client library would write it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.pusher.prom import Registry, go_float


def test_counters_gauges_labels_and_process_metrics_parse_back() -> None:
    r = Registry("t")
    c = r.counter("reads_total", "Reads", ["plugin"])
    c.labels('a"b\\c\nd').inc(3)
    c.labels("x").inc()
    r.gauge("buffer", "Buffered").set(1.5e6)
    plain = r.counter("sent", "Sent")
    plain.inc(2)
    fams = {f.name: f for f in text_string_to_metric_families(r.render().decode())}
    reads = fams["kelvin_t_reads"]
    assert reads.type == "counter"
    assert {(s.labels["plugin"], s.value) for s in reads.samples} == {
        ('a"b\\c\nd', 3.0),
        ("x", 1.0),
    }
    assert fams["kelvin_t_buffer"].samples[0].value == 1.5e6
    assert fams["kelvin_t_sent"].samples[0].value == 2.0 and plain._value.get() == 2.0
    assert fams["kelvin_t_up"].samples[0].value == 0.0
    assert fams["process_resident_memory_bytes"].samples[0].value > 1e6
    assert fams["process_cpu_seconds"].type == "counter"


def test_numbers_and_lines_match_the_client_library() -> None:
    ref = CollectorRegistry()
    Counter("kelvin_t_reads", "Reads", ["plugin"], registry=ref).labels("a").inc(1234567)
    Gauge("kelvin_t_buffer", "Buffered", registry=ref).set(0.25)
    ours = Registry("t", process=False)
    ours.counter("reads_total", "Reads", ["plugin"]).labels("a").inc(1234567)
    ours.gauge("buffer", "Buffered").set(0.25)
    theirs = [ln for ln in generate_latest(ref).decode().splitlines() if "_created" not in ln]
    mine = ours.render().decode().splitlines()
    assert [ln for ln in mine if "kelvin_t_up" not in ln and "build_info" not in ln] == theirs
    for v in (0.0, 1.0, 123456.0, 1e22, float("inf"), -2.5):
        assert go_float(v) in {"0.0", "1.0", "123456.0", "1e+22", "+Inf", "-2.5"}
