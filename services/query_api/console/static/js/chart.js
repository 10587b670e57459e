// Charts: several sensors over a relative (live) or absolute range, one y axis per physical
// quantity in SI-prefixed units (W and kW on one axis that reads kW), keyed to its series (uPlot).
import { readings, nsString } from "./api.js";
import { explain } from "./status.js";
import { axisTicks, dimension, formatSI, formatTime, prefixFor } from "./units.js";
import { PALETTE, Poller, fmtInt, h } from "./util.js";

const TARGET_POINTS = 1000; // about one per horizontal pixel: resample longer ranges server-side
const GAP_FACTOR = 3; // a step this many times the usual one (90th percentile) breaks the line

export class ChartPanel {
  constructor(els, onChange, problem) {
    this.els = els; // {chart, chosen, empty, status, range, custom, start, end, apply, live, reset, clear, csv}
    this.problem = problem;
    this.subSecond = false; // points closer than a second: hover times with milliseconds
    this.onChange = onChange;
    this.sensors = []; // [{name, colour}]
    this.range = { kind: "relative", seconds: 300 };
    this.plot = null;
    this.plotKey = "";
    this.window = [0, 0];
    this.poller = new Poller(() => this.refresh(), 2000);
    this.visible = false;
    els.range.addEventListener("change", () => this.onRangeSelect());
    els.apply.addEventListener("click", () => this.applyCustom());
    els.live.addEventListener("change", () => this.schedule());
    els.reset.addEventListener("click", () => this.setRange({ kind: "relative", seconds: this.lastRelative || 300 }));
    els.clear.addEventListener("click", () => { this.sensors = []; this.changed(); });
    // Follow the view's width only (the chart's height is our own doing), one frame later.
    let lastWidth = 0;
    new ResizeObserver(([entry]) => {
      const w = Math.round(entry.contentRect.width);
      if (w !== lastWidth) { lastWidth = w; requestAnimationFrame(() => this.resize()); }
    }).observe(els.chart.parentElement);
  }

  has(name) { return this.sensors.some((s) => s.name === name); }

  colours() { return new Map(this.sensors.map((s) => [s.name, s.colour])); }

  toggle(name) {
    if (this.has(name)) this.remove(name);
    else this.add(name);
  }

  add(...names) {
    for (const name of names) {
      if (this.has(name)) continue;
      const used = new Set(this.sensors.map((s) => s.colour));
      const colour = PALETTE.find((c) => !used.has(c)) || PALETTE[this.sensors.length % PALETTE.length];
      this.sensors.push({ name, colour });
    }
    this.changed();
  }

  remove(name) {
    this.sensors = this.sensors.filter((s) => s.name !== name);
    this.changed();
  }

  changed() {
    this.renderChips();
    this.updateCsvLink();
    this.onChange?.();
    this.poller.kick();
    this.schedule();
  }

  setVisible(v) {
    this.visible = v;
    this.schedule();
    if (v) this.resize();
  }

  isLive() { return this.range.kind === "relative" && this.els.live.checked; }

  /** Poll while visible, live and showing something; refresh faster for shorter ranges. */
  schedule() {
    const on = this.visible && this.isLive() && this.sensors.length > 0;
    if (!on) { this.poller.stop(); return; }
    this.poller.setPeriod(Math.min(30000, Math.max(1000, (this.range.seconds / 450) * 1000)));
    this.poller.start();
  }

  setRange(range) {
    this.range = range;
    if (range.kind === "relative") {
      this.lastRelative = range.seconds;
      this.els.range.value = String(range.seconds);
      if (this.els.range.value !== String(range.seconds)) this.addRangeOption(range.seconds);
      this.els.custom.hidden = true;
      this.els.reset.hidden = true;
    } else {
      this.els.range.value = "custom";
      this.els.custom.hidden = false;
      this.els.start.value = localInput(range.startMs);
      this.els.end.value = localInput(range.endMs);
      this.els.reset.hidden = false;
    }
    this.updateCsvLink();
    this.onChange?.();
    this.poller.kick();
    this.schedule();
  }

