// The sensor hierarchy as an ARIA tree: lazy levels, search, keyboard as in the WAI-ARIA tree pattern.
import { getJSON } from "./api.js";
import { debounce, h } from "./util.js";

const MAX_MATCHES = 400;
const NAMES_TTL_MS = 30000;

export class SensorTree {
  /**
   * @param {HTMLUListElement} root  the role=tree list
   * @param {HTMLInputElement} search
   * @param {HTMLElement} status
   * @param {(name: string) => void} onPick  called for Enter/Space/click on a sensor
   */
  constructor(root, search, status, onPick) {
    this.root = root;
    this.search = search;
    this.status = status;
    this.onPick = onPick;
    this.nodes = new Map(); // browse mode: name -> node
    this.colours = new Map(); // charted sensors -> colour
    this.names = null; // all sensor names, for search
    this.namesAt = 0;
    this.query = "";
    root.addEventListener("keydown", (e) => this.onKey(e));
    root.addEventListener("click", (e) => this.onClick(e));
    search.addEventListener("input", debounce(() => this.runSearch(), 200));
    search.addEventListener("keydown", (e) => {
      if (e.key === "ArrowDown" || e.key === "Enter") {
        e.preventDefault();
        this.items()[0]?.focus();
      }
    });
  }

  /** (Re)load the top level and every level that is open; re-render only when something changed. */
  async load() {
    const open = [...this.nodes.values()].filter((n) => n.expanded).map((n) => n.name).sort();
    const before = this.signature();
    const fresh = new Map(); // swapped in at the end: a click meanwhile still finds its node
    const top = { name: "/", label: "/", has_children: true, is_sensor: false, children: null, expanded: true };
    try {
      await this.loadChildren(top, fresh);
      for (const name of open) { // sorted: parents come before their children
        const n = fresh.get(name);
        const parent = name.slice(0, name.lastIndexOf("/")) || "/";
        if (n?.has_children && (parent === "/" || fresh.get(parent)?.expanded)) {
          await this.loadChildren(n, fresh);
          n.expanded = true;
        }
      }
    } catch (exc) {
      if (exc.status !== 404) {
        this.status.textContent = `Cannot list sensors: ${exc.detail || exc.message}`;
        return;
      }
      top.children = [];
    }
    const empty = "No sensors yet.";
    if (!top.children.length) this.status.textContent = empty;
    else if (this.status.textContent === empty || this.status.textContent.startsWith("Cannot")) this.status.textContent = "";
    this.nodes = fresh;
    this.top = top;
    this.names = null;
    if (!this.query && this.signature() !== before) this.render();
  }

  isEmpty() {
    return !this.top?.children?.length;
  }

  signature() {
    return [...this.nodes.values()].map((n) => `${n.name}${n.expanded ? "+" : ""}`).join("\n");
  }

  async loadChildren(node, into = this.nodes) {
    const data = await getJSON("/api/v1/sensors", { prefix: node.name });
    node.children = data.children.map((c) => {
      const n = { ...c, children: c.has_children ? null : [], expanded: false };
      into.set(n.name, n);
      return n;
    });
  }

  /** Mark the charted sensors (aria-selected) with their chart colours. */
  setCharted(colours) {
    this.colours = colours;
    for (const li of this.root.querySelectorAll("[role=treeitem][data-sensor]")) {
      const c = colours.get(li.dataset.name);
      li.setAttribute("aria-selected", c ? "true" : "false");
      const sw = li.querySelector(":scope > .row > .swatch");
      if (sw) sw.style.background = c || "transparent";
    }
  }

  render() {
    const focused = document.activeElement?.closest?.("[role=treeitem]")?.dataset.name;
    const roots = this.query ? this.matchRoots : this.top?.children || [];
    this.root.replaceChildren(...roots.map((n) => this.renderNode(n, 1)));
    const items = this.items();
    const again = focused && items.find((li) => li.dataset.name === focused);
    const current = again || items[0];
    if (current) current.tabIndex = 0;
    if (again && this.root.contains(document.activeElement) === false) again.focus();
  }

  renderNode(n, level) {
    const branch = n.has_children;
    const charted = this.colours.get(n.name);
    const li = h("li", {
      role: "treeitem",
      tabindex: "-1",
      "aria-level": level,
      "aria-expanded": branch ? String(!!n.expanded) : null,
      "aria-selected": n.is_sensor ? String(!!charted) : null,
      dataset: { name: n.name, ...(n.is_sensor ? { sensor: "1" } : {}) },
    });
    const label = this.query ? highlight(n.label, this.query) : n.label;
    li.append(h("div", { class: "row", style: { paddingLeft: `${(level - 1) * 0.9}rem` } },
      h("span", { class: "twisty", "aria-hidden": "true" }, branch ? (n.expanded ? "▾" : "▸") : ""),
      n.is_sensor ? h("span", { class: "swatch", style: { background: charted || "transparent" } }) : null,
      h("span", { class: "name" }, label),
      n.is_virtual ? h("span", { class: "tag", title: "virtual sensor" }, "virtual") : null,
    ));
    if (branch && n.expanded && n.children) {
      li.append(h("ul", { role: "group" }, n.children.map((c) => this.renderNode(c, level + 1))));
    }
    return li;
  }

