// Tree page: browse ctx:// lazily (L0 beside each node, filter by context type), open a
// node (layers with provenance, metadata, relations, version, index records) and edit it
// (a layer or the metadata with an optimistic version check, move, remove).
import * as api from "./api.js";
import { h, fill, when, table, nodeLink, toast, errorBox } from "./dom.js";

const PAGE = 200;
const LAYERS = [
  { level: 0, name: "L0 abstract", field: "abstract", prov: "abstract" },
  { level: 1, name: "L1 overview", field: "overview", prov: "overview" },
  { level: 2, name: "L2 content", field: "content", prov: null },
];

function lastSegment(uri) {
  const rest = uri.replace(/^ctx:\/\//, "");
  return rest.split("/").filter(Boolean).pop() || "ctx://";
}

/** A layer's provenance as words: user, derived (by whom), pending, failed, or none. */
function provenance(origin) {
  if (!origin || origin.origin === "none") return "no text given (fallback applies)";
  if (origin.origin === "user") return "user";
  if (origin.origin === "derived") return "derived by " + origin.generator;
  if (origin.origin === "pending") return "derived: pending";
  if (origin.origin === "failed") return "derivation failed: " + origin.message;
  return origin.origin;
}

export async function treePage(main, params) {
  const filter = h("select", { id: "type-filter" },
    h("option", { value: "" }, "all types"),
    ["memory", "resource", "skill", "session"].map((t) => h("option", { value: t }, t)));
  const tree = h("ul", { role: "tree", "aria-labelledby": "tree-title", class: "tree" });
  const detail = h("section", { class: "detail", "aria-labelledby": "node-title", id: "node" },
    h("h2", { id: "node-title" }, "Node"), h("p", { class: "muted" }, "Choose a node in the tree."));
  fill(main,
    h("h1", { class: "sr-only" }, "Tree"),
    h("div", { class: "split" },
      h("section", { class: "browser", "aria-labelledby": "tree-title" },
        h("h2", { id: "tree-title" }, "ctx://"),
        h("p", {}, h("label", { for: "type-filter" }, "Context type "), filter),
        tree),
      detail));

  let selected = params.get("uri");

  async function loadChildren(li, uri, group, offset = 0) {
    const page = await api.get("/v1/children", { uri, context_type: filter.value, offset, limit: PAGE });
    for (const c of page.children) group.append(item(c, Number(li ? li.getAttribute("aria-level") : 0) + 1));
    const shown = offset + page.children.length;
    if (shown < page.total) {
      const more = h("li", { role: "none" }, h("button", {
        type: "button", class: "more",
        onclick: async (ev) => { ev.currentTarget.parentElement.remove(); await loadChildren(li, uri, group, shown); },
      }, `Load more (${shown} of ${page.total} shown)`));
      group.append(more);
    }
    if (page.total === 0 && !li) group.append(h("li", { role: "none", class: "muted" }, "nothing here"));
  }

  function item(stat, level) {
    const hasChildren = stat.children > 0;
    const label = h("span", { class: "row" },
      h("span", { class: "name" }, lastSegment(stat.uri)),
      h("span", { class: "tag" }, stat.kind === "leaf" ? stat.context_type : stat.kind),
      h("span", { class: "l0" }, stat.abstract || ""));
    const li = h("li", {
      role: "treeitem", tabindex: "-1", "aria-level": level, "data-uri": stat.uri,
      "aria-selected": stat.uri === selected ? "true" : "false",
    }, label);
    if (hasChildren) li.setAttribute("aria-expanded", "false");
    label.addEventListener("click", () => { focusItem(li); open(li); });
    return li;
  }

  async function toggle(li, expand) {
    if (!li.hasAttribute("aria-expanded")) return;
    const isOpen = li.getAttribute("aria-expanded") === "true";
    if (expand === isOpen) return;
    if (!expand) {
      li.setAttribute("aria-expanded", "false");
      li.querySelector(":scope > ul")?.remove();
      return;
    }
    li.setAttribute("aria-expanded", "true");
    const group = h("ul", { role: "group" });
    li.append(group);
    try { await loadChildren(li, li.dataset.uri, group); } catch (e) { group.append(h("li", { role: "none" }, errorBox(e))); }
  }

  function visible() {
    return [...tree.querySelectorAll('[role="treeitem"]')].filter((x) => x.offsetParent !== null);
  }

  function focusItem(li) {
    for (const x of tree.querySelectorAll('[role="treeitem"][tabindex="0"]')) x.setAttribute("tabindex", "-1");
    li.setAttribute("tabindex", "0");
    li.focus();
  }

  function open(li) {
    location.hash = "#/tree?uri=" + encodeURIComponent(li.dataset.uri);
    if (li.getAttribute("aria-expanded") === "false") toggle(li, true);
  }

  tree.addEventListener("keydown", (ev) => {
    const li = ev.target.closest('[role="treeitem"]');
    if (!li) return;
    const items = visible();
    const i = items.indexOf(li);
    const parent = li.parentElement.closest('[role="treeitem"]');
    let handled = true;
    switch (ev.key) {
      case "ArrowDown": if (items[i + 1]) focusItem(items[i + 1]); break;
      case "ArrowUp": if (items[i - 1]) focusItem(items[i - 1]); break;
      case "Home": focusItem(items[0]); break;
      case "End": focusItem(items[items.length - 1]); break;
      case "ArrowRight":
        if (li.getAttribute("aria-expanded") === "false") toggle(li, true);
        else if (li.getAttribute("aria-expanded") === "true" && items[i + 1]) focusItem(items[i + 1]);
        break;
      case "ArrowLeft":
        if (li.getAttribute("aria-expanded") === "true") toggle(li, false);
        else if (parent) focusItem(parent);
        break;
      case "Enter": case " ": open(li); break;
      default: handled = false;
    }
    if (handled) { ev.preventDefault(); ev.stopPropagation(); }
  });

  async function reload() {
    fill(tree);
    try {
      await loadChildren(null, "ctx://", tree);
      const first = tree.querySelector('[role="treeitem"]');
      if (first) {
        first.setAttribute("tabindex", "0");
        // The first screen: the accounts (a tenant: its own) opened one level.
        for (const acc of tree.querySelectorAll(':scope > [role="treeitem"]')) await toggle(acc, true);
      }
    } catch (e) { tree.append(h("li", { role: "none" }, errorBox(e))); }
  }
  filter.addEventListener("change", reload);
  await reload();
  if (selected) await showNode(detail, selected);

  return {
    update(p) {
      selected = p.get("uri");
      for (const x of tree.querySelectorAll('[role="treeitem"]')) {
        x.setAttribute("aria-selected", x.dataset.uri === selected ? "true" : "false");
      }
      if (selected) showNode(detail, selected);
    },
  };
}

/** The node page: its layers, metadata, relations, index records, and the edit forms. */
async function showNode(detail, uri) {
  fill(detail, h("h2", { id: "node-title" }, uri), h("p", { class: "muted" }, "loading…"));
  let stat, layers, rel, records;
  try {
    [stat, layers, rel, records] = await Promise.all([
      api.get("/v1/stat", { uri }),
      Promise.all(LAYERS.map((l) => api.get("/v1/cat", { uri, level: l.level }))),
      api.get("/v1/relations", { uri }),
      api.get("/v1/records", { uri }),
    ]);
  } catch (e) {
    fill(detail, h("h2", { id: "node-title" }, uri), errorBox(e));
    return;
  }
  const again = () => showNode(detail, uri);
  const status = h("div", { class: "edit-status", "aria-live": "polite" });
  fill(detail,
    h("h2", { id: "node-title", class: "uri" }, uri),
    h("dl", { class: "facts" },
      fact("Version", h("span", { id: "node-version" }, String(stat.version))),
      fact("Kind", stat.kind), fact("Context type", stat.context_type),
      fact("Category", stat.category || "—"), fact("Owner space", stat.owner_space),
      fact("Children", String(stat.children)), fact("Updated", when(stat.updated_at_ms)),
      fact("Content hash", h("code", {}, stat.content_hash.slice(0, 16)))),
    status,
    LAYERS.map((l, i) => layerSection(stat, l, layers[i], status, again)),
    metaSection(stat, status, again),
    h("section", { "aria-labelledby": "rel-title" },
      h("h3", { id: "rel-title" }, "Relations"),
      table("Outgoing", ["to", "type", "weight", "reason"],
        rel.outgoing.map((e) => [nodeLink(e.to_uri), e.relation_type, String(e.weight), e.reason])),
      table("Incoming", ["from", "type", "weight", "reason"],
        rel.incoming.map((e) => [nodeLink(e.from_uri), e.relation_type, String(e.weight), e.reason]))),
    h("section", { "aria-labelledby": "rec-title" },
      h("h3", { id: "rec-title" }, "Index records"),
      table("Records per index, compared with the source (version " + records.version + ")",
        ["index", "level", "state", "indexed version", "characters"],
        records.indexes.flatMap((ix) => ix.available
          ? ix.records.map((r) => [ix.index, "L" + r.level, h("span", { class: "state " + r.state }, r.state),
            r.indexed_version === null ? "—" : String(r.indexed_version),
            r.indexed_chars === null ? "—" : String(r.indexed_chars)])
          : [[ix.index, "—", "index not open on this server", "—", "—"]]))),
    moveSection(stat, status),
    removeSection(stat, status));
}

function fact(name, value) {
  return h("div", {}, h("dt", {}, name), h("dd", {}, value));
}

/** A put that changes one thing, fenced by the version the page showed. */
async function save(stat, fields, status, again) {
  try {
    const out = await api.post("/v1/put", { uri: stat.uri, mode: "merge", expect_version: stat.version, ...fields });
    toast(out.changed ? `saved: version ${out.version}` : "no change");
    await again();
  } catch (e) {
    if (e.code === "version_conflict") {
      fill(status, h("div", { class: "conflict", role: "alert" },
        h("p", {}, h("strong", {}, "Not saved: the node changed since you opened it. ")),
        h("p", {}, e.message),
        h("p", {}, "Your text is still in the form. Reload the node to see its current version, then apply your change again."),
        h("button", { type: "button", onclick: again }, "Reload node")));
    } else {
      fill(status, errorBox(e));
    }
    throw e;
  }
}

function layerSection(stat, l, cat, status, again) {
  const id = "layer-" + l.level;
  const origin = l.prov ? stat.provenance?.[l.prov] : null;
  const text = h("pre", { class: "layer", id: id + "-text" }, cat.text || "(empty)");
  const box = h("div", {}, text);
  const edit = h("button", { type: "button", id: id + "-edit" }, "Edit " + l.name.split(" ")[0]);
  const done = () => { fill(box, text); edit.hidden = false; edit.focus(); };
  edit.addEventListener("click", () => {
    edit.hidden = true;
    const area = h("textarea", { id: id + "-input", rows: l.level === 2 ? 12 : 4 });
    area.value = cat.text;
    const saveBtn = h("button", { type: "button", id: id + "-save" }, "Save");
    saveBtn.addEventListener("click", async () => {
      saveBtn.disabled = true;
      try {
        await save(stat, { [l.field]: area.value }, status, again);
        const row = document.querySelector(`[data-uri="${CSS.escape(stat.uri)}"] > .row .l0`);
        if (row && l.level === 0) row.textContent = area.value;
      } catch { saveBtn.disabled = false; }
    });
    fill(box, h("label", { for: id + "-input" }, "New " + l.name + " (saved only if the node is still at version " + stat.version + ")"),
      area, h("div", { class: "actions" }, saveBtn,
        h("button", { type: "button", onclick: done }, "Cancel")));
    area.focus();
  });
  return h("section", { "aria-labelledby": id + "-title", class: "layer-box" },
    h("h3", { id: id + "-title" }, l.name, " ",
      l.prov ? h("span", { class: "prov", id: id + "-prov" }, provenance(origin)) : ""),
    cat.fallback ? h("p", { class: "muted" }, `empty: search indexes the first ${cat.fallback.max_chars} characters of L${cat.fallback.level} instead`) : "",
    box, h("div", { class: "actions" }, edit));
}

function metaSection(stat, status, again) {
  const box = h("div", {}, h("pre", { class: "layer" }, JSON.stringify(stat.meta, null, 2)));
  const edit = h("button", { type: "button", id: "meta-edit" }, "Edit metadata");
  edit.addEventListener("click", () => {
    edit.hidden = true;
    const area = h("textarea", { id: "meta-input", rows: 8 });
    area.value = JSON.stringify(stat.meta, null, 2);
    const err = h("div", { "aria-live": "polite" });
    const saveBtn = h("button", { type: "button" }, "Save metadata");
    saveBtn.addEventListener("click", async () => {
      let meta;
      try {
        meta = JSON.parse(area.value);
        if (typeof meta !== "object" || meta === null || Array.isArray(meta)) throw new Error("metadata must be a JSON object");
      } catch (e) { fill(err, errorBox({ code: "invalid_field", message: "meta: " + e.message })); return; }
      // Merge mode: keys left out are removed with null.
      for (const k of Object.keys(stat.meta || {})) if (!(k in meta)) meta[k] = null;
      try { await save(stat, { meta }, status, again); } catch { /* shown */ }
    });
    fill(box, h("label", { for: "meta-input" }, "Metadata (a JSON object)"), area, err,
      h("div", { class: "actions" }, saveBtn, h("button", { type: "button", onclick: again }, "Cancel")));
    area.focus();
  });
  return h("section", { "aria-labelledby": "meta-title" }, h("h3", { id: "meta-title" }, "Metadata"), box,
    h("div", { class: "actions" }, edit));
}

function moveSection(stat, status) {
  const input = h("input", { id: "move-to", type: "text", value: stat.uri, spellcheck: "false" });
  const form = h("form", { class: "inline" },
    h("label", { for: "move-to" }, "Move to"), input, h("button", { type: "submit" }, "Move"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api.post("/v1/mv", { from: stat.uri, to: input.value.trim() });
      toast("moved to " + input.value.trim());
      location.hash = "#/tree?uri=" + encodeURIComponent(input.value.trim());
    } catch (e) { fill(status, errorBox(e)); }
  });
  return h("section", { "aria-labelledby": "move-title" }, h("h3", { id: "move-title" }, "Move"), form);
}

