// The hall view: the allocator's racks and nodes as a floor plan, coloured by inlet temperature
// on a fixed scale anchored on the redline; nodes over it striped and counted; the measured
// facility (CRAC supply, cooling, PUE) beside the model; and every failure said, not hidden.
import { ALLOCATOR, getJSON, latestMatching, latestOf } from "./api.js";
import { Problem, consoleInfo, explain } from "./status.js";
import { Poller, fmt, fmtAge, h, inkOn, jobColour, ramp, s } from "./util.js";

const CELL_W = 78, CELL_H = 38, RACK_GAP = 16, PAD = 3, LABEL_W = 58;
const COLD_H = 30, HOT_H = 44, RACK_LABEL_H = 14;
const STALE_S = 30; // a measurement older than this is shown hatched
const DEFAULT_REDLINE_C = 30;
const BELOW_C = 15, ABOVE_C = 5; // the colour scale: redline - 15 °C ... redline + 5 °C, fixed
const ERROR_SPAN_C = 2; // the difference view: -2 ... +2 °C, fixed
const MODE_LABEL = {
  measured: "inlet, measured",
  predicted: "inlet, predicted",
  error: "measured − predicted rise over the supply (the model's error)",
};
const TOTALS_PREFIX = "/kelvin/allocator"; // where the allocator publishes its totals (sensor_prefix)
const TOTALS_CHARTED = ["cooling_kw", "computing_kw", "max_tin_c"];
const FACILITY = { supply: "/hall/supply_temp", cooling: "/hall/cooling_power", power: "/hall/power" };
const POLICY_BOOKS = "/hall/policy/*/*"; // the simulated hall's per-policy totals (datacenter plugin)
const LOOKUP_MS = 30000; // how often to look for sensors that did not exist yet

// Below the redline: cool blue to warm orange; above it a different family (red to dark
// purple), so that "over" never reads as "warm".
const BELOW = ["#313695", "#4575b4", "#74add1", "#abd9e9", "#e0f3f8", "#fee090", "#fdae61", "#f98e52"];
const ABOVE = ["#d7301f", "#a50f15", "#67000d", "#3f007d"];
const DIVERGING = ["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b"];

export class HallView {
  constructor(els, onChart) {
    // {plan, totals, legend, node, jobs, status, name, modes, problem, alerts, none, summary, body, policies}
    this.els = els;
    this.onChart = onChart;
    this.problem = new Problem(els.problem);
    // The browser may restore a radio's state on reload: start from what is shown.
    this.mode = [...els.modes].find((r) => r.checked)?.value || "measured";
    this.hall = null;
    this.hallAt = 0;
    this.measured = new Map();
    this.facility = new Map();
    this.books = new Map();
    this.alerts = [];
    this.selected = 0;
    this.renders = 0;
    this.totalSensors = [];
    this.facilitySensors = [];
    this.lookedUpMs = 0;
    this.booksAtMs = 0;
    this.showReference = false;
    this.poller = new Poller(() => this.refresh(), 1000);
    for (const r of els.modes) {
      r.addEventListener("change", () => { if (r.checked) { this.mode = r.value; this.paint(); } });
    }
  }

  setVisible(v) {
    if (v) this.poller.start();
    else this.poller.stop();
  }

  /** Firing alerts (from the alerts view), shown above the plan. */
  setAlerts(alerts) {
    this.alerts = alerts.filter((a) => a.state === "firing");
    this.renderAlerts();
  }

