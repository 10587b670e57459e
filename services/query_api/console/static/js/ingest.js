// Ingest health from the collect agent's /api/v1/stats: header badge, cards, rejects, rate history.
import { AGENT, getJSON } from "./api.js";
import { Poller, fmt, fmtBytes, fmtInt, h } from "./util.js";

const HISTORY = 300; // samples kept for the rate chart
const WINDOW_S = 600; // the rate chart shows the last 10 minutes
const MIN_GAP_S = 1; // two polls closer than this (a view switch) keep one sample

export class IngestView {
  constructor(els) {
    this.els = els; // {badge, status, cards, rejects, chart}
    this.visible = false;
    this.history = [[], [], []]; // time s, received/s, written/s
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
      this.els.status.textContent = `Collect agent unreachable: ${exc.detail || exc.message}`;
      this.els.status.className = "status error";
      return;
    }
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
    this.drawHistory();
  }

  drawHistory() {
    const data = this.history.map((a) => a.slice());
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
      series: [{ label: "time" }, { label: "received", stroke: "#1f77b4", width: 1.5 }, { label: "written", stroke: "#2ca02c", width: 1.5, dash: [4, 3] }],
    }, data, this.els.chart);
  }

  badge(level, text) {
    this.els.badge.className = `badge ${level}`;
    this.els.badge.querySelector(".text").textContent = text;
  }
}
