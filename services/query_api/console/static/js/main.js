// Console entry point: wires the views together, routes on the address bar's #fragment.
import { ALLOCATOR, authState, getJSON, setToken, token } from "./api.js";
import { Problem, Readiness, consoleInfo } from "./status.js";
import { Poller } from "./util.js";
import { AlertsView } from "./alerts.js";
import { ChartPanel } from "./chart.js";
import { HallView } from "./hall.js";
import { IngestView } from "./ingest.js";
import { SensorTree } from "./tree.js";
import { VirtualView } from "./virtual.js";

const $ = (id) => document.getElementById(id);
const VIEWS = ["charts", "hall", "virtual", "ingest", "alerts"];
const TREE_REFRESH_MS = 15000;
const TREE_EMPTY_RETRY_MS = 2000; // a fresh installation: show the first sensors as they arrive

let current = null;

const chart = new ChartPanel({
  chart: $("chart"), chosen: $("chosen"), empty: $("chart-empty"), status: $("chart-status"),
  range: $("range"), custom: $("custom-range"), start: $("range-start"), end: $("range-end"),
  apply: $("range-apply"), live: $("live"), reset: $("zoom-reset"), clear: $("chart-clear"),
  csv: $("chart-csv"),
}, () => {
  tree.setCharted(chart.colours());
  if (current === "charts") writeHash();
}, new Problem($("chart-problem")));

const tree = new SensorTree($("tree"), $("tree-search"), $("tree-status"), (name) => {
  chart.toggle(name);
  if (current !== "charts") go("charts");
});

function showCharts(names) {
  chart.add(...names);
  go("charts");
}

const hall = new HallView({
  plan: $("hall-plan"), totals: $("hall-totals"), legend: $("hall-legend"), node: $("hall-node"),
  jobs: $("hall-jobs"), status: $("hall-status"), name: $("hall-name"),
  modes: document.querySelectorAll("input[name=hall-colour]"), problem: $("hall-problem"),
  alerts: $("hall-alerts"), none: $("hall-none"), summary: $("hall-summary"), body: $("hall-body"),
  policies: $("hall-policies"),
}, showCharts);

const virtual = new VirtualView({
  table: $("virtual-table"), empty: $("virtual-empty"), form: $("virtual-form"),
  check: $("virtual-check"), message: $("virtual-message"), title: $("virtual-form-title"),
  problem: new Problem($("virtual-problem")),
}, { onChart: showCharts, onChanged: () => tree.refresh() });

const ingest = new IngestView({
  badge: $("ingest-badge"), status: $("ingest-status"), cards: $("ingest-cards"),
  rejects: $("ingest-rejects"), chart: $("ingest-chart"), history: $("ingest-history"),
  problem: new Problem($("ingest-problem")),
});

const alerts = new AlertsView({
  badge: $("alerts-badge"), status: $("alerts-status"), table: $("alerts-table"),
  empty: $("alerts-empty"), rules: $("alerts-rules"), problem: new Problem($("alerts-problem")),
}, (alerts) => hall.setAlerts(alerts));

// Storage down: a banner over every view, and the views look again once it is back.
const readiness = new Readiness($("storage-banner"));
readiness.onChange((ready) => { if (ready) { tree.refresh(); route(); } });

function writeHash() {
  const st = chart.state();
  const q = new URLSearchParams();
  for (const n of st.s) q.append("s", n);
  q.set("r", st.r);
  history.replaceState(null, "", `#/charts?${q}`);
}

function sameState(params) {
  const st = chart.state();
  return params.getAll("s").join("\n") === st.s.join("\n") && (params.get("r") || st.r) === st.r;
}

function go(view) {
  if (view === "charts") writeHash();
  else location.hash = `#/${view}`;
  route();
}

function route() {
  const m = /^#\/([a-z]+)(?:\?(.*))?$/.exec(location.hash);
  const view = m && VIEWS.includes(m[1]) ? m[1] : "charts";
  const params = new URLSearchParams(m?.[2] || "");
  if (view === "charts" && (params.has("s") || params.has("r")) && !sameState(params)) chart.restore(params);
  if (view !== current) {
    for (const v of VIEWS) $(`view-${v}`).hidden = v !== view;
    for (const a of document.querySelectorAll(".views a")) {
      if (a.dataset.view === view) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    current = view;
  }
  chart.setVisible(view === "charts");
  hall.setVisible(view === "hall");
  virtual.setVisible(view === "virtual");
  ingest.setVisible(view === "ingest");
  alerts.setVisible(view === "alerts");
  if (view === "charts") writeHash();
}

function setupToken() {
  const dialog = $("token-dialog");
  const input = $("token-input");
  const open = (why) => {
    if (dialog.open) return;
    $("token-why").textContent = why;
    input.value = token();
    dialog.showModal();
  };
  $("token-button").addEventListener("click", () => open("Sent as a bearer token with every request from this tab; kept only in this tab. A read token shows everything; defining virtual sensors needs the admin token."));
  window.addEventListener("kelvin:auth", (e) => open(e.detail?.status === 403
    ? `This token may not do that: ${e.detail.reason || "it needs a higher role"}. Enter the admin token to continue.`
    : "The query API refused a request without a valid token. Enter it to continue."));
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") setToken(input.value.trim());
    if (dialog.returnValue === "clear") setToken("");
    showAuth();
    if (dialog.returnValue !== "cancel") { tree.refresh(); route(); }
  });
  showAuth();
}

/** The insecure banner when auth is off, and the role of the token this tab holds. */
async function showAuth() {
  let st;
  try { st = await authState(); } catch { return; }
  $("insecure-banner").hidden = st.mode !== "none";
  const button = $("token-button");
  button.textContent = st.role ? `Token ✓ ${st.role}` : token() ? "Token ✗" : "Token";
  button.title = st.role ? `This tab sends a ${st.role} token` : token() ? "The token this tab holds is not accepted" : "Bearer token for protected APIs";
}

function setupToast() {
  const toast = $("toast");
  let timer = null;
  const show = (msg) => {
    toast.textContent = msg;
    toast.hidden = false;
    clearTimeout(timer);
    timer = setTimeout(() => { toast.hidden = true; }, 8000);
  };
  window.addEventListener("unhandledrejection", (e) => show(`Unexpected error: ${e.reason?.message || e.reason}`));
  window.addEventListener("error", (e) => show(`Unexpected error: ${e.message}`));
}

async function boot() {
  setupToast();
  setupToken();
  window.addEventListener("hashchange", route);
  if (!location.hash) {
    // Land on the hall when there is one to see (the demo, or a hall file), else on the charts.
    try {
      const [hallDoc, info] = await Promise.all([getJSON(`${ALLOCATOR}/api/v1/hall`), consoleInfo()]);
      const real = info.profile === "demo" || hallDoc.model?.source !== "reference";
      history.replaceState(null, "", real ? "#/hall" : "#/charts");
    } catch {
      history.replaceState(null, "", "#/charts");
    }
  }
  route();
  const treePoller = new Poller(async () => {
    await tree.load();
    treePoller.setPeriod(tree.isEmpty() ? TREE_EMPTY_RETRY_MS : TREE_REFRESH_MS);
  }, TREE_EMPTY_RETRY_MS);
  treePoller.start();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
