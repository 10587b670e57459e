// The hall view: the allocator's racks and nodes as a floor plan, coloured by inlet temperature.
import { ALLOCATOR, getJSON, latestMatching } from "./api.js";
import { Poller, fmt, fmtAge, h, inkOn, jobColour, rampGradient, s, tempColour } from "./util.js";

const CELL_W = 78, CELL_H = 38, RACK_GAP = 16, PAD = 3, LABEL_W = 58;
const COLD_H = 30, HOT_H = 44, RACK_LABEL_H = 14;
const STALE_S = 30; // a measurement older than this is shown hatched
const DEFAULT_REDLINE_C = 30;
const MODE_LABEL = {
  measured: "inlet, measured",
  predicted: "inlet, predicted",
  error: "measured − predicted inlet (the model's error)",
};
const TOTALS_PREFIX = "/kelvin/allocator"; // where the allocator publishes its totals (sensor_prefix)
const TOTALS_CHARTED = ["cooling_kw", "computing_kw", "max_tin_c"];

export class HallView {
  constructor(els, onChart) {
    this.els = els; // {plan, totals, legend, node, jobs, status, name, modes}
    this.onChart = onChart;
    // The browser may restore a radio's state on reload: start from what is shown.
    this.mode = [...els.modes].find((r) => r.checked)?.value || "measured";
    this.hall = null;
    this.measured = new Map();
    this.selected = 0;
    this.renders = 0;
    this.totalSensors = [];
    this.totalsCheckedMs = 0;
    this.poller = new Poller(() => this.refresh(), 1000);
    for (const r of els.modes) {
      r.addEventListener("change", () => { if (r.checked) { this.mode = r.value; this.paint(); } });
    }
  }

  setVisible(v) {
    if (v) this.poller.start();
    else this.poller.stop();
  }

  async refresh() {
    const started = Date.now();
    let hall;
    try {
      hall = await getJSON(`${ALLOCATOR}/api/v1/hall`);
    } catch (exc) {
      this.setStatus(exc.status === 0 || exc.status >= 500
        ? `Allocator unreachable: ${exc.detail}` : `Hall not available: ${exc.detail}`, "error");
      this.els.plan.classList.add("stale-view");
      return;
    }
    try {
      const pattern = this.inletPattern(hall);
      this.measured = pattern ? await latestMatching(pattern, `now-${STALE_S * 2}s`) : new Map();
    } catch (exc) {
      this.measured = new Map();
      this.setStatus(`Measured inlet temperatures unavailable: ${exc.detail}`, "warn");
    }
    await this.findTotalSensors();
    const layout = `${hall.rows}x${hall.racks}x${hall.slots}`;
    if (!this.hall || this.layout !== layout) this.build(hall);
    this.hall = hall;
    this.layout = layout;
    this.paint();
    this.renders += 1;
    this.els.plan.dataset.renders = String(this.renders);
    this.els.plan.dataset.fetchedMs = String(started);
  }