  /** A relative range from the address bar that the list lacks (e.g. r=120) gets its own entry. */
  addRangeOption(seconds) {
    const label = seconds % 3600 === 0 ? `${seconds / 3600} h` : seconds % 60 === 0 ? `${seconds / 60} min` : `${seconds} s`;
    const opt = h("option", { value: String(seconds) }, `last ${label}`);
    this.els.range.insertBefore(opt, this.els.range.querySelector("option[value=custom]"));
    this.els.range.value = String(seconds);
  }

  /** The download link asks the query API for exactly what is charted, as CSV. */
  updateCsvLink() {
    const a = this.els.csv;
    a.hidden = this.sensors.length === 0;
    if (a.hidden) return;
    const q = this.query();
    const params = new URLSearchParams();
    for (const s of this.sensors) params.append("sensor", s.name);
    params.set("start", q.start);
    if (q.end) params.set("end", q.end);
    if (q.interval) params.set("interval", q.interval);
    params.set("format", "csv");
    a.href = `/api/v1/readings?${params}`;
  }

  onRangeSelect() {
    const v = this.els.range.value;
    if (v !== "custom") { this.setRange({ kind: "relative", seconds: Number(v) }); return; }
    const [a, b] = this.currentWindowMs();
    this.els.start.value = localInput(a);
    this.els.end.value = localInput(b);
    this.els.custom.hidden = false;
    this.els.start.focus();
  }

  applyCustom() {
    const a = Date.parse(this.els.start.value), b = Date.parse(this.els.end.value);
    if (!(a < b)) {
      this.setStatus("The range needs a start before its end.", "error");
      return;
    }
    this.setRange({ kind: "absolute", startMs: a, endMs: b });
  }

  currentWindowMs() {
    if (this.range.kind === "absolute") return [this.range.startMs, this.range.endMs];
    const now = Date.now();
    return [now - this.range.seconds * 1000, now];
  }

  /** Query arguments for the current range, with server-side resampling for long ones. */
  query() {
    const [a, b] = this.currentWindowMs();
    const step = Math.floor((b - a) / 1000 / TARGET_POINTS);
    const interval = step >= 2 ? `${step}s` : undefined;
    if (this.range.kind === "relative") return { start: `now-${this.range.seconds}s`, end: undefined, interval };
    return { start: nsString(a), end: nsString(b), interval };
  }

  async refresh() {
    if (!this.sensors.length) {
      this.destroyPlot();
      this.els.empty.hidden = false;
      this.setStatus("");
      return;
    }
    this.els.empty.hidden = true;
    const q = this.query();
    const want = this.sensors.slice();
    const answers = await Promise.allSettled(want.map((s) => readings(s.name, q.start, q.end, q.interval)));
    if (want.map((s) => s.name).join() !== this.sensors.map((s) => s.name).join()) return; // changed meanwhile
    const errors = [];
    const tables = [];
    const units = [];
    let win = null;
    let closest = Infinity;
    answers.forEach((a, k) => {
      if (a.status === "fulfilled") {
        const unit = a.value.unit || "";
        tables.push(toTable(a.value, dimension(unit).factor));
        units.push(unit);
        win ??= [a.value.start_ns / 1e9, a.value.end_ns / 1e9];
        const ts = a.value.timestamps_ns;
        for (let i = 1; i < ts.length; i++) closest = Math.min(closest, ts[i] - ts[i - 1]);
      } else {
        tables.push([[], []]);
        units.push("");
        errors.push(explain(a.reason, want[k].name));
      }
    });
    this.subSecond = closest < 1e9;
    if (win) this.window = win;
    else { const [a, b] = this.currentWindowMs(); this.window = [a / 1000, b / 1000]; }
    const data = window.uPlot.join(tables);
    this.draw(want, units, data);
    const points = tables.reduce((n, t) => n + t[1].filter((v) => v !== null).length, 0);
    this.els.chart.dataset.points = String(points);
    this.els.chart.dataset.series = String(want.length);
    this.els.chart.classList.toggle("stale-view", errors.length === want.length);
    const when = new Date().toLocaleTimeString();
    const resampled = q.interval ? ` · averaged over ${q.interval}` : "";
    // A failure is said above the chart (it stays with what it had), not only in the status line.
    this.problem?.set("readings", errors.length
      ? `${errors.length === want.length ? "Nothing to chart" : "Some sensors are missing"} (${when}):\n${errors.join("\n")}`
      : null);
    this.setStatus(errors.length ? `${errors.length} of ${want.length} sensors failed · ${when}` : `${fmtInt(points)} points${resampled} · updated ${when}`, errors.length ? "error" : "");
  }

