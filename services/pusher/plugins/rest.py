"""``rest``: HTTP endpoints as sources: JSON documents, or any Prometheus exporter.

* ``format: json``: each sensor names a path into the document (``data.power``,
  ``racks[3].inlet``, ``$["odd.key"]``); numbers, numeric strings and booleans
  become values, anything else is no reading.
* ``format: prometheus``: the text exposition format of ``/metrics`` (parsed by
  prometheus_client), so node_exporter, DCGM, IPMI or SNMP exporters all become
  sources. Every sample selected by ``include``/``exclude`` (regular expressions
  on the metric name) is a sensor ``<prefix>/<endpoint>/<metric>/<label>=<value>...``,
  discovered on the first scrape; the unit follows the metric-name suffix
  (``_seconds`` -> s, ``_bytes`` -> B, ``_celsius`` -> °C, ``_watts`` -> W) and
  counters are marked monotonic. Series that appear later are not added until a
  reload; series that vanish read as no reading.

One asyncio HTTP client (httpx) per endpoint; reads run on the event loop.
"""

from __future__ import annotations

import re
from array import array
from typing import Any, Literal

from services.common.errors import ConfigError, KelvinError
from services.common.schema import Field, field_validator
from services.pusher.plugins.base import (
    Entity,
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
    SensorOptions,
    Values,
)

_PATH_TOKEN = re.compile(r"""\.([^.\[\]]+)|\[(\d+)\]|\[["']([^"']*)["']\]""")
_UNSAFE = re.compile(r"[/+#\x00\s]+")
_SUFFIX_UNITS = (
    ("_seconds", "s"),
    ("_bytes", "B"),
    ("_celsius", "°C"),
    ("_watts", "W"),
    ("_joules", "J"),
    ("_volts", "V"),
    ("_amperes", "A"),
    ("_hertz", "Hz"),
    ("_percent", "%"),
)


def parse_path(path: str) -> list[str | int]:
    """``a.b[2]["c.d"]`` -> ``['a', 'b', 2, 'c.d']``; ValueError if it does not parse."""
    text = path.strip()
    text = text[1:] if text.startswith("$") else text
    if text and not text.startswith((".", "[")):
        text = "." + text
    out: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _PATH_TOKEN.match(text, pos)
        if m is None:
            raise ValueError(
                f"cannot parse {path!r} at position {pos}: expected .key, [n] or ['key']"
            )
        key, index, quoted = m.groups()
        out.append(int(index) if index is not None else (key if key is not None else quoted))
        pos = m.end()
    return out


def lookup(doc: Any, path: list[str | int]) -> float:
    for part in path:
        try:
            doc = doc[part]
        except (KeyError, IndexError, TypeError):
            return float("nan")
    if isinstance(doc, bool):
        return 1.0 if doc else 0.0
    if isinstance(doc, int | float):
        return float(doc)
    if isinstance(doc, str):
        try:
            return float(doc)
        except ValueError:
            return float("nan")
    return float("nan")


class JsonSensorConfig(SensorOptions):
    name: str
    path: str
    unit: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        parse_path(v)
        return v


class EndpointConfig(GroupOptions):
    name: str
    url: str
    format: Literal["json", "prometheus"] = "json"
    headers: dict[str, str] = {}
    bearer_token: str | None = None
    verify_tls: bool = True
    sensors: list[JsonSensorConfig] = []
    """JSON format: what to read."""
    include: list[str] = [".*"]
    """Prometheus format: metric names to take (regular expressions, full match)."""
    exclude: list[str] = []
    max_series: int = Field(5000, ge=1)
    """Prometheus format: refuse an exporter with more selected series than this."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return v


class RestConfig(PluginConfig):
    endpoints: list[EndpointConfig] = Field(min_length=1)


class Endpoint(Entity):
    def __init__(self, cfg: EndpointConfig, timeout_s: float) -> None:
        super().__init__(cfg.name)
        self.cfg = cfg
        self.timeout_s = timeout_s
        self.client: Any = None

    async def open(self) -> None:
        import httpx  # imported only when a rest plugin is configured (it costs ~5 MB)

        headers = dict(self.cfg.headers)
        if self.cfg.bearer_token:
            headers["Authorization"] = f"Bearer {self.cfg.bearer_token}"
        self.client = httpx.AsyncClient(
            headers=headers, timeout=self.timeout_s, verify=self.cfg.verify_tls
        )

    async def get(self) -> str:
        import httpx

        try:
            r = await self.client.get(self.cfg.url)
        except httpx.HTTPError as exc:
            raise KelvinError(f"{self.cfg.url}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise KelvinError(f"{self.cfg.url} answered HTTP {r.status_code}")
        return str(r.text)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


def series_key(name: str, labels: dict[str, str]) -> str:
    return name + "".join(f"/{k}={labels[k]}" for k in sorted(labels))


Sample = tuple[float, str, str, dict[str, str]]


def scrape(text: str) -> dict[str, Sample]:
    """Prometheus text -> {series key: (value, metric type, sample name, labels)}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Sample] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[series_key(s.name, s.labels)] = (float(s.value), fam.type, s.name, s.labels)
    except ValueError as exc:
        raise KelvinError(f"not the Prometheus text format: {exc}") from exc
    return out


