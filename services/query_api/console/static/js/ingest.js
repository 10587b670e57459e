// Ingest health from the collect agent's /api/v1/stats: header badge, cards, rejects; the rate
// history from the agents' own sensors in storage (/kelvin/collect_agent/<agent>/...), so it
// survives a reload; this page's own samples only where no agent stores them.
import { AGENT, getJSON, getText } from "./api.js";
import { explain } from "./status.js";
import { formatTime } from "./units.js";
import { Poller, fmt, fmtBytes, fmtInt, h } from "./util.js";

const HISTORY = 300; // samples kept for the rate chart
const WINDOW_S = 600; // the rate chart shows the last 10 minutes
const MIN_GAP_S = 1; // two polls closer than this (a view switch) keep one sample
const STORED = ["/kelvin/collect_agent/*/readings_per_s", "/kelvin/collect_agent/*/written_per_s"];
const STORED_EVERY_MS = 10000;
const BUCKET_S = 5; // agents sample on their own clocks: sum them per 5 s

export class IngestView {
  constructor(els) {
    this.els = els; // {badge, status, cards, rejects, chart}
    this.visible = false;
    this.history = [[], [], []]; // time s, received/s, written/s (this page's samples)
    this.stored = null; // the same from storage, when the agents store their own rates
    this.storedAtMs = 0;
    this.plot = null;
    this.poller = new Poller(() => this.refresh(), 5000);
    this.poller.start(); // the header badge is always on
  }

  setVisible(v) {
    this.visible = v;
    this.poller.setPeriod(v ? 2000 : 5000);
    if (v) this.poller.kick();
  }

  async refresh() {
    let st;
    try {
      st = await getJSON(`${AGENT}/api/v1/stats`);
    } catch (exc) {
      this.badge("bad", "ingest: agent unreachable");
      this.els.status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      this.els.status.className = "status error";
      this.els.problem?.set("agent", `${explain(exc, "Collect agent unreachable")}. The figures below are from ${this.lastOkMs ? new Date(this.lastOkMs).toLocaleTimeString() : "nowhere yet"}.`);
      this.els.cards.classList.add("stale-view");
      if (this.visible) await this.readStored();
      return;
    }
    this.lastOkMs = Date.now();
    this.els.problem?.clear("agent");
    this.els.cards.classList.remove("stale-view");
    const rejects = Object.values(st.rejected || {}).reduce((a, b) => a + b, 0);
    const spool = st.spool || {};
    const storage = st.storage || {};
    const failing = storage.failing_for_s !== null && storage.failing_for_s !== undefined;
    const level = failing || !storage.open ? "bad" : st.backpressure ? "warn" : "ok";
    this.badge(level, `${fmt(st.readings_per_s, 0)} readings/s · spool ${fmtInt(spool.pending_readings)} · ${fmtInt(rejects)} rejected`);
    const t = Date.now() / 1000;
    const last = this.history[0].length - 1;
    if (last >= 0 && t - this.history[0][last] < MIN_GAP_S) for (const a of this.history) a.pop();
    this.history[0].push(t);
    this.history[1].push(st.readings_per_s ?? null);
    this.history[2].push(st.written_per_s ?? null);
    if (this.history[0].length > HISTORY) for (const a of this.history) a.shift();
    if (!this.visible) return;
    this.els.status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    this.els.status.className = "status";
    const fill = spool.limit_bytes ? Math.min(100, (100 * spool.bytes) / spool.limit_bytes) : 0;
    const cards = [
      ["Received", `${fmt(st.readings_per_s, 0)} /s`, "readings per second into the spool"],
      ["Written", `${fmt(st.written_per_s, 0)} /s`, "readings per second into storage"],
      ["Spool depth", `${fmtInt(spool.pending_readings)}`, `readings not yet in storage · ${fmtBytes(spool.bytes)} of ${fmtBytes(spool.limit_bytes)}`, fill, spool.pending_readings > 100000 ? "warn" : ""],
      ["Rejected", fmtInt(rejects), "malformed or refused input since start", null, rejects ? "warn" : ""],
      ["Storage", storage.open ? (failing ? `failing ${fmt(storage.failing_for_s, 0)} s` : "ok") : "closed",
        `${storage.backend || "?"}${storage.last_error ? ` · last error: ${storage.last_error}` : ""}`, null, level === "bad" ? "bad" : ""],
      ["Backpressure", st.backpressure ? "on" : "off", "publishers are slowed while the spool is full", null, st.backpressure ? "warn" : ""],
      ["MQTT connections", fmtInt(st.connections), "clients of the built-in endpoint"],
      ["Cached sensors", fmtInt(st.cached_sensors), "sensors with a latest value in memory"],
      ["Stored in total", fmtInt(st.readings_written), `${fmtInt(spool.replayed_readings)} replayed from the spool after a restart`],
    ];
    this.els.cards.replaceChildren(...cards.map(([k, v, title, meter, kind]) => h("div", { class: `card ${kind || ""}`, title },
      h("div", { class: "k" }, k), h("div", { class: "v" }, v),
      meter !== null && meter !== undefined ? h("div", { class: "meter", "aria-hidden": "true" }, h("span", { style: { width: `${meter}%` } })) : null)));
    const rows = Object.entries(st.rejected || {});
    this.els.rejects.tBodies[0].replaceChildren(...(rows.length ? rows.map(([reason, n]) => h("tr", {},
      h("td", {}, reason), h("td", { class: "num" }, fmtInt(n)))) : [h("tr", {}, h("td", { colspan: 2, class: "muted" }, "none"))]));
    await this.readStored();
    this.drawHistory();
  }