  async refresh() {
    const started = Date.now();
    let hall;
    try {
      hall = await getJSON(`${ALLOCATOR}/api/v1/hall`);
      this.problem.clear("allocator");
    } catch (exc) {
      const since = this.hall ? ` The floor plan below is the placement of ${new Date(this.hallAt).toLocaleTimeString()}.` : " There is no floor plan to show.";
      this.problem.set("allocator", `${explain(exc, "Allocator unreachable")}.${since}`);
      this.els.plan.classList.add("stale-view");
      this.els.body.hidden = this.els.summary.hidden = !this.hall; // nothing to show yet
      this.setStatus(`allocator unreachable · ${new Date().toLocaleTimeString()}`, "error");
      this.els.plan.dataset.problem = "allocator";
      return;
    }
    const info = await consoleInfo();
    // No simulated hall and no hall file: the allocator holds the allocation model's reference
    // hall, which is not this site's. Say so instead of drawing 40 made-up nodes.
    const reference = hall.model?.source === "reference" && info.profile !== "demo";
    this.els.none.hidden = !reference || this.showReference;
    this.els.body.hidden = reference && !this.showReference;
    this.els.summary.hidden = reference && !this.showReference;
    if (reference && !this.showReference) {
      this.renderNone(hall);
      this.els.plan.dataset.problem = "none";
      return;
    }
    await this.lookUp();
    try {
      const pattern = this.inletPattern(hall);
      const [measured, facility] = await Promise.all([
        pattern ? latestMatching(pattern, `now-${STALE_S * 2}s`) : new Map(),
        latestOf(this.facilitySensors, "now-30s"),
      ]);
      this.measured = measured;
      this.facility = facility;
      this.problem.clear("storage");
    } catch (exc) {
      this.measured = new Map();
      this.facility = new Map();
      this.problem.set("storage", `${explain(exc, "Measured temperatures unavailable")}. The plan shows the allocator's predictions only.`);
    }
    await this.readBooks();
    const layout = `${hall.rows}x${hall.racks}x${hall.slots}`;
    if (!this.hall || this.layout !== layout) this.build(hall);
    this.hall = hall;
    this.hallAt = started;
    this.layout = layout;
    this.paint();
    this.renders += 1;
    this.els.plan.dataset.renders = String(this.renders);
    this.els.plan.dataset.fetchedMs = String(started);
    this.els.plan.dataset.problem = this.problem.active ? [...this.problem.parts.keys()].join(",") : "";
  }

  /** Which of the sensors the view shows exist (looked up every 30 s until all are found). */
  async lookUp() {
    const all = this.totalSensors.length === TOTALS_CHARTED.length && this.facilitySensors.length === Object.keys(FACILITY).length;
    if (all || Date.now() - this.lookedUpMs < LOOKUP_MS) return;
    this.lookedUpMs = Date.now();
    try {
      const [totals, hall] = await Promise.all([
        getJSON("/api/v1/sensor-names", { prefix: TOTALS_PREFIX }),
        getJSON("/api/v1/sensor-names", { match: "/hall/*" }),
      ]);
      this.totalSensors = TOTALS_CHARTED.map((q) => `${TOTALS_PREFIX}/${q}`).filter((n) => totals.sensors.includes(n));
      this.facilitySensors = Object.values(FACILITY).filter((n) => hall.sensors.includes(n));
    } catch {
      this.lookedUpMs = 0; // storage away: try again next time
    }
  }

  /** The simulated hall's per-policy books, every 15 s. */
  async readBooks() {
    if (Date.now() - this.booksAtMs < 15000) return;
    this.booksAtMs = Date.now();
    try {
      this.books = await latestMatching(POLICY_BOOKS, "now-1h");
    } catch {
      this.books = new Map();
    }
  }

  inletSensor(n) {
    return n.inlet_sensor || `/hall/row${n.row}/rack${n.rack}/node${n.slot}/inlet_temp`;
  }

  powerSensor(n) {
    return n.power_sensor || `/hall/row${n.row}/rack${n.rack}/node${n.slot}/power`;
  }

  // One pattern for every node's inlet sensor (one query for all): the levels the names
  // share, "*" where they differ; "/**" then the last level when their depths differ;
  // null (no measured view) when not even that is shared.
  inletPattern(hall) {
    const parts = hall.nodes.filter((n) => n.present !== false).map((n) => this.inletSensor(n).split("/"));
    if (!parts.length) return "/hall/*/*/*/inlet_temp";
    const [first] = parts;
    if (parts.every((p) => p.length === first.length)) {
      return first.map((seg, k) => (parts.every((p) => p[k] === seg) ? seg : "*")).join("/");
    }
    const last = first[first.length - 1];
    return parts.every((p) => p[p.length - 1] === last) ? `/**/${last}` : null;
  }