  /** Visible tree items in document order. */
  items() {
    return [...this.root.querySelectorAll("[role=treeitem]")].filter((li) => li.offsetParent !== null || li === document.activeElement);
  }

  nodeOf(li) {
    return this.query ? this.matchNodes.get(li.dataset.name) : this.nodes.get(li.dataset.name);
  }

  async toggle(li, open) {
    const n = this.nodeOf(li);
    if (!n || !n.has_children) return;
    const want = open ?? !n.expanded;
    if (want === n.expanded) return;
    if (want && n.children === null) {
      li.setAttribute("aria-busy", "true");
      try {
        await this.loadChildren(n);
      } catch (exc) {
        this.status.textContent = `Cannot open ${n.name}: ${exc.detail || exc.message}`;
        return;
      } finally {
        li.removeAttribute("aria-busy");
      }
    }
    n.expanded = want;
    const fresh = this.renderNode(n, Number(li.getAttribute("aria-level")));
    li.replaceWith(fresh);
    this.focus(fresh);
  }

  focus(li) {
    for (const other of this.root.querySelectorAll("[role=treeitem][tabindex='0']")) other.tabIndex = -1;
    li.tabIndex = 0;
    li.focus();
  }

  activate(li) {
    const n = this.nodeOf(li);
    if (!n) return;
    if (n.is_sensor) this.onPick(n.name);
    else this.toggle(li);
  }

  onClick(e) {
    const li = e.target.closest("[role=treeitem]");
    if (!li) return;
    this.focus(li);
    if (e.target.closest(".twisty")) this.toggle(li);
    else this.activate(li);
  }

  onKey(e) {
    const li = e.target.closest("[role=treeitem]");
    if (!li) return;
    const items = this.items();
    const i = items.indexOf(li);
    const n = this.nodeOf(li);
    const parent = li.parentElement.closest("[role=treeitem]");
    let handled = true;
    switch (e.key) {
      case "ArrowDown": if (items[i + 1]) this.focus(items[i + 1]); break;
      case "ArrowUp": if (i > 0) this.focus(items[i - 1]); else this.search.focus(); break;
      case "Home": this.focus(items[0]); break;
      case "End": this.focus(items[items.length - 1]); break;
      case "ArrowRight":
        if (n?.has_children && !n.expanded) this.toggle(li, true);
        else if (n?.expanded) { const first = li.querySelector("[role=treeitem]"); if (first) this.focus(first); }
        break;
      case "ArrowLeft":
        if (n?.has_children && n.expanded) this.toggle(li, false);
        else if (parent) this.focus(parent);
        break;
      case "Enter": case " ": this.activate(li); break;
      default: handled = false;
    }
    if (handled) e.preventDefault();
  }

  async runSearch() {
    const q = this.search.value.trim();
    this.query = q;
    if (!q) {
      this.status.textContent = "";
      this.render();
      return;
    }
    let found;
    try {
      found = q.includes("*") ? await this.matchPattern(q) : (await this.allNames()).filter((n) => n.toLowerCase().includes(q.toLowerCase()));
    } catch (exc) {
      this.status.textContent = `Search failed: ${exc.detail || exc.message}`;
      return;
    }
    if (this.search.value.trim() !== q) return; // typed on meanwhile
    const shown = found.slice(0, MAX_MATCHES);
    this.buildMatchTree(shown);
    this.status.textContent = found.length === 0 ? `Nothing matches “${q}”.`
      : found.length > shown.length ? `${found.length} matches; showing the first ${shown.length}. Refine the search.`
        : `${found.length} match${found.length === 1 ? "" : "es"}.`;
    this.render();
  }

  async matchPattern(q) {
    const pattern = q.startsWith("/") ? q : `/**/${q}`;
    const data = await getJSON("/api/v1/sensor-names", { match: pattern });
    return data.sensors;
  }

  async allNames() {
    if (!this.names || Date.now() - this.namesAt > NAMES_TTL_MS) {
      this.names = (await getJSON("/api/v1/sensor-names", { prefix: "/" })).sensors;
      this.namesAt = Date.now();
    }
    return this.names;
  }

  /** A fully expanded tree holding just the matching sensors and their ancestors. */
  buildMatchTree(found) {
    this.matchNodes = new Map();
    const roots = [];
    for (const full of found) {
      const parts = full.split("/").filter(Boolean);
      let siblings = roots;
      let path = "";
      parts.forEach((part, k) => {
        path += `/${part}`;
        let n = this.matchNodes.get(path);
        if (!n) {
          const known = this.nodes.get(path);
          n = { name: path, label: part, is_sensor: false, is_virtual: known?.is_virtual, has_children: false, children: [], expanded: true };
          this.matchNodes.set(path, n);
          siblings.push(n);
        }
        if (k === parts.length - 1) n.is_sensor = true;
        else n.has_children = true;
        siblings = n.children;
      });
    }
    this.matchRoots = roots;
  }

  /** Reload what is shown (e.g. after a virtual sensor was defined), keeping open levels open. */
  async refresh() {
    await this.load();
    if (this.query) await this.runSearch();
  }
}

function highlight(text, q) {
  if (q.includes("*")) return text;
  const i = text.toLowerCase().indexOf(q.toLowerCase());
  if (i < 0) return text;
  return h("span", {}, text.slice(0, i), h("mark", {}, text.slice(i, i + q.length)), text.slice(i + q.length));
}