  /** The agents' own rates from storage, every 10 s: summed over agents per 5 s. */
  async readStored() {
    if (Date.now() - this.storedAtMs < STORED_EVERY_MS) return;
    this.storedAtMs = Date.now();
    let csv;
    try {
      const { sensors } = await getJSON("/api/v1/sensor-names", { match: STORED[0] });
      if (!sensors.length) { this.stored = null; this.say(); return; }
      csv = await getText("/api/v1/readings", { sensor: STORED, start: `now-${WINDOW_S}s`, format: "csv", time_format: "ns" });
      this.els.problem?.clear("history");
    } catch (exc) {
      this.els.problem?.set("history", `${explain(exc, "Stored rate history unavailable")}. The chart shows what this page sampled.`, "warn");
      this.stored = null;
      this.say();
      return;
    }
    const sums = new Map(); // bucket -> [received, written]
    const agents = new Set();
    for (const line of csv.split("\n").slice(1)) {
      const [name, t, v] = line.split(",");
      if (!v || name === "Sensor") continue;
      agents.add(name.split("/")[3]);
      const b = Math.floor(Number(t) / 1e9 / BUCKET_S) * BUCKET_S;
      const row = sums.get(b) || [0, 0];
      row[name.endsWith("/written_per_s") ? 1 : 0] += Number(v);
      sums.set(b, row);
    }
    const keys = [...sums.keys()].sort((a, b) => a - b);
    this.stored = [keys, keys.map((k) => sums.get(k)[0]), keys.map((k) => sums.get(k)[1])];
    this.say(agents.size);
    this.drawHistory();
  }

  say(agents = 0) {
    this.els.history.textContent = this.stored
      ? `From storage: ${agents} collect agent${agents === 1 ? "" : "s"} (their own sensors /kelvin/collect_agent/…, every ${BUCKET_S} s), summed.`
      : "Sampled by this page since it opened: no collect agent stores its own rates (collect_agent.self_sensors_s).";
  }

  drawHistory() {
    const data = (this.stored && this.stored[0].length ? this.stored : this.history).map((a) => a.slice());
    if (this.plot) {
      this.plot.setData(data);
      return;
    }
    const css = getComputedStyle(document.documentElement);
    const ink = css.getPropertyValue("--text").trim() || "#222";
    const grid = css.getPropertyValue("--line").trim() || "#ddd";
    this.plot = new window.uPlot({
      // The container is empty (0 wide) until uPlot fills it: size from its parent.
      width: Math.max(300, Math.min(900, this.els.chart.parentElement.clientWidth - 18)), height: 170,
      scales: { x: { time: true, range: () => [Date.now() / 1000 - WINDOW_S, Date.now() / 1000] }, y: { range: (u, lo, hi) => [0, Math.max(1, (hi || 0) * 1.15)] } },
      axes: [{ stroke: ink, grid: { stroke: grid } }, { stroke: ink, grid: { stroke: grid }, label: "readings/s", size: 60 }],
      series: [{ label: "time", value: (u, t) => (t === null || t === undefined ? "–" : formatTime(t, false)) }, { label: "received", stroke: "#1f77b4", width: 1.5 }, { label: "written", stroke: "#2ca02c", width: 1.5, dash: [4, 3] }],
    }, data, this.els.chart);
  }

  badge(level, text) {
    this.els.badge.className = `badge ${level}`;
    this.els.badge.querySelector(".text").textContent = text;
  }
}
