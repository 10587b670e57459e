"""The chart's own unit tests (charts/kelvin/tests/, helm-unittest format), one pytest case each."""

from __future__ import annotations

import pytest

from tests.packaging import helm_unittest
from tests.packaging.chart import CHART_DIR, ChartRenderer

CASES = helm_unittest.load_cases(CHART_DIR / "tests")


def test_there_are_unit_tests() -> None:
    assert len({c.path for c in CASES}) >= 4 and len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_chart_unit_test(chart: ChartRenderer, case: helm_unittest.Case) -> None:
    helm_unittest.run(case, chart.chart)


def test_runner_fails_a_wrong_expectation(chart: ChartRenderer) -> None:
    """The runner itself can fail: a false `equal` and an unexpected render error."""
    suite = {"templates": ["query-api/deployment.yaml"], "release": {"name": "kelvin"}}
    wrong = helm_unittest.Case(
        "s",
        "wrong",
        CHART_DIR / "tests" / "x_test.yaml",
        {"it": "wrong", "asserts": [{"equal": {"path": "spec.replicas", "value": 7}}]},
        suite,
    )
    with pytest.raises(AssertionError, match=r"spec.replicas = 1"):
        helm_unittest.run(wrong, chart.chart)
    broken = helm_unittest.Case(
        "s",
        "broken",
        CHART_DIR / "tests" / "x_test.yaml",
        {
            "it": "broken",
            "set": {"storage.influxdb.url": ""},
            "asserts": [{"exists": {"path": "spec"}}],
        },
        suite,
    )
    with pytest.raises(AssertionError, match="did not render"):
        helm_unittest.run(broken, chart.chart)
