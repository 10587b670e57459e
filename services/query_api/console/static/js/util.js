// Small helpers shared by the console's views: DOM building, formatting, colours, polling.

/** Build an element: h("li", {class: "x", onclick: f}, "text", child). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** Same as h() for SVG elements. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** A number with fixed decimals, or an en dash when missing. */
export function fmt(x, digits = 1) {
  return x === null || x === undefined || !Number.isFinite(x) ? "–" : x.toFixed(digits);
}

/** A count with thousands separators. */
export function fmtInt(x) {
  return x === null || x === undefined || !Number.isFinite(x) ? "–" : Math.round(x).toLocaleString("en-US");
}

export function fmtBytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** Age of a nanosecond timestamp, in words. */
export function fmtAge(tsNs, nowMs = Date.now()) {
  const s = Math.max(0, nowMs / 1000 - tsNs / 1e9);
  if (s < 90) return `${s.toFixed(0)} s ago`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

/** Series colours (distinguishable, also in dark mode). */
export const PALETTE = [
  "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
  "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
];

/** A stable colour for a job id. */
export function jobColour(job) {
  let hsh = 0;
  for (const ch of String(job)) hsh = (hsh * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${(hsh * 137.508) % 360} 70% 38%)`;
}

/** The colour a fraction `f` (0..1) of the way along the colour `stops`. */
export function ramp(stops, f) {
  const x = Math.min(1, Math.max(0, f)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  return mix(stops[i], stops[i + 1], x - i);
}

/** Black or white text for legibility on a background colour. */
export function inkOn(hex) {
  const [r, g, b] = rgb(hex);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b > 140 ? "#111" : "#fff";
}

function rgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

function mix(a, b, f) {
  const [ar, ag, ab] = rgb(a);
  const [br, bg, bb] = rgb(b);
  const c = (x, y) => Math.round(x + (y - x) * f).toString(16).padStart(2, "0");
  return `#${c(ar, br)}${c(ag, bg)}${c(ab, bb)}`;
}

/**
 * Run `task` now and then every `periodMs` while started; never two at once,
 * paused while the page is hidden (a background tab costs nothing).
 */
export class Poller {
  constructor(task, periodMs) {
    this.task = task;
    this.periodMs = periodMs;
    this.timer = null;
    this.running = false;
    this.busy = false;
    this.again = false;
    document.addEventListener("visibilitychange", () => {
      if (this.running && !document.hidden) this.kick();
    });
  }

  start() {
    if (this.running) return;
    this.running = true;
    this.kick();
  }

  stop() {
    this.running = false;
    clearTimeout(this.timer);
    this.timer = null;
  }

  setPeriod(ms) {
    this.periodMs = ms;
  }

  /** Run the task as soon as the one in flight (if any) is done. */
  async kick() {
    clearTimeout(this.timer);
    if (this.busy) { this.again = true; return; }
    this.busy = true;
    try {
      await this.task();
    } finally {
      this.busy = false;
      if (this.again) { this.again = false; this.kick(); return; }
      if (this.running && !document.hidden) this.timer = setTimeout(() => this.kick(), this.periodMs);
    }
  }
}

export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}