  /** The allocator's published totals, if stored (looked up every 30 s until found). */
  async findTotalSensors() {
    if (this.totalSensors.length || Date.now() - this.totalsCheckedMs < 30000) return;
    this.totalsCheckedMs = Date.now();
    try {
      const { sensors } = await getJSON("/api/v1/sensor-names", { prefix: TOTALS_PREFIX });
      this.totalSensors = TOTALS_CHARTED.map((q) => `${TOTALS_PREFIX}/${q}`).filter((n) => sensors.includes(n));
    } catch {
      this.totalSensors = [];
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
    svg.append(s("defs", {}, s("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
      s("rect", { width: 6, height: 6, fill: "#9aa3ad", opacity: 0.25 }),
      s("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#5b6470", "stroke-width": 2, opacity: 0.6 }))));
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
          const t1 = s("text", { x: x + PAD + CELL_W / 2, y: cy + 16, "text-anchor": "middle", "font-weight": 600 });
          const t2 = s("text", { x: x + PAD + CELL_W / 2, y: cy + 30, "text-anchor": "middle", "font-size": 10 });
          const ring = s("rect", { x: x + PAD + 1.5, y: cy + 1.5, width: CELL_W - 3, height: CELL_H - 3, class: "focus-ring" });
          g.append(cell, stale, t1, t2, ring);
          g.addEventListener("click", () => this.select(g));
          g.addEventListener("focus", () => this.select(g));
          g.addEventListener("keydown", (e) => this.onKey(e, r, k, sl));
          svg.append(g);
          this.cells.set(`${r}/${k}/${sl}`, { g, cell, stale, t1, t2, x: x + PAD, y: cy });
        }
      }
    }
    this.outlines = s("g", {});
    svg.append(this.outlines);
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
      c.g.classList.toggle("selected", c.g === g);
      c.g.setAttribute("tabindex", c.g === g ? "0" : "-1");
    }
    const n = this.nodeAt(Number(g.dataset.row), Number(g.dataset.rack), Number(g.dataset.slot));
    this.selected = n ? n.index : 0;
    this.renderDetail();
  }

  chartNode(n) {
    if (n) this.onChart([this.inletSensor(n), this.powerSensor(n)]);
  }

  /** Colours, labels, job outlines and totals for the latest hall and measurements. */
  paint() {
    const hall = this.hall;
    if (!hall) return;
    jobWord = hall.cluster === "external" ? "Slurm job" : "job"; // the allocator follows Slurm
    this.els.plan.classList.remove("stale-view");
    const t = hall.totals || {};
    const redline = hall.redline_c ?? DEFAULT_REDLINE_C;
    const temps = hall.nodes.filter((n) => n.present !== false).map((n) => this.tempOf(n)).filter((x) => x !== null);
    const errorMode = this.mode === "error";
    // Temperatures from the supply (the one the inlets are at) to the redline; model errors
    // symmetric around zero.
    const span = Math.max(1, ...temps.map(Math.abs));
    const lo = errorMode ? -span : Math.min(t.base_supply_c ?? 15, ...temps);
    const hi = errorMode ? span : Math.max(redline, ...temps);
    const show = (x) => (errorMode ? `${signed(x)} °C` : `${fmt(x)} °C`);
    const now = Date.now();
    let busy = 0;
    for (const n of hall.nodes) {
      const c = this.cells.get(`${n.row}/${n.rack}/${n.slot}`);
      if (!c) continue;
      const absent = n.present === false;
      const tin = absent ? null : this.tempOf(n);
      const fill = absent ? "transparent" : tin === null ? "#b8bec6" : tempColour(tin, lo, hi);
      c.cell.setAttribute("fill", fill);
      c.t1.setAttribute("fill", absent ? "currentColor" : inkOn(fill));
      c.t2.setAttribute("fill", absent ? "currentColor" : inkOn(fill));
      c.t1.textContent = absent ? "absent" : tin === null ? "no data" : show(tin);
      c.t2.textContent = absent ? "" : n.busy ? jobLabel(n.job) : n.available === false ? "unavailable" : "idle";
      c.stale.setAttribute("visibility", !absent && this.mode !== "predicted" && tin === null ? "visible" : "hidden");
      c.g.dataset.index = String(n.index);
      c.g.dataset.busy = String(!!n.busy);
      c.g.dataset.job = n.busy && n.job !== null && n.job !== undefined ? String(n.job) : "";
      const m = this.measured.get(this.inletSensor(n));
      c.g.setAttribute("aria-label", `row ${n.row} rack ${n.rack} slot ${n.slot}: ${n.busy ? jobLabel(n.job) : "idle"}, `
        + `${MODE_LABEL[this.mode]} ${tin === null ? "unknown" : show(tin)}${m ? `, measured ${fmtAge(m.tsNs, now)}` : ""}`);
      if (n.busy) busy += 1;
    }
    this.els.plan.dataset.busyCount = String(busy);
    this.drawOutlines(hall);
    this.renderTotals(hall, busy, redline);
    this.renderLegend(lo, hi, show);
    this.renderJobs(hall);
    this.renderDetail();
    this.els.name.textContent = hall.name ? `· ${hall.name}` : "";
    const stamp = new Date().toLocaleTimeString();
    this.setStatus(this.mode !== "predicted" && this.measured.size === 0
      ? `No inlet measurements in the last ${STALE_S * 2} s (is the datacenter plugin running?) · ${stamp}`
      : `updated ${stamp}`, this.mode !== "predicted" && this.measured.size === 0 ? "warn" : "");
  }

  /** The number a node is coloured by: measured or predicted inlet, or their difference. */
  tempOf(n) {
    const predicted = Number.isFinite(n.predicted_tin_c) ? n.predicted_tin_c : null;
    if (this.mode === "predicted") return predicted;
    const m = this.measured.get(this.inletSensor(n));
    const measured = !m || Date.now() / 1000 - m.tsNs / 1e9 > STALE_S ? null : m.value;
    if (this.mode === "measured") return measured;
    return measured === null || predicted === null ? null : measured - predicted;
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

  renderTotals(hall, busy, redline) {
    const t = hall.totals || {};
    const measuredPeak = Math.max(...[...this.measured.values()].filter((m) => Date.now() / 1000 - m.tsNs / 1e9 <= STALE_S).map((m) => m.value));
    const rows = [
      ["Peak inlet, predicted", `${fmt(t.max_tin_c)} °C`],
      ["Peak inlet, measured", Number.isFinite(measuredPeak) ? `${fmt(measuredPeak)} °C` : "–"],
      ["Redline", `${fmt(redline)} °C`],
      ...(Number.isFinite(t.base_supply_c) ? [["Supply air", `${fmt(t.base_supply_c)} °C`,
        "The CRAC supply the predicted inlet temperatures are computed at."]] : []),
      ["Supply air, raised", `${fmt(t.supply_c)} °C`,
        "Tsup′ = supply + redline − predicted peak inlet: the supply that puts the peak inlet at the redline. CoP and cooling are computed at it."],
      ["CoP", fmt(t.cop, 2)],
      ["Computing", `${fmt(t.computing_kw)} kW`],
      ["Cooling", `${fmt(t.cooling_kw)} kW`],
      ["Busy nodes", `${busy} / ${hall.nodes.filter((n) => n.present !== false).length}`],
    ];
    if (Number.isFinite(t.running_jobs)) rows.push(["Jobs running, queued", `${t.running_jobs}, ${t.queued_jobs ?? 0}`]);
    if (hall.policy) rows.push(["Policy", hall.policy]);
    this.els.totals.replaceChildren(...rows.flatMap(([k, v, why]) => [h("dt", why ? { title: why } : {}, k), h("dd", {}, v)]));
    if (this.totalSensors.length) {
      this.els.totals.append(h("dd", { class: "wide" }, h("button", {
        type: "button", class: "small", onclick: () => this.onChart(this.totalSensors),
      }, "Chart cooling, computing and peak inlet over time")));
    }
  }

  renderLegend(lo, hi, show) {
    this.els.legend.replaceChildren(
      h("div", {}, MODE_LABEL[this.mode]),
      h("div", { class: "bar", style: { background: rampGradient() } }),
      h("div", { class: "ends" }, h("span", {}, show(lo)), h("span", {}, show(hi))),
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
        h("span", {}, jobLabel(job)), h("span", { class: "muted" }, `${j.nodes} node${j.nodes > 1 ? "s" : ""} · ${fmt(j.power / 1000)} kW`));
      const lit = (on) => this.highlightJob(on ? job : null);
      li.addEventListener("mouseenter", () => lit(true));
      li.addEventListener("mouseleave", () => lit(false));
      li.addEventListener("focus", () => lit(true));
      li.addEventListener("blur", () => lit(false));
      return li;
    }));
  }

  highlightJob(job) {
    this.svg?.classList.toggle("dim", job !== null);
    for (const c of this.cells.values()) c.g.classList.toggle("lit", job !== null && c.g.dataset.job === job);
  }

  renderDetail() {
    const n = this.hall?.nodes.find((x) => x.index === this.selected);
    if (!n) { this.els.node.replaceChildren(); return; }
    const m = this.measured.get(this.inletSensor(n));
    this.els.node.replaceChildren(
      h("strong", {}, `Node ${n.index}`), h("span", { class: "muted" }, ` · row ${n.row}, rack ${n.rack}, slot ${n.slot}`),
      h("dl", {},
        h("dt", {}, "State"), h("dd", {}, n.busy ? `running ${jobLabel(n.job)}` : "idle"),
        h("dt", {}, "Power"), h("dd", {}, `${fmt(n.power_w, 0)} W`),
        h("dt", {}, "Inlet, predicted"), h("dd", {}, `${fmt(n.predicted_tin_c)} °C`),
        h("dt", {}, "Inlet, measured"), h("dd", {}, m ? `${fmt(m.value)} °C (${fmtAge(m.tsNs)})` : "–"),
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

let jobWord = "job";

/** "job 17" ("Slurm job 17" when the allocator follows Slurm) for a bare number, the
 * allocator's id ("j17") as it is otherwise. */
function jobLabel(job) {
  return job === null || job === undefined ? `${jobWord} ?` : /^\d+$/.test(String(job)) ? `${jobWord} ${job}` : String(job);
}

/** A difference with its sign: "+0.3", "−1.2", "±0.0" when it rounds to nothing. */
function signed(x) {
  const a = Math.abs(x);
  return a < 0.05 ? "±0.0" : `${x > 0 ? "+" : "−"}${fmt(a)}`;
}