  /** Geometry: rows top to bottom, a cold aisle at each front, a hot aisle between facing rows. */
  build(hall) {
    const rackW = CELL_W + 2 * PAD, rackH = hall.slots * CELL_H + 2 * PAD;
    const width = LABEL_W + hall.racks * rackW + (hall.racks - 1) * RACK_GAP + 8;
    const aisles = [];
    const rowsY = [];
    let y = 0;
    for (let r = 0; r < hall.rows; r++) {
      const hot = r % 2 === 1;
      aisles.push({ y, h: hot ? HOT_H : COLD_H, hot });
      y += hot ? HOT_H : COLD_H;
      if (!hot) y += RACK_LABEL_H;
      rowsY.push(y);
      y += rackH;
      if (hot) y += RACK_LABEL_H;
    }
    const lastHot = hall.rows % 2 === 1;
    aisles.push({ y, h: lastHot ? HOT_H : COLD_H, hot: lastHot });
    y += lastHot ? HOT_H : COLD_H;

    const svg = s("svg", {
      viewBox: `0 0 ${width} ${y}`, role: "group",
      "aria-label": `Floor plan of ${hall.name || "the hall"}: ${hall.rows} rows of ${hall.racks} racks, ${hall.slots} nodes each, slot 0 at the bottom`,
    });
    svg.append(s("defs", {},
      s("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { width: 6, height: 6, fill: "#9aa3ad", opacity: 0.25 }),
        s("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#5b6470", "stroke-width": 2, opacity: 0.6 })),
      s("pattern", { id: "over", width: 8, height: 8, patternUnits: "userSpaceOnUse", patternTransform: "rotate(-45)" },
        s("line", { x1: 0, y1: 0, x2: 0, y2: 8, stroke: "#ffffff", "stroke-width": 2.5, opacity: 0.55 }))));
    for (const a of aisles) {
      svg.append(s("rect", { x: 0, y: a.y, width, height: a.h, class: a.hot ? "aisle-hot" : "aisle-cold" }));
      svg.append(s("text", { x: width / 2, y: a.y + a.h / 2 + 4, "text-anchor": "middle", class: "aisle-label" },
        a.hot ? "hot aisle" : "cold aisle"));
    }
    this.cells = new Map();
    for (let r = 0; r < hall.rows; r++) {
      const top = rowsY[r];
      svg.append(s("text", { x: 4, y: top + rackH / 2 + 4, class: "row-label" }, `row ${r}`));
      for (let k = 0; k < hall.racks; k++) {
        const x = LABEL_W + k * (rackW + RACK_GAP);
        svg.append(s("rect", { x, y: top, width: rackW, height: rackH, rx: 3, class: "rack-frame" }));
        const labelY = r % 2 === 0 ? top - 4 : top + rackH + 11;
        svg.append(s("text", { x: x + rackW / 2, y: labelY, "text-anchor": "middle", class: "rack-label" }, `rack ${k}`));
        for (let sl = 0; sl < hall.slots; sl++) {
          const cy = top + PAD + (hall.slots - 1 - sl) * CELL_H; // slot 0 at the bottom
          const g = s("g", { class: "node", tabindex: "-1", role: "button", "data-row": r, "data-rack": k, "data-slot": sl });
          const cell = s("rect", { x: x + PAD, y: cy, width: CELL_W, height: CELL_H, class: "cell" });
          const stale = s("rect", { x: x + PAD, y: cy, width: CELL_W, height: CELL_H, class: "stale", visibility: "hidden" });
          const over = s("rect", { x: x + PAD, y: cy, width: CELL_W, height: CELL_H, class: "over", visibility: "hidden" });
          const t1 = s("text", { x: x + PAD + CELL_W / 2, y: cy + 16, "text-anchor": "middle", "font-weight": 600 });
          const t2 = s("text", { x: x + PAD + CELL_W / 2, y: cy + 30, "text-anchor": "middle", "font-size": 10 });
          // The focus frame sits outside the cell, black and white and dashed: nothing like
          // the solid coloured outline of a job.
          const ring = s("g", { class: "focus-ring" },
            s("rect", { x: x + PAD - 2, y: cy - 2, width: CELL_W + 4, height: CELL_H + 4, class: "ring-dark" }),
            s("rect", { x: x + PAD - 2, y: cy - 2, width: CELL_W + 4, height: CELL_H + 4, class: "ring-light" }));
          g.append(cell, over, stale, t1, t2);
          g.addEventListener("click", () => this.select(g));
          g.addEventListener("focus", () => this.select(g));
          g.addEventListener("keydown", (e) => this.onKey(e, r, k, sl));
          svg.append(g);
          this.cells.set(`${r}/${k}/${sl}`, { g, cell, stale, over, ring, t1, t2, x: x + PAD, y: cy });
        }
      }
    }
    this.outlines = s("g", {});
    this.rings = s("g", {});
    svg.append(this.outlines, this.rings);
    for (const c of this.cells.values()) this.rings.append(c.ring);
    this.svg = svg;
    this.els.plan.replaceChildren(svg);
    const first = this.cells.get("0/0/0");
    if (first) first.g.setAttribute("tabindex", "0");
  }

  onKey(e, r, k, sl) {
    const hall = this.hall;
    if (!hall) return;
    let to = null;
    if (e.key === "ArrowLeft") to = [r, k - 1, sl];
    else if (e.key === "ArrowRight") to = [r, k + 1, sl];
    else if (e.key === "ArrowUp") to = sl < hall.slots - 1 ? [r, k, sl + 1] : [r - 1, k, 0];
    else if (e.key === "ArrowDown") to = sl > 0 ? [r, k, sl - 1] : [r + 1, k, hall.slots - 1];
    else if (e.key === "Enter" || e.key === " ") { e.preventDefault(); this.chartNode(this.nodeAt(r, k, sl)); return; }
    if (!to) return;
    e.preventDefault();
    const c = this.cells.get(to.join("/"));
    if (c) c.g.focus(); // the focus handler selects it
  }

  nodeAt(r, k, sl) {
    return this.hall?.nodes.find((n) => n.row === r && n.rack === k && n.slot === sl);
  }

  select(g) {
    for (const c of this.cells.values()) {
      const on = c.g === g;
      c.g.classList.toggle("selected", on);
      c.ring.classList.toggle("shown", on);
      c.g.setAttribute("tabindex", on ? "0" : "-1");
    }
    const n = this.nodeAt(Number(g.dataset.row), Number(g.dataset.rack), Number(g.dataset.slot));
    this.selected = n ? n.index : 0;
    this.renderDetail();
  }

  chartNode(n) {
    if (n) this.onChart([this.inletSensor(n), this.powerSensor(n)]);
  }

  fresh(m) {
    return m && Date.now() / 1000 - m.tsNs / 1e9 <= STALE_S ? m.value : null;
  }

  /** The CRAC's measured supply, when the facility publishes it. */
  measuredSupply() {
    return this.fresh(this.facility.get(FACILITY.supply));
  }

  /** Colours, labels, marks, job outlines and totals for the latest hall and measurements. */
  paint() {
    const hall = this.hall;
    if (!hall) return;
    this.els.plan.classList.toggle("stale-view", this.problem.parts.has("allocator"));
    const redline = hall.redline_c ?? DEFAULT_REDLINE_C;
    const errorMode = this.mode === "error";
    const show = (x) => (errorMode ? `${signed(x)} °C` : `${fmt(x)} °C`);
    const now = Date.now();
    let busy = 0;
    const over = [];
    for (const n of hall.nodes) {
      const c = this.cells.get(`${n.row}/${n.rack}/${n.slot}`);
      if (!c) continue;
      const absent = n.present === false;
      const tin = absent ? null : this.tempOf(n);
      const hot = !errorMode && tin !== null && tin > redline;
      // Counted whatever the colouring: the measured inlets (the predicted ones when shown).
      const judged = absent ? null : errorMode ? this.tempOf(n, "measured") : tin;
      if (judged !== null && judged > redline) over.push(n.index);
      const fill = absent ? "transparent" : tin === null ? "#b8bec6" : errorMode ? errorColour(tin) : tempColour(tin, redline);
      c.cell.setAttribute("fill", fill);
      c.t1.setAttribute("fill", absent ? "currentColor" : inkOn(fill));
      c.t2.setAttribute("fill", absent ? "currentColor" : inkOn(fill));
      c.t1.textContent = absent ? "absent" : tin === null ? "no data" : `${hot ? "▲ " : ""}${show(tin)}`;
      c.t2.textContent = absent ? "" : n.busy ? jobLabel(n.job, hall) : n.available === false ? "unavailable" : "idle";
      c.stale.setAttribute("visibility", !absent && this.mode !== "predicted" && tin === null ? "visible" : "hidden");
      c.over.setAttribute("visibility", hot ? "visible" : "hidden");
      c.g.classList.toggle("over-redline", hot);
      c.g.dataset.index = String(n.index);
      c.g.dataset.busy = String(!!n.busy);
      c.g.dataset.job = n.busy && n.job !== null && n.job !== undefined ? String(n.job) : "";
      c.g.dataset.over = String(hot);
      const m = this.measured.get(this.inletSensor(n));
      c.g.setAttribute("aria-label", `row ${n.row} rack ${n.rack} slot ${n.slot}: ${n.busy ? jobLabel(n.job, hall) : "idle"}, `
        + `${MODE_LABEL[this.mode]} ${tin === null ? "unknown" : show(tin)}${hot ? `, over the ${fmt(redline)} °C redline` : ""}`
        + `${m ? `, measured ${fmtAge(m.tsNs, now)}` : ""}`);
      if (n.busy) busy += 1;
    }
    this.els.plan.dataset.busyCount = String(busy);
    this.els.plan.dataset.overCount = String(over.length);
    this.overNodes = over;
    this.drawOutlines(hall);
    this.renderSummary(hall, busy, redline);
    this.renderTotals(hall, busy, redline);
    this.renderLegend(redline);
    this.renderJobs(hall);
    this.renderDetail();
    this.renderPolicies(hall);
    this.renderAlerts();
    this.els.name.textContent = hall.name ? `· ${hall.name}` : "";
    const stamp = new Date().toLocaleTimeString();
    const noData = this.mode !== "predicted" && this.measured.size === 0;
    if (noData && !this.problem.parts.has("storage")) {
      this.problem.set("measured", `No inlet measurements in the last ${STALE_S * 2} s (is the pusher measuring this hall, e.g. its datacenter plugin?).`, "warn");
    } else {
      this.problem.clear("measured");
    }
    this.setStatus(this.problem.active ? `see above · ${stamp}` : `updated ${stamp}`, this.problem.active ? "warn" : "");
  }

  /** The number a node is coloured by: measured or predicted inlet, or the model's error. */
  tempOf(n, mode = this.mode) {
    const predicted = Number.isFinite(n.predicted_tin_c) ? n.predicted_tin_c : null;
    if (mode === "predicted") return predicted;
    const measured = this.fresh(this.measured.get(this.inletSensor(n)));
    if (mode === "measured") return measured;
    if (measured === null || predicted === null) return null;
    // Rises over each one's supply: the CRAC's measured supply moves, the model's is fixed.
    const supply = this.measuredSupply();
    const base = this.hall?.totals?.base_supply_c;
    return supply !== null && Number.isFinite(base) ? measured - supply - (predicted - base) : measured - predicted;
  }

  /** One outline per run of neighbouring slots in a rack that run the same job. */
  drawOutlines(hall) {
    const runs = [];
    for (let r = 0; r < hall.rows; r++) {
      for (let k = 0; k < hall.racks; k++) {
        let run = null;
        for (let sl = 0; sl < hall.slots; sl++) {
          const n = this.nodeAt(r, k, sl);
          const job = n?.busy ? String(n.job) : null;
          if (run && job === run.job) { run.hi = sl; continue; }
          if (run) runs.push(run);
          run = job === null ? null : { r, k, lo: sl, hi: sl, job };
        }
        if (run) runs.push(run);
      }
    }
    this.outlines.replaceChildren(...runs.map((run) => {
      const top = this.cells.get(`${run.r}/${run.k}/${run.hi}`), bottom = this.cells.get(`${run.r}/${run.k}/${run.lo}`);
      return s("rect", {
        x: top.x + 1.5, y: top.y + 1.5, width: CELL_W - 3, height: bottom.y + CELL_H - top.y - 3, rx: 4,
        class: "job-outline", stroke: jobColour(run.job), "data-job": run.job,
      });
    }));
  }

  /** The few numbers that matter, above the plan (visible on a small screen too). */
  renderSummary(hall, busy, redline) {
    const t = hall.totals || {};
    const peak = this.peakMeasured();
    const supply = this.measuredSupply();
    const cooling = this.fresh(this.facility.get(FACILITY.cooling));
    const power = this.fresh(this.facility.get(FACILITY.power));
    const n = this.overNodes.length;
    const items = [
      ["Peak inlet", Number.isFinite(peak) ? `${fmt(peak)} °C` : `${fmt(t.max_tin_c)} °C (predicted)`, peak > redline ? "bad" : ""],
      ["Over the redline", n ? `${n} node${n > 1 ? "s" : ""}` : "none", n ? "bad" : "ok", `redline ${fmt(redline)} °C, ${this.mode === "predicted" ? "predicted" : "measured"} inlets`],
      ["Supply air", supply !== null ? `${fmt(supply)} °C` : "–", "", "the CRAC's supply, measured"],
      ["Cooling", cooling !== null ? `${fmt(cooling / 1000)} kW` : `${fmt(t.cooling_kw)} kW (model)`],
      ["PUE", cooling !== null && power > 0 ? fmt((power + cooling) / power, 2) : "–", "", "(IT + cooling) / IT, measured"],
      ["Busy", `${busy} / ${hall.nodes.filter((x) => x.present !== false).length}`],
      ["Policy", hall.policy || "–"],
    ];
    this.els.summary.replaceChildren(...items.map(([k, v, kind, why]) => h("div", { class: `item ${kind || ""}`, title: why || null },
      h("dt", {}, k), h("dd", {}, v))));
  }

  peakMeasured() {
    const now = Date.now() / 1000;
    return Math.max(...[...this.measured.values()].filter((m) => now - m.tsNs / 1e9 <= STALE_S).map((m) => m.value));
  }

  renderTotals(hall, busy, redline) {
    const t = hall.totals || {};
    const peak = this.peakMeasured();
    const supply = this.measuredSupply();
    const cooling = this.fresh(this.facility.get(FACILITY.cooling));
    const power = this.fresh(this.facility.get(FACILITY.power));
    const design = t.base_supply_c;
    const needed = t.supply_c;
    let direction = null;
    if (Number.isFinite(needed) && Number.isFinite(design)) {
      const d = needed - design;
      direction = Math.abs(d) < 0.05 ? "= the design supply"
        : d > 0 ? `↑ ${fmt(d)} °C above the design ${fmt(design)} °C: slack to spend on warmer air`
          : `↓ ${fmt(-d)} °C below the design ${fmt(design)} °C: the hall is too hot for it`;
    }
    const measuredOver = hall.nodes.filter((n) => this.fresh(this.measured.get(this.inletSensor(n))) > redline).length;
    const predictedOver = hall.nodes.filter((n) => n.present !== false && n.predicted_tin_c > redline).length;
    const count = (n) => (n ? `${n} node${n > 1 ? "s" : ""}` : "none");
    const present = hall.nodes.filter((n) => n.present !== false).length;
    // [label, value, tooltip, note under the row]; a string alone is a section heading
    const rows = [
      "Measured",
      ["Peak inlet", Number.isFinite(peak) ? `${fmt(peak)} °C` : "–"],
      ["Over the redline", Number.isFinite(peak) ? count(measuredOver) : "–", `inlet above ${fmt(redline)} °C`],
      ["Supply air (CRAC)", supply !== null ? `${fmt(supply)} °C` : "–", "The CRAC's supply temperature: it moves at a bounded rate to keep the hottest inlet under the redline."],
      ["Computing", power !== null ? `${fmt(power / 1000)} kW` : "–"],
      ["Cooling", cooling !== null ? `${fmt(cooling / 1000)} kW` : "–"],
      ["PUE", cooling !== null && power > 0 ? fmt((power + cooling) / power, 2) : "–", "(IT + cooling) / IT"],
      `Model (allocator${Number.isFinite(design) ? `, design supply ${fmt(design)} °C` : ""})`,
      ["Peak inlet", `${fmt(t.max_tin_c)} °C`],
      ["Over the redline", count(predictedOver)],
      ["Supply to keep the redline", Number.isFinite(needed) ? `${fmt(needed)} °C` : "–",
        "The supply temperature that puts the predicted peak inlet exactly at the redline (design supply + redline − predicted peak); CoP and cooling below are at it.", direction],
      ["CoP at that supply", fmt(t.cop, 2)],
      ["Cooling at that supply", `${fmt(t.cooling_kw)} kW`],
      "Jobs",
      ["Busy nodes", `${busy} / ${present}`],
      ...(Number.isFinite(t.running_jobs) ? [["Running, queued", `${t.running_jobs}, ${t.queued_jobs ?? 0}`]] : []),
      ...(hall.policy ? [["Policy", hall.policy]] : []),
    ];
    this.els.totals.replaceChildren(...rows.flatMap((r) => (typeof r === "string"
      ? [h("dt", { class: "section" }, r)]
      : [h("dt", r[2] ? { title: r[2] } : {}, r[0]), h("dd", {}, r[1]), ...(r[3] ? [h("dd", { class: "note" }, r[3])] : [])])));
    const charted = [...this.totalSensors, ...this.facilitySensors.filter((n) => n !== FACILITY.supply)];
    if (charted.length) {
      this.els.totals.append(h("dd", { class: "wide" }, h("button", {
        type: "button", class: "small", onclick: () => this.onChart(charted),
      }, "Chart cooling, computing and peak inlet over time")));
    }
  }

  renderLegend(redline) {
    if (this.mode === "error") {
      this.els.legend.replaceChildren(
        h("div", {}, MODE_LABEL.error),
        h("div", { class: "bar", style: { background: `linear-gradient(to right, ${DIVERGING.join(", ")})` } }),
        h("div", { class: "ends three" }, h("span", {}, `−${ERROR_SPAN_C} °C`), h("span", {}, "0"), h("span", {}, `+${ERROR_SPAN_C} °C`)),
      );
      return;
    }
    const share = (100 * BELOW_C) / (BELOW_C + ABOVE_C);
    this.els.legend.replaceChildren(
      h("div", { class: "title" }, h("span", {}, `${MODE_LABEL[this.mode]} · fixed scale`),
        h("span", { class: "redline" }, `redline ${fmt(redline)} °C ▾`)),
      h("div", { class: "bar split" },
        h("span", { style: { width: `${share}%`, background: `linear-gradient(to right, ${BELOW.join(", ")})` } }),
        h("span", { class: "above", style: { width: `${100 - share}%`, background: `linear-gradient(to right, ${ABOVE.join(", ")})` } })),
      h("div", { class: "ends" },
        h("span", {}, `${fmt(redline - BELOW_C)} °C`),
        h("span", {}, `${fmt(redline - BELOW_C / 2)}`),
        h("span", {}, `${fmt(redline)}`),
        h("span", {}, `${fmt(redline + ABOVE_C)}+`)),
    );
  }

  renderJobs(hall) {
    const jobs = new Map();
    for (const n of hall.nodes) {
      if (!n.busy) continue;
      const j = jobs.get(String(n.job)) || { nodes: 0, power: 0 };
      j.nodes += 1;
      j.power += n.power_w || 0;
      jobs.set(String(n.job), j);
    }
    const items = [...jobs.entries()].sort((a, b) => a[0].localeCompare(b[0], undefined, { numeric: true }));
    if (!items.length) { this.els.jobs.replaceChildren(h("li", { class: "muted" }, "none")); return; }
    this.els.jobs.replaceChildren(...items.map(([job, j]) => {
      const li = h("li", { tabindex: "0", dataset: { job } },
        h("span", { class: "swatch", style: { borderColor: jobColour(job) }, "aria-hidden": "true" }),
        h("span", {}, jobLabel(job, hall)), h("span", { class: "muted" }, `${j.nodes} node${j.nodes > 1 ? "s" : ""} · ${fmt(j.power / 1000)} kW`));
      const lit = (on) => this.highlightJob(on ? job : null);
      li.addEventListener("mouseenter", () => lit(true));
      li.addEventListener("mouseleave", () => lit(false));
      li.addEventListener("focus", () => lit(true));
      li.addEventListener("blur", () => lit(false));
      return li;
    }));
  }

  /** The simulated hall's books: each policy's IT and cooling energy and time over the redline. */
  renderPolicies(hall) {
    const by = new Map();
    for (const [name, m] of this.books) {
      const [, , , policy, q] = name.split("/");
      if (!by.has(policy)) by.set(policy, {});
      by.get(policy)[q] = m.value;
    }
    const rows = [...by.entries()].filter(([, b]) => b.run_time > 0);
    this.els.policies.hidden = rows.length === 0;
    if (!rows.length) return;
    rows.sort((a, b) => (a[1].cooling_energy / a[1].it_energy) - (b[1].cooling_energy / b[1].it_energy));
    const mins = (sec) => (sec >= 3600 ? `${fmt(sec / 3600)} h` : `${fmt(sec / 60, 0)} min`);
    this.els.policies.replaceChildren(
      h("h3", {}, "Policies compared"),
      h("p", { class: "hint small" }, "What the simulated hall drew and spent under each placement policy, over every run on this data directory (kelvin up --demo --policy …)."),
      h("table", { class: "grid small" },
        h("thead", {}, h("tr", {}, ...["Policy", "Ran", "IT", "Cooling", "PUE", "Over redline"].map((x) => h("th", { scope: "col" }, x)))),
        h("tbody", {}, ...rows.map(([p, b]) => h("tr", { class: p === hall.policy ? "current" : "", dataset: { policy: p } },
          h("td", {}, p === hall.policy ? h("strong", {}, `${p} (now)`) : p),
          h("td", { class: "num" }, mins(b.run_time)),
          h("td", { class: "num" }, `${fmt(b.it_energy, 2)} kWh`),
          h("td", { class: "num" }, `${fmt(b.cooling_energy, 2)} kWh`),
          h("td", { class: "num" }, b.it_energy > 0 ? fmt(1 + b.cooling_energy / b.it_energy, 2) : "–"),
          h("td", { class: "num", title: "node-minutes with an inlet over the redline, per hour of run" },
            `${fmt((b.over_redline / 60) / (b.run_time / 3600), 1)} node·min/h`))))),
    );
  }

  renderAlerts() {
    const firing = this.alerts;
    this.els.alerts.hidden = firing.length === 0;
    if (!firing.length) return;
    this.els.alerts.replaceChildren(
      h("strong", {}, `${firing.length} alert${firing.length > 1 ? "s" : ""} firing: `),
      ...firing.slice(0, 4).flatMap((a, i) => [i ? " · " : "", `${a.labels.alertname}${a.annotations?.summary ? ` — ${a.annotations.summary}` : ""}`]),
      firing.length > 4 ? ` · and ${firing.length - 4} more` : "",
      " ", h("a", { href: "#/alerts" }, "Alerts"),
    );
  }

  renderNone(hall) {
    this.els.name.textContent = "";
    this.setStatus("");
    this.els.none.replaceChildren(
      h("h3", {}, "No hall is configured"),
      h("p", {}, "This Kelvin samples the machines its pushers run on. The allocator holds the allocation model's reference hall ",
        h("em", {}, `(${hall.name}, ${hall.rows * hall.racks * hall.slots} nodes)`), ", which is not yours: nothing here measures it."),
      h("p", {}, "To see the simulated hall, run ", h("code", {}, "kelvin up --demo"), ". To see your own hall, describe it in a hall file and map its sensors (",
        h("code", {}, "allocator.hall_file"), ", ", h("code", {}, "allocator.sensor_map"), "): docs/monitor-your-nodes.md."),
      h("button", { type: "button", class: "small", onclick: () => { this.showReference = true; this.poller.kick(); } }, "Show the reference hall anyway (predictions only)"),
    );
  }

  highlightJob(job) {
    this.svg?.classList.toggle("dim", job !== null);
    for (const c of this.cells.values()) c.g.classList.toggle("lit", job !== null && c.g.dataset.job === job);
  }

  renderDetail() {
    const n = this.hall?.nodes.find((x) => x.index === this.selected);
    if (!n) { this.els.node.replaceChildren(); return; }
    const m = this.measured.get(this.inletSensor(n));
    const redline = this.hall.redline_c ?? DEFAULT_REDLINE_C;
    this.els.node.replaceChildren(
      h("strong", {}, `Node ${n.index}`), h("span", { class: "muted" }, ` · row ${n.row}, rack ${n.rack}, slot ${n.slot}`),
      h("dl", {},
        h("dt", {}, "State"), h("dd", {}, n.busy ? `running ${jobLabel(n.job, this.hall)}` : "idle"),
        h("dt", {}, "Power"), h("dd", {}, `${fmt(n.power_w, 0)} W`),
        h("dt", {}, "Inlet, predicted"), h("dd", {}, `${fmt(n.predicted_tin_c)} °C`),
        h("dt", {}, "Inlet, measured"), h("dd", {}, m ? `${fmt(m.value)} °C (${fmtAge(m.tsNs)})${m.value > redline ? " — over the redline" : ""}` : "–"),
      ),
      h("div", { class: "row" },
        h("button", { type: "button", class: "small", onclick: () => this.chartNode(n) }, "Chart inlet and power")),
    );
  }

  setStatus(text, kind = "") {
    this.els.status.textContent = text;
    this.els.status.className = `status ${kind}`;
  }
}

/** "job 17" ("Slurm job 17" when the allocator follows Slurm) for a bare number, the
 * allocator's id ("j17") as it is otherwise. */
function jobLabel(job, hall) {
  const word = hall?.cluster === "external" ? "Slurm job" : "job";
  return job === null || job === undefined ? `${word} ?` : /^\d+$/.test(String(job)) ? `${word} ${job}` : String(job);
}

/** A difference with its sign: "+0.3", "−1.2", "±0.0" when it rounds to nothing. */
function signed(x) {
  const a = Math.abs(x);
  return a < 0.05 ? "±0.0" : `${x > 0 ? "+" : "−"}${fmt(a)}`;
}

/** The fixed scale: redline − 15 °C (blue) to the redline (orange), then red to dark purple. */
export function tempColour(t, redline) {
  if (t <= redline) return ramp(BELOW, (t - (redline - BELOW_C)) / BELOW_C);
  return ramp(ABOVE, (t - redline) / ABOVE_C);
}

function errorColour(d) {
  return ramp(DIVERGING, (d + ERROR_SPAN_C) / (2 * ERROR_SPAN_C));
}
