"""The console end to end in a real browser: Debian's chromium, driven by Playwright.

One ``kelvin up --demo`` (subprocess, free ports, temp data dir) for the module:
the pusher's ``datacenter`` plugin simulates the hall, the allocator places a
seeded job stream, everything lands in SQLite and is read back through the
query API the console talks to. Every test fails on a console error, an
uncaught page error, a failed request or an HTTP error answer. Screenshots go
to ``test-artifacts/console-*.png``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.auth import Role
from tests.support.kelvin import KelvinUp
from tests.support.servers import free_port, require_binary, wait_port

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST_DEMO = """
allocator:
  job_stream: {mean_interval_s: 1.5, runtime_s: [4.0, 12.0], sizes: [2, 8]}
"""
"""A busier job stream than the default so that the hall shows jobs within seconds."""
INLET = "/hall/row0/rack0/node0/inlet_temp"
SHOWN_JS = """() => ({
    busy: [...document.querySelectorAll('svg .node')].filter(e => e.dataset.busy === 'true')
        .map(e => [e.dataset.index, e.dataset.job]),
    outlined: [...document.querySelectorAll('svg .job-outline')].map(e => e.dataset.job),
})"""
"""What the floor plan shows: busy nodes with their job, and the jobs outlined."""
SUPPLY_AND_SCALE_JS = """() => {
    const dts = [...document.querySelectorAll('#hall-totals dt')];
    const value = (k) => parseFloat(dts.find(d => d.textContent === k)?.nextElementSibling.textContent);
    const base = value('Supply air'), raised = value('Supply air, raised');
    return raised < base ? [base, document.querySelector('#hall-legend .ends span').textContent] : null;
}"""
"""Once the shown raised supply is below the supply: the supply and the colour scale's low end."""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KelvinUp]:
    data = tmp_path_factory.mktemp("console-demo")
    cfg = data / "demo.yaml"
    cfg.write_text(FAST_DEMO)
    up = KelvinUp(data, "--demo", "--seed", "7", config=cfg).start()
    try:
        yield up
    finally:
        rc = up.stop()
        assert rc == 0, up.tail()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = require_binary("chromium", "chromium")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Problems:
    """Everything the page must never produce, collected while a test runs."""

    def __init__(self, page: Any, origin: str) -> None:
        self.items: list[str] = []
        self.origin = origin
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.items.append(f"page error: {e}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on("request", self._request)

    def _console(self, msg: Any) -> None:
        if msg.type in ("error", "warning"):
            self.items.append(f"console {msg.type}: {msg.text}")

    def _failed(self, req: Any) -> None:
        self.items.append(f"request failed: {req.method} {req.url}: {req.failure}")

    def _response(self, res: Any) -> None:
        if res.status >= 400:
            self.items.append(f"HTTP {res.status}: {res.request.method} {res.url}")

    def _request(self, req: Any) -> None:
        if not (req.url.startswith(self.origin) or req.url.startswith("data:")):
            self.items.append(f"request outside the query API: {req.url}")


@pytest.fixture
def page(browser: Any, demo: KelvinUp, artifacts_dir: Path) -> Iterator[tuple[Any, Problems]]:
    ctx = browser.new_context(viewport={"width": 1366, "height": 768})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    problems = Problems(pg, demo.url("query_api"))
    try:
        yield pg, problems
        assert problems.items == []
    finally:
        ctx.close()


def _busy(hall: dict[str, Any]) -> dict[int, str]:
    return {n["index"]: str(n["job"]) for n in hall["nodes"] if n["busy"]}


def test_kelvin_up_demo_prints_the_console_address(demo: KelvinUp) -> None:
    assert demo.console_url == f"{demo.url('query_api')}/"
    r = httpx.get(demo.console_url, timeout=10)
    assert r.status_code == 200 and "Kelvin console" in r.text


def test_pick_a_sensor_in_the_tree_and_see_the_chart_draw(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    pg, problems = page
    pg.goto(f"{demo.console_url}#/charts")
    # Tab order: the skip link first, then the views, ..., the search box, then the tree.
    pg.locator('[role=treeitem][data-name="/hall"]').wait_for()
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.className") == "skip"
    for _ in range(10):
        pg.keyboard.press("Tab")
        if pg.evaluate("document.activeElement.id") == "tree-search":
            break
    assert pg.evaluate("document.activeElement.id") == "tree-search"
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.getAttribute('role')") == "treeitem"
    # Keyboard only: open the levels with Enter, chart the sensor with Space.
    for level in ("/hall", "/hall/row0", "/hall/row0/rack0", "/hall/row0/rack0/node0"):
        item = pg.locator(f'[role=treeitem][data-name="{level}"]')
        item.focus()
        pg.keyboard.press("Enter")
        expect(pg.locator(f'[role=treeitem][data-name="{level}"]')).to_have_attribute(
            "aria-expanded", "true"
        )
    sensor = pg.locator(f'[role=treeitem][data-name="{INLET}"]')
    sensor.focus()
    outline = sensor.evaluate("e => getComputedStyle(e.firstElementChild).outlineStyle")
    assert outline != "none", "the focused tree item shows no focus ring"
    pg.keyboard.press(" ")
    expect(sensor).to_have_attribute("aria-selected", "true")
    pg.wait_for_function(
        "() => Number(document.getElementById('chart').dataset.points) >= 5", timeout=20_000
    )
    drawn = pg.evaluate(
        """() => {
        const c = document.querySelector('#chart canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let coloured = 0;  // pixels in the series colour (#1f77b4), not grid or text
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - 31) < 40 && Math.abs(d[i+1] - 119) < 40 && Math.abs(d[i+2] - 180) < 40 && d[i+3] > 0) coloured++;
        return coloured;
    }"""
    )
    assert drawn > 50, f"the chart canvas has only {drawn} pixels of the series colour"
    unit = httpx.get(
        f"{demo.url('query_api')}/api/v1/readings", params={"sensor": INLET}, timeout=10
    ).json()["unit"]
    legend = pg.locator(".u-legend").inner_text()
    assert f"{INLET} [{unit}]" in legend
    # A shorter range (kept in the address bar) redraws the same readings wider.
    pg.select_option("#range", "60")
    pg.wait_for_function("() => location.hash.endsWith('r=60')")
    pg.wait_for_function("() => Number(document.getElementById('chart').dataset.points) >= 5")
    # The download link gives the charted readings as CSV.
    href = pg.locator("#chart-csv").get_attribute("href")
    csv = httpx.get(f"{demo.url('query_api')}{href}", timeout=10)
    assert csv.status_code == 200 and csv.text.startswith("Sensor,Time,")
    assert csv.text.count(f"{INLET},") >= 5
    # The address bar keeps what is charted (shareable).
    assert "s=%2Fhall%2Frow0%2Frack0%2Fnode0%2Finlet_temp" in pg.evaluate("location.hash")
    # Search narrows the tree to matches; Enter in the box moves into the results.
    pg.fill("#tree-search", "node3/power")
    pg.wait_for_function(
        "() => document.querySelectorAll('[role=treeitem][data-sensor]').length === 10"
    )
    names = pg.eval_on_selector_all(
        "[role=treeitem][data-sensor]", "els => els.map(e => e.dataset.name)"
    )
    assert all(n.endswith("/node3/power") for n in names), names
    pg.screenshot(path=str(artifacts_dir / "console-chart.png"))
    assert problems.items == []


def test_hall_view_shows_the_allocators_busy_nodes(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    pg, problems = page
    pg.goto(f"{demo.console_url}#/hall")
    pg.wait_for_function("() => Number(document.getElementById('hall-plan').dataset.renders) >= 1")
    assert pg.locator("svg .node").count() == 40
    allocator = f"{demo.url('allocator')}/api/v1/hall"
    # The hall changes every second or so: compare the console with the allocator over a
    # window in which the allocator's answer did not change (before == after).
    matched = False
    with httpx.Client(timeout=10) as client:
        for _ in range(30):
            before = client.get(allocator).json()
            after_ms = time.time() * 1000
            pg.wait_for_function(
                f"() => Number(document.getElementById('hall-plan').dataset.fetchedMs) > {after_ms}"
            )
            shown = pg.evaluate(SHOWN_JS)
            after = client.get(allocator).json()
            if _busy(before) == _busy(after) and _busy(before):
                assert {int(k): v for k, v in shown["busy"]} == _busy(before)
                # Each running job is outlined (once per rack it runs in, at least once).
                assert set(shown["outlined"]) == set(_busy(before).values())
                matched = True
                break
    assert matched, "the allocator's hall never held still (or had no busy node) for a second"
    # Measured colours: every node has a recent inlet reading from the simulated hall.
    pg.wait_for_function(
        "() => [...document.querySelectorAll('svg .node text:first-of-type')]"
        ".every(t => t.textContent.endsWith('°C'))"
    )
    totals = pg.locator("#hall-totals").inner_text()
    for label in ("Peak inlet", "Supply air", "CoP", "Computing", "Cooling"):
        assert label in totals
    pg.screenshot(path=str(artifacts_dir / "console-hall.png"))
    # Keyboard: focus a node, arrows move, the detail panel follows.
    first = pg.locator("svg .node[tabindex='0']")
    first.focus()
    pg.keyboard.press("ArrowRight")
    assert "rack 1" in pg.locator("#hall-node").inner_text()
    pg.locator("input[name=hall-colour][value=predicted]").check()
    pg.wait_for_function(
        "() => document.querySelector('#hall-legend').textContent.includes('predicted')"
    )
    # The scale starts at the CRAC supply the inlets are computed at, also while the peak is
    # past the redline and the raised supply below it; nodes whose row of D is zero (8, 9,
    # 28, 29 in the reference hall) sit exactly at that supply. Totals and legend of one paint:
    base, low = pg.wait_for_function(SUPPLY_AND_SCALE_JS).json_value()
    assert low == f"{base:.1f} °C"
    pg.screenshot(path=str(artifacts_dir / "console-hall-predicted.png"))
    # The model's error per node: measured minus predicted, signed.
    pg.locator("input[name=hall-colour][value=error]").check()
    pg.wait_for_function(
        "() => [...document.querySelectorAll('svg .node text:first-of-type')]"
        ".every(t => /^[+−±][0-9.]+ °C$/.test(t.textContent))"
    )
    pg.screenshot(path=str(artifacts_dir / "console-hall-difference.png"))
    assert problems.items == []


def test_define_and_chart_a_virtual_sensor(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    pg, problems = page
    pg.goto(f"{demo.console_url}#/virtual")
    # Reads are open on loopback; defining a sensor needs the admin token kelvin up printed.
    expect(pg.locator("#token-button")).to_have_text("Token")
    pg.click("#token-button")
    pg.fill("#token-input", demo.token(Role.ADMIN))
    pg.click("#token-form button[value=save]")
    expect(pg.locator("#token-button")).to_have_text("Token ✓ admin")
    expect(pg.locator("#insecure-banner")).to_be_hidden()
    form = pg.locator("#virtual-form")
    form.locator("input[name=name]").fill("/demo/it_power")
    form.locator("textarea[name=expression]").fill('sum("/hall/*/*/*/power")')
    form.locator("input[name=unit]").fill("kW")
    pg.click("#virtual-check")
    pg.wait_for_function(
        "() => document.getElementById('virtual-message').textContent.startsWith('Valid')"
    )
    form.locator("button[type=submit]").click()
    pg.wait_for_function(
        "() => document.getElementById('virtual-message').textContent.startsWith('Saved')"
    )
    row = pg.locator('#virtual-table tr[data-name="/demo/it_power"]')
    assert "sum(" in row.inner_text()
    listed = httpx.get(f"{demo.url('query_api')}/api/v1/virtual", timeout=10).json()["virtual"]
    assert {"name": "/demo/it_power", "unit": "kW"}.items() <= next(
        d for d in listed if d["name"] == "/demo/it_power"
    ).items()
    row.get_by_role("button", name="Chart /demo/it_power").click()
    pg.wait_for_function("() => location.hash.startsWith('#/charts')")
    pg.wait_for_function("() => Number(document.getElementById('chart').dataset.points) >= 2")
    assert "/demo/it_power [kW]" in pg.locator(".u-legend").inner_text()
    pg.screenshot(path=str(artifacts_dir / "console-virtual.png"))
    assert problems.items == []


def test_ingest_health_shows_live_rates(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    pg, problems = page
    pg.goto(f"{demo.console_url}#/ingest")
    pg.wait_for_function(
        "() => /^[1-9][0-9,]* \\/s$/.test(document.querySelector('#ingest-cards .card .v')?.textContent || '')"
    )
    assert "readings/s" in pg.locator("#ingest-badge").inner_text()
    # The rate chart is a named image to assistive technology (a bare div's label is not read).
    rates = pg.get_by_role("img", name="Readings received and written per second")
    expect(rates.locator("canvas")).to_have_count(1)
    assert "ok" in (pg.locator("#ingest-badge").get_attribute("class") or "")
    pg.screenshot(path=str(artifacts_dir / "console-ingest.png"))
    assert problems.items == []


def test_alerts_view_lists_the_demo_rules_alerts(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    """``kelvin up --demo`` evaluates the hall rules; the console shows what they raise."""
    pg, problems = page
    pg.goto(f"{demo.console_url}#/alerts")
    pg.wait_for_function(
        "() => /rules in 2 groups/.test(document.querySelector('#alerts-status')?.textContent || '')"
    )
    alerts = httpx.get(f"{demo.url('query_api')}/prometheus/api/v1/alerts", timeout=10).json()[
        "data"
    ]["alerts"]
    rows = pg.locator("#alerts-table tbody tr")
    if alerts:
        expect(rows.first).to_be_visible()
    else:
        expect(pg.locator("#alerts-empty")).to_be_visible()
    assert "firing" in pg.locator("#alerts-badge").inner_text()
    pg.screenshot(path=str(artifacts_dir / "console-alerts.png"))
    assert problems.items == []


def test_an_insecure_query_api_shows_the_banner(browser: Any, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "services.cli", "run", "query-api", "--insecure"]
    cmd += ["--data-dir", str(tmp_path), "--query-api-port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    ctx = None
    try:
        wait_port(port, timeout=30, proc=proc)
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(f"http://127.0.0.1:{port}/#/virtual")
        expect(pg.locator("#insecure-banner")).to_be_visible()
        assert "Authentication is off" in pg.locator("#insecure-banner").inner_text()
    finally:
        if ctx is not None:
            ctx.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    text = out.decode()
    assert "auth.mode is 'none'" in text, text  # the start-up warning
    assert "auth           OFF" in text, text
