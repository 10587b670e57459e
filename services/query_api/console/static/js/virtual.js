// Virtual sensors: list, define (checked first with dry_run), delete, and chart.
import { ApiError, getJSON, sendJSON } from "./api.js";
import { explain } from "./status.js";
import { h } from "./util.js";

export class VirtualView {
  constructor(els, { onChart, onChanged }) {
    this.els = els; // {table, empty, form, check, message, title}
    this.onChart = onChart;
    this.onChanged = onChanged;
    els.form.addEventListener("submit", (e) => { e.preventDefault(); this.submit(false); });
    els.check.addEventListener("click", () => this.submit(true));
    els.form.addEventListener("reset", () => {
      this.els.title.textContent = "Define a virtual sensor";
      this.message("");
    });
  }

  setVisible(v) {
    if (v) this.list();
  }

  async list() {
    let defs;
    try {
      defs = (await getJSON("/api/v1/virtual")).virtual;
      this.els.problem?.clear("list");
    } catch (exc) {
      this.els.problem?.set("list", `${explain(exc, "Cannot list virtual sensors")}. The table shows what it had.`);
      return;
    }
    const body = this.els.table.tBodies[0];
    body.replaceChildren(...defs.map((d) => h("tr", { dataset: { name: d.name } },
      h("td", {}, h("strong", {}, d.name), d.description ? h("div", { class: "muted small" }, d.description) : null),
      h("td", { class: "expr" }, d.expression),
      h("td", {}, d.unit || "–"),
      h("td", { class: "num" }, d.interval_ms ? `${d.interval_ms} ms` : "–"),
      h("td", { class: "actions" },
        h("button", { type: "button", class: "small", onclick: () => this.onChart([d.name]), "aria-label": `Chart ${d.name}` }, "Chart"),
        " ",
        h("button", { type: "button", class: "small quiet", onclick: () => this.edit(d), "aria-label": `Edit ${d.name}` }, "Edit"),
        " ",
        h("button", { type: "button", class: "small quiet", onclick: () => this.remove(d.name), "aria-label": `Delete ${d.name}` }, "Delete"),
      ),
    )));
    this.els.table.hidden = defs.length === 0;
    this.els.empty.hidden = defs.length !== 0;
  }

  edit(d) {
    const f = this.els.form.elements;
    f.name.value = d.name;
    f.expression.value = d.expression;
    f.unit.value = d.declared_unit || "";
    f.interval_ms.value = d.interval_source === "declared" ? d.interval_ms : "";
    f.description.value = d.description || "";
    this.els.title.textContent = `Edit ${d.name}`;
    this.message("");
    f.expression.focus();
  }

  async remove(name) {
    if (!window.confirm(`Delete virtual sensor ${name} and its stored results?`)) return;
    try {
      await sendJSON("DELETE", `/api/v1/virtual/${encodePath(name)}`);
      this.message(`Deleted ${name}.`, "ok");
      await this.list();
      this.onChanged();
    } catch (exc) {
      this.message(describe(exc, ""), "error");
    }
  }

  async submit(dryRun) {
    const f = this.els.form.elements;
    const name = f.name.value.trim();
    const expression = f.expression.value.trim();
    if (!name.startsWith("/") || name.length < 2) {
      this.message("Name: a sensor name such as /hall/it_power (starts with '/').", "error");
      f.name.focus();
      return;
    }
    if (!expression) {
      this.message("Expression: required, e.g. sum(\"/hall/*/*/*/power\")", "error");
      f.expression.focus();
      return;
    }
    const body = { expression, description: f.description.value.trim() };
    if (f.unit.value.trim()) body.unit = f.unit.value.trim();
    if (f.interval_ms.value) body.interval_ms = Number(f.interval_ms.value);
    // Redefining drops the stored results (and a configured sensor comes back at the next
    // start): ask first. If-None-Match keeps a definition made meanwhile from being replaced.
    let headers = { "If-None-Match": "*" };
    if (!dryRun) {
      const old = await this.existing(name);
      if (old && differs(old, body)) {
        const configured = old.configured ? "\nIt is configured: the next start of the query API defines it again as configured." : "";
        if (!window.confirm(`Virtual sensor ${name} exists:\n  ${old.expression}\nRedefine it as\n  ${expression}?\nIts stored results are dropped.${configured}`)) {
          this.message(`Not saved: ${name} keeps its definition.`, "warn");
          return;
        }
        headers = {};
      }
    }
    try {
      const d = await sendJSON("PUT", `/api/v1/virtual/${encodePath(name)}`, body, dryRun ? { dry_run: "true" } : undefined, dryRun ? {} : headers);
      const what = `${d.name}: unit ${d.unit || "none"}, grid ${d.interval_ms} ms (${d.interval_source}), inputs ${d.inputs.join(", ")}`;
      const warn = d.warnings?.length ? `\nWarnings:\n${d.warnings.map((w) => `• ${w}`).join("\n")}` : "";
      if (dryRun) {
        this.message(`Valid — ${what}${warn}`, warn ? "warn" : "ok");
        return;
      }
      this.message(`Saved ${what}${warn}`, warn ? "warn" : "ok");
      this.els.message.append(" ", h("button", { type: "button", class: "small", onclick: () => this.onChart([d.name]) }, "Chart it"));
      this.els.title.textContent = `Edit ${d.name}`;
      await this.list();
      this.onChanged();
    } catch (exc) {
      this.message(describe(exc, expression), "error");
    }
  }

  /** The stored definition of `name`, or null (none, or it cannot be read: the PUT decides).
   * From the list, which answers 200 either way (a 404 would be an error in the console). */
  async existing(name) {
    try {
      const found = (await getJSON("/api/v1/virtual")).virtual.find((d) => d.name === name);
      return found ? await getJSON(`/api/v1/virtual/${encodePath(name)}`) : null;
    } catch {
      return null;
    }
  }

  message(text, kind = "") {
    this.els.message.textContent = text;
    this.els.message.className = `message ${kind}`;
  }
}

/** An error as the user needs it: the API's detail and, for a syntax error, a caret under it. */
function describe(exc, expression) {
  if (!(exc instanceof ApiError)) return String(exc);
  if (exc.status === 401) return "The query API needs the admin token to change virtual sensors (Token, top right).";
  if (exc.status === 403) return "This token may not change virtual sensors: enter the admin token (Token, top right).";
  const pos = exc.position;
  if (Number.isInteger(pos) && expression && !exc.detail.includes("\n")) return `${exc.detail}\n${expression}\n${" ".repeat(Math.max(0, pos - 1))}^`;
  return exc.detail;
}

/** Whether saving `body` would change the stored definition `old`. */
function differs(old, body) {
  return old.expression !== body.expression || (old.declared_unit || null) !== (body.unit || null)
    || (body.interval_ms !== undefined && old.interval_ms !== body.interval_ms)
    || (old.description || "") !== (body.description || "");
}

function encodePath(name) {
  return name.replace(/^\/+/, "").split("/").map(encodeURIComponent).join("/");
}
