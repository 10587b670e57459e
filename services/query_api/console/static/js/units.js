// Units for the charts: which physical quantity a unit measures, in which base unit, and
// numbers with SI prefixes, so that W and kW share one axis that reads "325 kW".

/** unit -> [quantity, base unit, factor to the base]. */
const UNITS = {
  W: ["power", "W", 1], mW: ["power", "W", 1e-3], kW: ["power", "W", 1e3], MW: ["power", "W", 1e6],
  Wh: ["energy", "Wh", 1], kWh: ["energy", "Wh", 1e3], MWh: ["energy", "Wh", 1e6],
  J: ["energy", "Wh", 1 / 3600], kJ: ["energy", "Wh", 1 / 3.6], MJ: ["energy", "Wh", 1e6 / 3600],
  "°C": ["temperature", "°C", 1], degC: ["temperature", "°C", 1], C: ["temperature", "°C", 1],
  K: ["temperature difference", "K", 1], delta_degC: ["temperature difference", "K", 1],
  Hz: ["frequency", "Hz", 1], kHz: ["frequency", "Hz", 1e3], MHz: ["frequency", "Hz", 1e6],
  GHz: ["frequency", "Hz", 1e9],
  "1/s": ["rate", "/s", 1], "/s": ["rate", "/s", 1],
  s: ["time", "s", 1], ms: ["time", "s", 1e-3], us: ["time", "s", 1e-6], "µs": ["time", "s", 1e-6],
  ns: ["time", "s", 1e-9],
  V: ["voltage", "V", 1], mV: ["voltage", "V", 1e-3], kV: ["voltage", "V", 1e3],
  A: ["current", "A", 1], mA: ["current", "A", 1e-3],
  B: ["data", "B", 1], kB: ["data", "B", 1e3], MB: ["data", "B", 1e6], GB: ["data", "B", 1e9],
  KiB: ["data", "B", 1024], MiB: ["data", "B", 1024 ** 2], GiB: ["data", "B", 1024 ** 3],
  "%": ["percent", "%", 1],
};

/** Where a sensor's readings go: {quantity, base, factor}; unknown units keep their own axis. */
export function dimension(unit) {
  const u = (unit || "").trim();
  if (!u) return { quantity: "ratio", base: "", factor: 1 };
  const known = UNITS[u];
  if (known) return { quantity: known[0], base: known[1], factor: known[2] };
  return { quantity: u, base: u, factor: 1 };
}

const PREFIXES = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""], [1e-3, "m"], [1e-6, "µ"], [1e-9, "n"]];
/** Units that take SI prefixes on an axis (°C, %, ratios do not). */
const PREFIXABLE = new Set(["W", "Wh", "Hz", "/s", "s", "V", "A", "B"]);

/** The prefix for numbers up to `magnitude` in `base`: [factor, prefix]. */
export function prefixFor(magnitude, base) {
  if (!PREFIXABLE.has(base) || !(magnitude > 0)) return [1, ""];
  if (base === "s" && magnitude >= 1) return [1, ""]; // "ks" reads worse than seconds
  for (const p of PREFIXES) if (magnitude >= p[0]) return p;
  return PREFIXES[PREFIXES.length - 1];
}

/** A number with about three significant digits. */
export function sig(x) {
  const a = Math.abs(x);
  if (a === 0) return "0";
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  if (a >= 1) return x.toFixed(2);
  return x.toPrecision(3);
}

/** `v` (in `base`) with the prefix that suits it: 325000 W -> "325 kW". */
export function formatSI(v, base) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  const [f, p] = prefixFor(Math.abs(v), base);
  const sep = base === "%" || base === "°C" ? "" : " ";
  return `${sig(v / f)}${base ? sep + p + base : ""}`.replace(/ $/, "");
}

/** Tick labels of one axis with one prefix for all (the largest tick's): 0, 100, 200 kW. */
export function axisTicks(splits, base) {
  const top = Math.max(...splits.map((v) => Math.abs(v)).filter(Number.isFinite), 0);
  const [f, p] = prefixFor(top, base);
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) / f : 1;
  const digits = step >= 1 || step === 0 ? 0 : Math.min(6, Math.ceil(-Math.log10(step)));
  return { labels: splits.map((v) => (v === null ? "" : (v / f).toFixed(digits))), unit: `${p}${base}` };
}

/** Time of a point for the hover legend: seconds always, milliseconds when points are closer. */
export function formatTime(tsSeconds, withMs) {
  const d = new Date(tsSeconds * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return `${date} ${time}${withMs ? `.${pad(d.getMilliseconds(), 3)}` : ""}`;
}
