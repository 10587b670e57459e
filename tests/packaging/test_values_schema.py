"""values.schema.json: it accepts every shipped values file and refuses bad ones clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.packaging import values_doc
from tests.packaging.chart import CHART_DIR, ChartRenderer
from tests.packaging.conftest import VALUES

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("values_name", sorted(VALUES))
def test_shipped_values_validate(chart: ChartRenderer, values_name: str) -> None:
    chart.chart.validate_schema(VALUES[values_name])


def test_bad_values_file_is_refused_naming_each_mistake(chart: ChartRenderer) -> None:
    bad = yaml.safe_load((FIXTURES / "bad-values.yaml").read_text())
    with pytest.raises(helm.HelmValuesError) as info:
        chart.chart.validate_schema(bad)
    message = str(info.value)
    assert "/collectAgent/replicas" in message and "want integer" in message
    assert "/queryApi" in message and "'replica' not allowed" in message
    assert "/storage/backend" in message and "'influxdb', 'clickhouse'" in message


def test_install_refuses_bad_values_before_rendering(chart: ChartRenderer) -> None:
    """Helm checks the schema on install/upgrade/template: nothing is rendered."""
    with pytest.raises(helm.HelmValuesError, match="/collectAgent/kind"):
        chart.chart.render({"collectAgent": {"kind": "DaemonSet"}}, name="k", namespace="k")


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
        ({"mqtt": {"mode": "bridge"}}, "/mqtt/mode"),
        ({"queryApi": {"service": {"port": 70000}}}, "/queryApi/service/port"),
        ({"storage": {"clickhouse": {"urls": ["clickhouse:8123"]}}}, "/storage/clickhouse/urls"),
        ({"config": {"colect_agent": {}}}, "/config"),
        ({"pusher": {"livenessProbe": None}}, "at '/pusher': missing property 'livenessProbe'"),
    ],
)
def test_schema_refuses(chart: ChartRenderer, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.chart.validate_schema(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"storage": {"backend": "clickhouse"}},
            "storage.backend=clickhouse needs storage.clickhouse.urls",
        ),
        ({"mqtt": {"mode": "external"}}, "mqtt.mode=external needs mqtt.external.host"),
        ({"storage": {"influxdb": {"url": ""}}}, "storage.influxdb.url is empty"),
        (
            {"collectAgent": {"kind": "Deployment"}},
            "gives one claim to one pod",
        ),
        ({"mqtt": {"builtin": {"tls": {"enabled": True}}}}, "needs mqtt.builtin.tls.secretName"),
    ],
)
def test_inconsistent_values_fail_with_what_to_do(
    chart: ChartRenderer, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values)


def _leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in _leaf_paths(v, (*prefix, k))]
    return [prefix]


def _schema_has(schema: dict[str, Any], node: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether `path` is a declared property, or falls under an open (free-form) object."""
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
    if not path:
        return True
    if "anyOf" in node:
        return any(_schema_has(schema, branch, path) for branch in node["anyOf"])
    props = node.get("properties", {})
    if path[0] in props:
        return _schema_has(schema, props[path[0]], path[1:])
    return node.get("additionalProperties", True) is not False


def test_every_default_value_is_in_the_schema() -> None:
    import json

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    missing = [".".join(p) for p in _leaf_paths(values) if not _schema_has(schema, schema, p)]
    assert not missing, f"values.yaml keys the schema does not describe: {missing}"


def test_readme_values_table_is_current() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    assert values_doc.render_readme(readme) == readme, (
        "charts/kelvin/README.md is stale: run python -m tests.packaging.values_doc"
    )