def unit_of(metric: str) -> str | None:
    base = metric.removesuffix("_total")
    for suffix, unit in _SUFFIX_UNITS:
        if base.endswith(suffix):
            return unit
    return None


class JsonGroup(Group):
    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        endpoint: Endpoint,
        paths: list[list[str | int]],
    ) -> None:
        super().__init__(name, sensors, options, endpoint)
        self.endpoint = endpoint
        self.paths = paths

    async def read_async(self, timestamp_ns: int) -> Values:
        import json

        text = await self.endpoint.get()
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise KelvinError(f"{self.endpoint.cfg.url}: not JSON: {exc}") from exc
        return array("d", [lookup(doc, p) for p in self.paths])


class PrometheusGroup(Group):
    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        endpoint: Endpoint,
        keys: list[str],
    ) -> None:
        super().__init__(name, sensors, options, endpoint)
        self.endpoint = endpoint
        self.keys = keys

    async def read_async(self, timestamp_ns: int) -> Values:
        found = scrape(await self.endpoint.get())
        nan: Sample = (float("nan"), "", "", {})
        return array("d", [found.get(k, nan)[0] for k in self.keys])


class RestPlugin(Plugin):
    """HTTP sources: JSON paths and Prometheus exporters."""

    Config = RestConfig
    description = "HTTP JSON documents and Prometheus exporters"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, RestConfig)
        groups: list[Group] = []
        for e in cfg.endpoints:
            opts = self.options_of(e)
            self.context.check_url(e.url)
            endpoint = Endpoint(e, (opts.timeout_ms or opts.interval_ms) / 1000)
            await endpoint.open()
            self.entities.append(endpoint)
            if e.format == "json":
                if not e.sensors:
                    raise ConfigError(
                        f"rest plugin {self.context.instance!r}, endpoint {e.name!r}: "
                        "format json needs 'sensors' (name and path)"
                    )
                sensors = [
                    self.configured_sensor(f"{e.name}/{s.name}", opts, s, s.unit) for s in e.sensors
                ]
                paths = [parse_path(s.path) for s in e.sensors]
                groups.append(JsonGroup(e.name, sensors, opts, endpoint, paths))
            else:
                groups.append(await self._prometheus(e, opts, endpoint))
        return groups

    async def _prometheus(self, e: EndpointConfig, opts: GroupOptions, endpoint: Endpoint) -> Group:
        try:
            include = [re.compile(p) for p in e.include]
            exclude = [re.compile(p) for p in e.exclude]
        except re.error as exc:
            raise ConfigError(
                f"rest plugin {self.context.instance!r}, endpoint {e.name!r}: bad regex: {exc}"
            ) from exc
        found = scrape(await endpoint.get())
        keys = [
            k
            for k, (_, _, name, _) in found.items()
            if any(p.fullmatch(name) for p in include)
            and not any(p.fullmatch(name) for p in exclude)
        ]
        if len(keys) > e.max_series:
            raise ConfigError(
                f"rest plugin {self.context.instance!r}, endpoint {e.name!r}: {len(keys)} series "
                f"selected, more than max_series {e.max_series}; narrow 'include'"
            )
        sensors, used = [], set()
        for k in keys:
            _, kind, name, labels = found[k]
            level = "/".join(
                [name, *(f"{lk}={_UNSAFE.sub('_', labels[lk]) or '_'}" for lk in sorted(labels))]
            )
            while level in used:
                level += "_"
            used.add(level)
            monotonic = kind in ("counter", "histogram", "summary") and not name.endswith(
                ("_created", "_gcount", "_gsum")
            )
            sensors.append(
                self.sensor(f"{e.name}/{level}", opts, unit_of(name), monotonic=monotonic)
            )
        return PrometheusGroup(e.name, sensors, opts, endpoint, keys)
