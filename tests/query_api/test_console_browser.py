"""The console end to end in a real browser: Debian's chromium, driven by Playwright.

One ``kelvin up --demo`` (subprocess, free ports, temp data dir) for the module:
the pusher's ``datacenter`` plugin simulates the hall, the allocator places a
seeded job stream, everything lands in SQLite and is read back through the
query API the console talks to. Every test fails on a console error, an
uncaught page error, a failed request or an HTTP error answer. The demo's CRAC
is kept warm (``supply_min_c``) so that nodes at the aisle ends are over the
redline whatever the jobs do: the over-redline marking is always on screen.
Two more query APIs show the degraded states: one whose storage is down, one
whose allocator is. Screenshots of every view at 1440x900 and 1024x700 go to
``test-artifacts/console-*.png``.
"""

from __future__ import annotations

import re
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
pusher:
  plugins:
    datacenter: {supply_min_c: 22.0, ledger_interval_ms: 1000}
    procfs: {}
"""
"""A busier job stream than the default so that the hall shows jobs within seconds, and a CRAC
that cannot go below 22 °C: the idle nodes at the aisle ends (8.7 K of recirculation) are over
the 30 °C redline."""
FIRING_RULE = """
groups:
  - name: console-test
    interval: 1s
    rules:
      - alert: MeasuredInletsReported
        expr: 'max({__name__=~".+_inlet_temp", __name__!~".+_predicted_inlet_temp"}) > 0'
        labels: {severity: info}
        annotations:
          summary: "hottest measured inlet {{ $value | printf \\"%.1f\\" }} °C"