function removeSection(stat, status) {
  const box = h("div", { "aria-live": "polite" });
  const btn = h("button", { type: "button", class: "danger", id: "rm-start" }, "Remove…");
  btn.addEventListener("click", async () => {
    let count;
    try { count = (await api.get("/v1/tree", { uri: stat.uri })).length - 1; } catch (e) { fill(box, errorBox(e)); return; }
    const confirm = h("button", { type: "button", class: "danger", id: "rm-confirm" },
      count > 0 ? `Remove it and ${count} nodes below` : "Remove it");
    confirm.addEventListener("click", async () => {
      try {
        await api.post("/v1/rm", { uri: stat.uri, recursive: count > 0, expect_version: stat.version });
        toast("removed " + stat.uri);
        location.hash = "#/tree?uri=" + encodeURIComponent(stat.parent_uri);
      } catch (e) { fill(status, errorBox(e)); }
    });
    fill(box, h("p", { role: "alert" }, `${stat.uri} has ${count} node${count === 1 ? "" : "s"} below it. Removing deletes ${count + 1} node${count ? "s" : ""}.`),
      h("div", { class: "actions" }, confirm, h("button", { type: "button", onclick: () => fill(box) }, "Keep it")));
    confirm.focus();
  });
  return h("section", { "aria-labelledby": "rm-title" }, h("h3", { id: "rm-title" }, "Remove"), box, h("div", { class: "actions" }, btn));
}
