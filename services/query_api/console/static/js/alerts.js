// Alerts evaluated by the query API's rules (/prometheus/api/v1/alerts and /rules): header badge and table.
import { getJSON } from "./api.js";
import { explain } from "./status.js";
import { Poller, h } from "./util.js";

const API = "/prometheus/api/v1";
const ORDER = { firing: 0, pending: 1 };

export class AlertsView {
  constructor(els, onUpdate) {
    this.els = els; // {badge, status, table, empty, rules, problem}
    this.onUpdate = onUpdate; // (alerts) => ..., e.g. the hall view's list of firing alerts
    this.visible = false;
    this.poller = new Poller(() => this.refresh(), 15000);
    this.poller.start(); // the header badge is always on
  }

  setVisible(v) {
    this.visible = v;
    this.poller.setPeriod(v ? 5000 : 15000);
    if (v) this.poller.kick();
  }

  async refresh() {
    let alerts, groups;
    try {
      [alerts, groups] = await Promise.all([
        getJSON(`${API}/alerts`).then((b) => b.data.alerts),
        getJSON(`${API}/rules`).then((b) => b.data.groups),
      ]);
    } catch (exc) {
      this.badge("bad", "alerts: unavailable");
      this.els.status.textContent = `Alerts unavailable: ${exc.detail || exc.message}`;
      this.els.problem?.set("alerts", explain(exc, "Alerts unavailable"));
      return;
    }
    this.els.problem?.clear("alerts");
    this.onUpdate?.(alerts);
    const firing = alerts.filter((a) => a.state === "firing").length;
    const rules = groups.reduce((n, g) => n + g.rules.length, 0);
    const broken = groups.flatMap((g) => g.rules).filter((r) => r.health === "err");
    this.badge(firing ? "bad" : broken.length ? "warn" : "ok",
      rules ? `${firing} alert${firing === 1 ? "" : "s"} firing` : "no alert rules");
    if (!this.visible) return;
    this.els.status.textContent = `${rules} rules in ${groups.length} groups · updated ${new Date().toLocaleTimeString()}`;
    alerts.sort((a, b) => (ORDER[a.state] ?? 2) - (ORDER[b.state] ?? 2) || a.activeAt.localeCompare(b.activeAt));
    const body = this.els.table.tBodies[0];
    body.replaceChildren(...alerts.map((a) => h("tr", { class: a.state },
      h("td", {}, h("span", { class: `pill ${a.state}` }, a.state)),
      h("td", {}, a.labels.alertname || ""),
      h("td", {}, a.labels.severity || ""),
      h("td", {}, a.annotations.summary || ""),
      h("td", { class: "small muted" }, Object.entries(a.labels)
        .filter(([k]) => k !== "alertname" && k !== "severity").map(([k, v]) => `${k}=${v}`).join(", ")),
      h("td", { class: "small" }, new Date(a.activeAt).toLocaleString()),
    )));
    this.els.empty.hidden = alerts.length > 0;
    this.els.rules.replaceChildren(...broken.map((r) => h("li", {}, `${r.name}: ${r.lastError}`)));
  }

  badge(level, text) {
    this.els.badge.className = `badge ${level}`;
    this.els.badge.querySelector(".text").textContent = text;
  }
}
