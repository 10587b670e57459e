"""Sensor names <-> Prometheus series: the one mapping the query API and the collect agent share.

A hierarchical name becomes a metric named after the *kind* of the level that
holds the sensor (the level without its trailing number) and the sensor's own
level, with one label per ancestor level::

    /hall/row0/rack1/node2/power  ->  node_power{hall="hall", row="row0", rack="rack1",
                                                 node="node2", sensor="/hall/row0/rack1/node2/power"}
    /hall/power                   ->  hall_power{hall="hall", sensor="/hall/power"}

so the hall total and its nodes never share a metric name and ``sum(node_power)``
adds nodes only. Two sensors share a metric name only if their parents are of one
kind (``node0`` and ``node17``). Every series carries ``sensor``, the full name: it
keeps series apart and leads back to the sensor.

A name whose last levels are ``key=value`` pairs is *labelled* (remote write stores
Prometheus series this way): the pairs are its labels (values percent-escaped), the
level before them is the metric name (or a ``__name__=`` pair is), the levels before
that a namespace::

    /prometheus/node_cpu_seconds_total/cpu=0/mode=idle  ->  node_cpu_seconds_total{cpu="0",
                                                            mode="idle", sensor="..."}
    /prometheus/__name__=up                             ->  up{sensor="/prometheus/__name__=up"}

:func:`sensor_name` is the inverse for remote write: a ``sensor`` label is taken as
the name; otherwise the labelled form under a prefix is built, which maps back to
exactly the labels it came from (plus ``sensor``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

_METRIC_OK = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRAILING_NUMBER = re.compile(r"[-_.]?[0-9]+$")
_ESCAPES = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\x00": "%00"}
_ESCAPE_RE = re.compile("[%/+#\x00]")
_UNESCAPE_RE = re.compile("%(25|2F|2B|23|00)", re.IGNORECASE)
RESERVED = frozenset({"__name__", "sensor"})
"""Label names a level may not take: ``sensor`` is the full name, ``__name__`` the metric."""

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name (hashable; sorts as Prometheus orders series)."""


def metric_name(text: str) -> str:
    """``text`` made a valid metric name (invalid characters become ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_:]", "_", text)
    return name if _METRIC_OK.fullmatch(name) else "_" + name


def level_kind(level: str, depth: int) -> str:
    """The kind of a hierarchy level as a label name: ``row0`` -> ``row``, ``cn-12`` -> ``cn``.

    A level with nothing left (``0``) is named by its depth, ``l3``.
    """
    kind = _TRAILING_NUMBER.sub("", level)
    kind = re.sub(r"[^A-Za-z0-9_]", "_", kind).lstrip("_")
    if not kind or not _LABEL_OK.fullmatch(kind):
        return f"l{depth}"
    return kind + "_level" if kind in RESERVED else kind


def _label_pair(level: str) -> tuple[str, str] | None:
    key, sep, value = level.partition("=")
    if not sep or not _LABEL_OK.fullmatch(key) or key == "sensor" or not value:
        return None
    return key, _UNESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), value)


@lru_cache(maxsize=200_000)
def series_labels(sensor: str) -> Labels:
    """The labels of a sensor's series (see the module docstring), sorted by name."""
    levels = sensor[1:].split("/")
    pairs: list[tuple[str, str]] = []
    first = len(levels)
    while first > 0:
        pair = _label_pair(levels[first - 1])
        if pair is None:
            break
        pairs.append(pair)
        first -= 1
    out: dict[str, str] = {"sensor": sensor}
    named = dict(pairs).get("__name__")
    if pairs and (named or _METRIC_OK.fullmatch(levels[first - 1])):
        out["__name__"] = named or levels[first - 1]
        for k, v in pairs:
            out.setdefault(k, v)
        return tuple(sorted(out.items()))
    leaf = levels[-1]
    if len(levels) == 1:
        out["__name__"] = metric_name(leaf)
    else:
        out["__name__"] = metric_name(f"{level_kind(levels[-2], len(levels) - 1)}_{leaf}")
    for depth, level in enumerate(levels[:-1], start=1):
        kind = level_kind(level, depth)
        key, n = kind, 2
        while key in out:
            key, n = f"{kind}_{n}", n + 1
        out[key] = level
    return tuple(sorted(out.items()))


def labels_dict(sensor: str) -> dict[str, str]:
    return dict(series_labels(sensor))


def escape_value(value: str) -> str:
    """A label value made safe for one level of a sensor name."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], value)


def sensor_name(labels: Mapping[str, str], prefix: str) -> str:
    """The sensor a Prometheus series is stored as (the inverse of :func:`series_labels`).

    ``labels`` holds ``__name__``. A series that is exactly a Kelvin sensor's (its
    ``sensor`` label and every other label as :func:`series_labels` gives them) is
    that sensor. Any other is ``<prefix>/<metric>/<label>=<value>/...`` (labels sorted
    by name, empty values left out, values escaped; ``<prefix>/__name__=<metric>``
    when there are no others), which :func:`series_labels` maps back to the same
    labels; a ``sensor`` label there becomes ``exported_sensor`` (as Prometheus
    renames clashing labels), so a series derived from a sensor (``ALERTS``, a
    recording rule) never writes into that sensor. The result is not validated (the
    caller checks the naming rules).
    """
    given = labels.get("sensor")
    if given and given.startswith("/") and dict(series_labels(given)) == dict(labels):
        return given
    metric = labels.get("__name__", "")
    renamed = {("exported_sensor" if k == "sensor" else k): v for k, v in labels.items()}
    pairs = [
        f"{key}={escape_value(renamed[key])}"
        for key in sorted(renamed)
        if key != "__name__" and renamed[key]
    ]
    head = [prefix.rstrip("/"), metric] if pairs else [prefix.rstrip("/"), f"__name__={metric}"]
    return "/".join(head + pairs)
