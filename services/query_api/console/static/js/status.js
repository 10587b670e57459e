// What went wrong, said where the operator looks: one panel per view, and a banner while the
// query API's storage is down (its /readyz), so no view goes blank without a word.
import { getJSON } from "./api.js";
import { Poller, h } from "./util.js";

/** An error as an operator reads it: which part failed and why, from the API's detail. */
export function explain(exc, what) {
  const detail = exc?.detail || exc?.message || String(exc);
  const status = exc?.status;
  if (status === 0) return `${what}: the query API does not answer (${detail}). Is Kelvin running?`;
  if (status === 503 && exc.body?.error === "storage_unavailable") return `${what}: storage is unreachable — ${detail}`;
  if (status === 503) return `${what}: not available right now — ${detail}`;
  if (status === 502 || status === 504) return `${what}: ${detail}`; // the console proxy names the upstream
  if (status === 401 || status === 403) return `${what}: ${detail} (Token, top right)`;
  return `${what}: ${detail}`;
}

/** One view's problem panel: shown with a message, hidden when all is well again. */
export class Problem {
  constructor(el) {
    this.el = el;
    this.parts = new Map(); // key -> message: a view may have several independent troubles
  }

  set(key, message, kind = "error") {
    if (message) this.parts.set(key, { message, kind });
    else this.parts.delete(key);
    this.render();
  }

  clear(key) { this.set(key, null); }

  get active() { return this.parts.size > 0; }

  render() {
    const items = [...this.parts.values()];
    this.el.hidden = items.length === 0;
    this.el.className = `problem ${items.some((p) => p.kind === "error") ? "error" : "warn"}`;
    this.el.replaceChildren(...items.map((p) => h("p", {}, p.message)));
  }
}

/** The query API's readiness (``/readyz``: storage reachable), polled; a banner while not. */
export class Readiness {
  constructor(banner) {
    this.banner = banner;
    this.ready = true;
    this.reason = "";
    this.listeners = [];
    this.poller = new Poller(() => this.check(), 5000);
    this.poller.start();
  }

  onChange(fn) { this.listeners.push(fn); }

  async check() {
    let ready, reason;
    try {
      const r = await fetch("/readyz", { cache: "no-store" });
      const body = await r.json().catch(() => ({}));
      ready = r.ok;
      reason = body.reason || r.statusText;
    } catch (exc) {
      ready = false;
      reason = `the query API does not answer (${exc.message})`;
    }
    this.banner.hidden = ready;
    if (!ready) {
      this.banner.replaceChildren(h("strong", {}, "Storage unreachable: "),
        `${reason}. Readings cannot be read or stored; every view shows what it had last, and says so.`);
    }
    if (ready !== this.ready || reason !== this.reason) {
      this.ready = ready;
      this.reason = reason;
      for (const fn of this.listeners) fn(ready, reason);
    }
  }
}

/** What the query API says about this installation (``/console/info``), asked once. */
let info = null;
export async function consoleInfo() {
  if (info === null) {
    try { info = await getJSON("/console/info"); } catch { return { profile: "unknown" }; }
  }
  return info;
}
