// Talking to the query API (and, through its same-origin proxy, the allocator and collect agent).

const TOKEN_KEY = "kelvin.console.token";

export const ALLOCATOR = "/console/api/allocator";
export const AGENT = "/console/api/agent";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An HTTP answer other than 2xx, with the API's `{error, detail, position}` when it sent one. */
export class ApiError extends Error {
  constructor(status, body, url) {
    const detail = body && typeof body === "object" ? body.detail || body.error : body;
    super(`${status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    this.status = status;
    this.body = body;
    this.url = url;
  }

  get detail() {
    const d = this.body && typeof this.body === "object" ? this.body.detail : null;
    return typeof d === "string" ? d : this.message;
  }

  get position() {
    return this.body && typeof this.body === "object" ? this.body.position : undefined;
  }
}

function url(path, params) {
  if (!params) return path;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
  }
  const qs = q.toString();
  return qs ? `${path}?${qs}` : path;
}

async function request(method, path, { params, body, accept = "application/json", extra = {} } = {}) {
  const headers = { Accept: accept, ...extra };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const target = url(path, params);
  let res;
  try {
    res = await fetch(target, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (exc) {
    throw new ApiError(0, { error: "network", detail: `${path}: ${exc.message}` }, target);
  }
  if (!res.ok) {
    let detail;
    try { detail = await res.json(); } catch { detail = res.statusText; }
    // 401: no or an unknown token; 403: a token of too low a role (e.g. read, to define a sensor).
    if (res.status === 401 || res.status === 403) {
      window.dispatchEvent(new CustomEvent("kelvin:auth", { detail: { status: res.status, reason: detail?.detail } }));
    }
    throw new ApiError(res.status, detail, target);
  }
  return res;
}

export async function getJSON(path, params) {
  return (await request("GET", path, { params })).json();
}

export async function getText(path, params) {
  return (await request("GET", path, { params, accept: "text/csv" })).text();
}

export async function sendJSON(method, path, body, params, headers) {
  return (await request(method, path, { params, body, extra: headers })).json();
}

/** How the query API authenticates: {mode: "token"|"none", open_roles: [...], role: null|"read"|...}. */
export function authState() {
  return getJSON("/console/auth");
}

/** One sensor's readings: {sensor, unit, start_ns, end_ns, count, timestamps_ns, values}. */
export function readings(sensor, start, end, interval) {
  return getJSON("/api/v1/readings", {
    sensor, start, end, format: "json", interval, agg: interval ? "avg" : undefined,
  });
}

/**
 * The newest reading of every sensor matching `pattern` since `start`, from one CSV
 * query: Map name -> {tsNs, value}. An empty Map when nothing matches (no 404).
 */
export async function latestMatching(pattern, start) {
  const { sensors } = await getJSON("/api/v1/sensor-names", { match: pattern });
  if (!sensors.length) return new Map();
  return latestOf([pattern], start);
}

/** The newest reading of each of `names` (existing sensors or patterns) since `start`. */
export async function latestOf(names, start) {
  const out = new Map();
  if (!names.length) return out;
  const csv = await getText("/api/v1/readings", {
    sensor: names, start, format: "csv", time_format: "ns",
  });
  // Rows are Sensor,Time,Value in time order per sensor: the last row of each wins.
  for (const line of csv.split("\n").slice(1)) {
    if (!line) continue;
    const a = line.indexOf(","), b = line.indexOf(",", a + 1);
    const v = line.slice(b + 1);
    if (v === "" || line.startsWith("Sensor,")) continue;
    out.set(line.slice(0, a), { tsNs: Number(line.slice(a + 1, b)), value: Number(v) });
  }
  return out;
}

/** Nanoseconds since the epoch as an exact decimal string (JS numbers lose the last digits). */
export function nsString(ms) {
  return (BigInt(Math.round(ms)) * 1000000n).toString();
}
