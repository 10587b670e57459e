"""Fixtures of the packaging tests: the chart, loaded once per session, and its renderings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.packaging.chart import ChartRenderer, Rendered, values_files

VALUES = values_files()


@pytest.fixture(scope="session")
def chart() -> Iterator[ChartRenderer]:
    renderer = ChartRenderer()
    try:
        yield renderer
    finally:
        renderer.close()


@pytest.fixture(params=sorted(VALUES), scope="session")
def rendered(request: pytest.FixtureRequest, chart: ChartRenderer) -> Rendered:
    """The chart rendered with the default values and with each ci/*-values.yaml."""
    name = str(request.param)
    return chart.render(VALUES[name], name)


@pytest.fixture(scope="session")
def default(chart: ChartRenderer) -> Rendered:
    return chart.render({}, "default")


@pytest.fixture(scope="session")
def everything(chart: ChartRenderer) -> Rendered:
    return chart.render(VALUES["everything"], "everything")