"""
"""Beside the demo's hall rules (whose ``for: 1m`` outlasts most of this module): a rule that
fires at its first evaluation over the simulated hall, so a firing alert is on screen."""
INLET = "/hall/row0/rack0/node0/inlet_temp"
SHOWN_JS = """() => ({
    busy: [...document.querySelectorAll('svg .node')].filter(e => e.dataset.busy === 'true')
        .map(e => [e.dataset.index, e.dataset.job]),
    outlined: [...document.querySelectorAll('svg .job-outline')].map(e => e.dataset.job),
})"""
"""What the floor plan shows: busy nodes with their job, and the jobs outlined."""
OVER_JS = """() => {
    const over = [...document.querySelectorAll('svg .node.over-redline')];
    return {
        count: Number(document.getElementById('hall-plan').dataset.overCount),
        marked: over.length,
        hatched: over.filter(g => g.querySelector('rect.over').getAttribute('visibility') === 'visible').length,
        labels: over.map(g => g.querySelector('text').textContent),
        fills: over.map(g => g.querySelector('rect.cell').getAttribute('fill')),
        summary: [...document.querySelectorAll('#hall-summary .item')].map(i => i.textContent),
    };
}"""
"""The over-redline marking as drawn: marked nodes, their stripes, labels, fills, the count."""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KelvinUp]:
    data = tmp_path_factory.mktemp("console-demo")
    rules = data / "console-rules.yml"
    rules.write_text(FIRING_RULE)
    cfg = data / "demo.yaml"
    cfg.write_text(FAST_DEMO + f"query_api:\n  rule_files: [{str(rules)!r}]\n")
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
    # Hover: the time to the second, and to the millisecond (readings are 250 ms apart).
    box = pg.locator("#chart .u-over").bounding_box()
    pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    hover = pg.locator(".u-legend .u-series").first.locator(".u-value").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", hover), hover
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
    for label in ("Peak inlet", "Supply air (CRAC)", "CoP", "Computing", "Cooling", "PUE"):
        assert label in totals
    # The supply the model needs says what it is, and which way it moved from the design.
    assert "Supply to keep the redline" in totals
    note = pg.locator("#hall-totals dd.note").first.inner_text()
    assert re.match(r"^[↑↓] [0-9.]+ °C (above|below) the design 15\.0 °C", note), note
    # Over the redline: the CRAC cannot go below 22 °C, so the aisle-end nodes are over it,
    # striped, marked and counted, and coloured from the scale above the redline.
    over = pg.wait_for_function(f"() => ({OVER_JS})().marked > 0 && ({OVER_JS})()").json_value()
    assert over["marked"] == over["hatched"] == over["count"]
    assert all(
        label.startswith("▲ ") and float(label[2:].split()[0]) > 30 for label in over["labels"]
    )
    for fill in over["fills"]:  # the red-to-purple family: no green to speak of
        r, g = int(fill[1:3], 16), int(fill[3:5], 16)
        assert g < 60 and r > g, fill
    n = over["count"]
    assert f"Over the redline{n} node" in "".join(over["summary"])
    # The scale is fixed and anchored on the redline, whatever the hottest node.
    legend = pg.locator("#hall-legend").inner_text()
    assert "redline 30.0 °C" in legend and "15.0 °C" in legend and "35.0+" in legend
    shoot(pg, artifacts_dir, "hall")
    # Keyboard: focus a node, arrows move, the detail panel follows; the focus frame is the
    # dashed black-and-white one, not a job's coloured outline.
    first = pg.locator("svg .node[tabindex='0']")
    first.focus()
    pg.keyboard.press("ArrowRight")
    assert "rack 1" in pg.locator("#hall-node").inner_text()
    ring = pg.evaluate(
        """() => [...document.querySelectorAll('svg .focus-ring.shown rect')]
        .map(r => [getComputedStyle(r).stroke, getComputedStyle(r).strokeDasharray])"""
    )
    assert ring == [["rgb(0, 0, 0)", "none"], ["rgb(255, 255, 255)", "5px, 4px"]], ring
    pg.locator("input[name=hall-colour][value=predicted]").check()
    pg.wait_for_function(
        "() => document.querySelector('#hall-legend').textContent.includes('predicted')"
    )
    pg.screenshot(path=str(artifacts_dir / "console-hall-predicted.png"))
    # The model's error per node: measured minus predicted rise over the supply, signed.
    pg.locator("input[name=hall-colour][value=error]").check()
    pg.wait_for_function(
        "() => [...document.querySelectorAll('svg .node text:first-of-type')]"
        ".every(t => /^[+−±][0-9.]+ °C$/.test(t.textContent))"
    )
    assert "rise over the supply" in pg.locator("#hall-legend").inner_text()
    pg.screenshot(path=str(artifacts_dir / "console-hall-difference.png"))
    # The simulated hall's books: the policy running now, with its energy so far.
    row = pg.locator("#hall-policies tr[data-policy=joint]")
    expect(row).to_be_visible(timeout=30_000)
    assert "(now)" in row.inner_text() and "kWh" in row.inner_text()
    assert problems.items == []


def shoot(pg: Any, artifacts_dir: Path, name: str) -> None:
    """The page at 1440x900 and at 1024x700 (a laptop): test-artifacts/console-NAME-WxH.png."""
    size = pg.viewport_size
    for w, h in ((1440, 900), (1024, 700)):
        pg.set_viewport_size({"width": w, "height": h})
        pg.wait_for_timeout(300)  # the layout settles (a resize redraws the chart)
        pg.screenshot(path=str(artifacts_dir / f"console-{name}-{w}x{h}.png"))
    pg.set_viewport_size(size)


def test_the_hall_totals_stay_in_view_on_a_laptop_screen(
    page: tuple[Any, Problems], demo: KelvinUp
) -> None:
    pg, problems = page
    pg.set_viewport_size({"width": 1024, "height": 700})
    pg.goto(f"{demo.console_url}#/hall")
    pg.wait_for_function("() => Number(document.getElementById('hall-plan').dataset.renders) >= 1")
    for sel in ("#hall-summary", "#hall-totals dt.section", "#hall-plan svg"):
        box = pg.locator(sel).first.bounding_box()
        assert box is not None and box["y"] + 20 < 700 and box["x"] + 20 < 1024, (sel, box)
    # The peak inlet, the count over the redline and the cooling: above the fold, unscrolled.
    summary = pg.locator("#hall-summary").bounding_box()
    assert summary["y"] + summary["height"] <= 700
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
    # kW and W on one axis, in kW; the dimensionless PUE on its own, named for what it is.
    deadline = time.monotonic() + 30  # /hall/pue is defined once its inputs exist
    while "/hall/pue" not in httpx.get(f"{demo.url('query_api')}/api/v1/virtual", timeout=10).text:
        assert time.monotonic() < deadline, "the demo never defined /hall/pue"
        time.sleep(0.5)
    pg.goto(
        f"{demo.console_url}#/charts?s=%2Fdemo%2Fit_power&s=%2Fhall%2Fpower&s=%2Fhall%2Fpue&r=60"
    )
    pg.wait_for_function(
        "() => JSON.parse(document.getElementById('chart').dataset.axes || '[]').length === 2"
    )
    axes = pg.evaluate("JSON.parse(document.getElementById('chart').dataset.axes)")
    assert axes[0] == {"label": "power [kW]", "colour": None, "series": 2}, axes
    assert axes[1]["label"] == "pue" and axes[1]["series"] == 1 and axes[1]["colour"], axes
    pg.wait_for_function(
        "() => JSON.parse(document.getElementById('chart').dataset.ticks || '[[]]')[0].length > 1"
    )
    ticks = pg.evaluate("JSON.parse(document.getElementById('chart').dataset.ticks)")[0]
    assert max(float(t) for t in ticks) < 1000, f"the power axis counts kW, not W: {ticks}"
    shoot(pg, artifacts_dir, "charts")
    # Redefining asks first: declined, nothing changes; accepted, the new definition is live.
    pg.goto(f"{demo.console_url}#/virtual")
    row.get_by_role("button", name="Edit /demo/it_power").click()
    form.locator("textarea[name=expression]").fill('sum("/hall/*/*/*/power") / 2')
    asked: list[str] = []
    pg.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    form.locator("button[type=submit]").click()
    pg.wait_for_function(
        "() => document.getElementById('virtual-message').textContent.startsWith('Not saved')"
    )
    assert asked and "exists" in asked[0] and "dropped" in asked[0]
    assert "/ 2" not in httpx.get(f"{demo.url('query_api')}/api/v1/virtual/demo/it_power").text
    pg.once("dialog", lambda d: d.accept())
    form.locator("button[type=submit]").click()
    pg.wait_for_function(
        "() => document.getElementById('virtual-message').textContent.startsWith('Saved')"
    )
    stored = httpx.get(f"{demo.url('query_api')}/api/v1/virtual/demo/it_power").json()
    assert stored["expression"] == 'sum("/hall/*/*/*/power") / 2'
    shoot(pg, artifacts_dir, "virtual")
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
    # The history comes from the agent's own sensors in storage (it survives a reload).
    expect(pg.locator("#ingest-history")).to_contain_text("From storage: 1 collect agent")
    shoot(pg, artifacts_dir, "ingest")
    assert problems.items == []


def test_a_firing_alert_shows_in_the_alerts_view_and_above_the_hall(
    page: tuple[Any, Problems], demo: KelvinUp, artifacts_dir: Path
) -> None:
    """``kelvin up --demo`` evaluates its rules; an alert that fires is listed, firing, in the
    Alerts view and named in the strip above the hall plan."""
    pg, problems = page
    api = f"{demo.url('query_api')}/prometheus/api/v1/alerts"
    deadline = time.monotonic() + 60
    while True:  # the rule evaluates every second once the hall's first inlets are stored
        alerts = httpx.get(api, timeout=10).json()["data"]["alerts"]
        ours = [a for a in alerts if a["labels"]["alertname"] == "MeasuredInletsReported"]
        if ours and ours[0]["state"] == "firing":
            break
        assert time.monotonic() < deadline, alerts
        time.sleep(0.2)
    summary = ours[0]["annotations"]["summary"]
    assert re.fullmatch(r"hottest measured inlet \d+\.\d °C", summary), summary
    pg.goto(f"{demo.console_url}#/hall")
    strip = pg.locator("#hall-alerts")
    expect(strip).to_be_visible()
    expect(strip).to_contain_text("firing")
    expect(strip).to_contain_text("MeasuredInletsReported")
    expect(strip).to_contain_text("hottest measured inlet")
    shoot(pg, artifacts_dir, "hall-alerts")
    pg.goto(f"{demo.console_url}#/alerts")
    pg.wait_for_function(
        "() => /rules in 3 groups/.test(document.querySelector('#alerts-status')?.textContent || '')"
    )
    row = pg.locator("#alerts-table tbody tr.firing", has_text="MeasuredInletsReported")
    expect(row).to_have_count(1)
    expect(row.locator(".pill")).to_have_text("firing")
    expect(row).to_contain_text("hottest measured inlet")
    expect(pg.locator("#alerts-empty")).to_be_hidden()
    expect(pg.locator("#alerts-badge")).to_contain_text(re.compile(r"[1-9][0-9]* alerts? firing"))
    assert "bad" in (pg.locator("#alerts-badge").get_attribute("class") or "")
    shoot(pg, artifacts_dir, "alerts")
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


@pytest.fixture(scope="module")
def degraded(demo: KelvinUp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two more query APIs: one whose storage (an InfluxDB) and collect agent do not answer (its
    allocator is the demo's), one with its own SQLite whose allocator does not answer."""
    dead = [free_port() for _ in range(3)]
    configs = {
        "storage_down": f"""
storage: {{backend: influxdb, influxdb: {{url: "http://127.0.0.1:{dead[0]}", retries: 0, timeout_s: 1}}}}
query_api: {{allocator_url: "{demo.url("allocator")}", collect_agent_url: "http://127.0.0.1:{dead[1]}"}}
""",
        "allocator_down": f"""
query_api: {{allocator_url: "http://127.0.0.1:{dead[2]}", collect_agent_url: "{demo.url("collect_agent")}"}}
""",
    }
    procs, urls = [], {}
    try:
        for name, text in configs.items():
            d = tmp_path_factory.mktemp(name)
            (d / "kelvin.yaml").write_text(text)
            port = free_port()
            cmd = [sys.executable, "-m", "services.cli", "run", "query-api", "--host", "127.0.0.1"]
            cmd += [
                "--config",
                str(d / "kelvin.yaml"),
                "--data-dir",
                str(d),
                "--query-api-port",
                str(port),
            ]
            proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d
            )
            procs.append(proc)
            wait_port(port, timeout=30, proc=proc)
            urls[name] = f"http://127.0.0.1:{port}/"
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _degraded_page(browser: Any) -> tuple[Any, Any, list[str]]:
    """A page that may see failed requests (that is the point) but no script error."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return ctx, pg, errors


def test_every_view_says_that_storage_is_down(
    browser: Any, degraded: dict[str, str], artifacts_dir: Path
) -> None:
    ctx, pg, errors = _degraded_page(browser)
    try:
        base = degraded["storage_down"]
        pg.goto(f"{base}#/charts?s=%2Fhall%2Fpower&r=60")
        banner = pg.locator("#storage-banner")
        expect(banner).to_contain_text("Storage unreachable")
        expect(banner).to_contain_text("storage not reachable")
        expect(pg.locator("#chart-problem")).to_contain_text("storage is unreachable")
        expect(pg.locator("#tree-status")).to_contain_text("Cannot list sensors")
        shoot(pg, artifacts_dir, "degraded-storage-charts")
        pg.goto(f"{base}#/virtual")
        expect(pg.locator("#virtual-problem")).to_contain_text(
            "Cannot list virtual sensors: storage is unreachable"
        )
        pg.goto(f"{base}#/ingest")
        expect(pg.locator("#ingest-problem")).to_contain_text("Collect agent unreachable")
        expect(pg.locator("#ingest-problem")).to_contain_text("is unreachable")
        shoot(pg, artifacts_dir, "degraded-storage-ingest")
        pg.goto(f"{base}#/alerts")
        expect(pg.locator("#alerts-status")).to_contain_text("rules")  # rules load; alerts say why
        # The allocator answers with the reference hall, but this is no demo: no made-up hall,
        # unless asked for; then the plan, and why it has no measurements.
        pg.goto(f"{base}#/hall")
        none = pg.locator("#hall-none")
        expect(none).to_contain_text("No hall is configured")
        expect(pg.locator("#hall-plan svg")).to_have_count(0)
        none.get_by_role("button").click()
        expect(pg.locator("#hall-problem")).to_contain_text(
            "Measured temperatures unavailable: storage is unreachable"
        )
        expect(pg.locator("#hall-plan svg .node")).to_have_count(40)
        shoot(pg, artifacts_dir, "degraded-storage-hall")
    finally:
        ctx.close()
    assert errors == []


def test_the_hall_says_that_the_allocator_is_down(
    browser: Any, degraded: dict[str, str], artifacts_dir: Path
) -> None:
    ctx, pg, errors = _degraded_page(browser)
    try:
        pg.goto(f"{degraded['allocator_down']}#/hall")
        problem = pg.locator("#hall-problem")
        expect(problem).to_contain_text("Allocator unreachable")
        expect(problem).to_contain_text("There is no floor plan to show")
        expect(pg.locator("#hall-status")).to_contain_text("allocator unreachable")
        expect(pg.locator("#storage-banner")).to_be_hidden()
        shoot(pg, artifacts_dir, "degraded-allocator-hall")
    finally:
        ctx.close()
    assert errors == []