  /** One axis per physical quantity: which series it carries and the prefix its numbers take. */
  axesOf(sensors, units, data) {
    const axes = new Map();
    units.forEach((u, k) => {
      const d = dimension(u);
      const key = d.quantity;
      if (!axes.has(key)) axes.set(key, { key, base: d.base, series: [], top: 0 });
      const ax = axes.get(key);
      ax.series.push(k);
      for (const v of data[k + 1] || []) if (v !== null && Number.isFinite(v)) ax.top = Math.max(ax.top, Math.abs(v));
    });
    return [...axes.values()].map((ax, i) => {
      const [, prefix] = prefixFor(ax.top, ax.base);
      const one = ax.series.length === 1 ? ax.series[0] : null;
      const name = ax.key === "ratio" && one !== null ? sensors[one].name.split("/").pop() : ax.key;
      const unit = ax.base ? ` [${prefix}${ax.base}]` : "";
      return { ...ax, side: i % 2 ? 1 : 3, label: `${name}${unit}`, colour: one === null ? null : sensors[one].colour, prefix };
    });
  }

  draw(sensors, units, data) {
    const axesInfo = this.axesOf(sensors, units, data);
    const key = sensors.map((s, k) => `${s.name}|${s.colour}|${units[k]}`).join(";")
      + `#${axesInfo.map((a) => a.label).join(";")}#${this.subSecond}`;
    if (this.plot && key === this.plotKey) {
      this.plot.setData(data);
      return;
    }
    this.destroyPlot();
    this.plotKey = key;
    const css = getComputedStyle(document.documentElement);
    const ink = css.getPropertyValue("--text").trim() || "#222";
    const grid = css.getPropertyValue("--line").trim() || "#ddd";
    const axisOf = new Map();
    const ticks = {};
    const axes = [{ stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } }];
    axesInfo.forEach((a, i) => {
      for (const k of a.series) axisOf.set(k, a);
      axes.push({
        scale: `q:${a.key}`, side: a.side, label: a.label, stroke: a.colour || ink,
        labelFont: "bold 12px system-ui, sans-serif",
        grid: { show: i === 0, stroke: grid, width: 1 }, ticks: { stroke: a.colour || grid }, size: 64,
        values: (u, splits) => {
          const labels = axisTicks(splits, a.base).labels;
          ticks[a.key] = labels; // drawn on the canvas: kept for whoever checks them
          return labels;
        },
      });
    });
    const scales = { x: { time: true, range: () => this.window } };
    for (const a of axesInfo) scales[`q:${a.key}`] = { auto: true };
    const sides = { 1: "right", 3: "left" };
    const opts = {
      ...this.size(),
      scales,
      axes,
      series: [
        { label: "time", value: (u, ts) => (ts === null || ts === undefined ? "–" : formatTime(ts, this.subSecond)) },
        ...sensors.map((s, k) => {
          const a = axisOf.get(k);
          const many = axesInfo.length > 1 ? `, ${sides[a.side]} axis` : "";
          return {
            label: units[k] ? `${s.name} [${units[k]}${many}]` : `${s.name}${many ? ` [${many.slice(2)}]` : ""}`,
            stroke: s.colour, width: 1.5, scale: `q:${a.key}`, spanGaps: false,
            value: (u, v) => (v === null || v === undefined ? "–" : formatSI(v, a.base)),
          };
        }),
      ],
      cursor: { drag: { x: true, y: false, setScale: false } },
      legend: { live: true },
      hooks: {
        setSelect: [(u) => this.zoom(u)],
        draw: [() => { this.els.chart.dataset.ticks = JSON.stringify(axesInfo.map((a) => ticks[a.key] || [])); }],
      },
    };
    this.plot = new window.uPlot(opts, data, this.els.chart);
    this.els.chart.dataset.axes = JSON.stringify(axesInfo.map((a) => ({ label: a.label, colour: a.colour, series: a.series.length })));
  }

  zoom(u) {
    const { left, width } = u.select;
    if (width < 4) return;
    const a = u.posToVal(left, "x") * 1000, b = u.posToVal(left + width, "x") * 1000;
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    this.setRange({ kind: "absolute", startMs: a, endMs: b });
  }

  size() {
    const w = Math.max(300, this.els.chart.parentElement.clientWidth - 18);
    const hgt = Math.max(260, Math.min(520, window.innerHeight - 330));
    return { width: w, height: hgt };
  }

  resize() {
    if (this.plot && this.els.chart.parentElement.clientWidth > 0) this.plot.setSize(this.size());
  }

  destroyPlot() {
    this.plot?.destroy();
    this.plot = null;
    this.plotKey = "";
    this.els.chart.replaceChildren();
    this.els.chart.dataset.points = "0";
    this.els.chart.dataset.series = "0";
  }

  renderChips() {
    this.els.chosen.replaceChildren(...this.sensors.map((s) => h("li", {},
      h("span", { class: "swatch", style: { background: s.colour }, "aria-hidden": "true" }),
      h("span", {}, s.name),
      h("button", { type: "button", "aria-label": `Remove ${s.name} from the chart`, title: "Remove", onclick: () => this.remove(s.name) }, "×"),
    )));
  }

  setStatus(text, kind = "") {
    this.els.status.textContent = text;
    this.els.status.className = `status ${kind}`;
  }

  /** Chart state for the address bar: {s: [names], r: "900" | "abs:<ms>-<ms>"}. */
  state() {
    const r = this.range.kind === "relative" ? String(this.range.seconds) : `abs:${Math.round(this.range.startMs)}-${Math.round(this.range.endMs)}`;
    return { s: this.sensors.map((x) => x.name), r };
  }

  restore(params) {
    const r = params.get("r");
    const m = r && /^abs:(\d+)-(\d+)$/.exec(r);
    if (m) this.setRange({ kind: "absolute", startMs: Number(m[1]), endMs: Number(m[2]) });
    else if (r && Number(r) > 0) this.setRange({ kind: "relative", seconds: Number(r) });
    const names = params.getAll("s");
    if (names.join() !== this.sensors.map((x) => x.name).join()) {
      this.sensors = [];
      if (names.length) this.add(...names);
      else this.changed();
    }
  }
}

/** Readings -> [xs in s, ys in the base unit] with a null wherever the series pauses much
 * longer than usual. */
function toTable(r, factor = 1) {
  const ts = r.timestamps_ns;
  const vs = factor === 1 ? r.values : r.values.map((v) => (v === null ? null : v * factor));
  const n = ts.length;
  if (n < 3) return [ts.map((t) => t / 1e9), vs.slice()];
  const steps = [];
  for (let i = 1; i < n; i++) steps.push(ts[i] - ts[i - 1]);
  // The 90th percentile, not the median: a sensor published on change (bursts, then quiet)
  // must not be cut at every quiet spell, while a real outage is still far longer.
  const usual = steps.slice().sort((a, b) => a - b)[Math.floor(steps.length * 0.9)];
  const xs = [ts[0] / 1e9], ys = [vs[0]];
  for (let i = 1; i < n; i++) {
    if (usual > 0 && steps[i - 1] > GAP_FACTOR * usual) {
      xs.push((ts[i - 1] + usual) / 1e9);
      ys.push(null);
    }
    xs.push(ts[i] / 1e9);
    ys.push(vs[i]);
  }
  return [xs, ys];
}

function localInput(ms) {
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 19);
}
