// Search playground: query, mode and filters; each hit with its score, level and (hybrid)
// its rank in each mode; the candidates hydration dropped, with the reason.
import * as api from "./api.js";
import { h, fill, table, nodeLink, errorBox } from "./dom.js";

function field(id, label, input) {
  input.id = id;
  input.name = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), input);
}

function select(options) {
  return h("select", {}, options.map(([v, t]) => h("option", { value: v }, t)));
}

const REASONS = {
  gone: "the source holds no node at this URI (removed or moved)",
  changed: "the node changed since this record was indexed",
};

export async function searchPage(main) {
  const query = h("input", { type: "search", required: true, autocomplete: "off" });
  const mode = select([["", "default"], ["hybrid", "hybrid"], ["vector", "vector"], ["keyword", "keyword"], ["hierarchical", "hierarchical"]]);
  const topK = h("input", { type: "number", min: "1", max: "100", value: "10" });
  const level = select([["", "any level"], ["0", "L0"], ["1", "L1"], ["2", "L2"]]);
  const type = select([["", "any type"], ["memory", "memory"], ["resource", "resource"], ["skill", "skill"], ["session", "session"]]);
  const subtree = h("input", { type: "text", placeholder: "ctx://account/…", spellcheck: "false" });
  const out = h("div", { id: "search-results", "aria-live": "polite" });
  const form = h("form", { class: "search-form", role: "search", "aria-label": "Search the context" },
    field("q", "Query", query), field("mode", "Mode", mode), field("top-k", "Top k", topK),
    field("level", "Level", level), field("ctype", "Context type", type), field("subtree", "Subtree", subtree),
    h("div", { class: "field" }, h("button", { type: "submit" }, "Search")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { query: query.value, top_k: Number(topK.value) || 10 };
    if (mode.value) body.mode = mode.value;
    if (level.value) body.level = Number(level.value);
    if (type.value) body.context_type = type.value;
    if (subtree.value.trim()) body.subtree = subtree.value.trim();
    if (mode.value !== "hierarchical") body.explain = true;
    fill(out, h("p", { class: "muted" }, "searching…"));
    try {
      const r = await api.post("/v1/search", body);
      fill(out, render(r));
    } catch (e) { fill(out, errorBox(e)); }
  });
  fill(main, h("h1", {}, "Search playground"), form, out);
  query.focus();
}

function render(r) {
  const hybrid = r.mode_used === "hybrid";
  const lag = (r.lag || []).filter((l) => l.events > 0);
  const headers = ["#", "node", "score", "level", ...(hybrid ? ["vector rank", "keyword rank"] : []), "abstract"];
  const hits = r.hits.map((x, i) => [String(i + 1), nodeLink(x.uri), x.score.toFixed(4), "L" + x.level,
    ...(hybrid ? [rank(x.ranks?.vector), rank(x.ranks?.keyword)] : []), x.abstract]);
  return [
    h("p", { class: "summary" },
      `mode ${r.mode_used || "hierarchical"}`, r.fusion ? ` (${r.fusion})` : "",
      ` · ${r.hits.length} hits`, r.candidates !== undefined ? ` from ${r.candidates} candidates` : "",
      ` · ${r.dropped_by_hydration} dropped by hydration`,
      r.timings ? ` · ${r.timings.total_ms} ms` : ""),
    r.notice ? h("p", { class: "notice" }, r.notice) : "",
    lag.length ? h("p", { class: "notice" }, "Indexes still catching up: ",
      lag.map((l) => `${l.index} ${l.events}${l.capped ? "+" : ""} changes (oldest ${l.oldest_age_seconds.toFixed(1)} s)`).join(", ")) : "",
    table("Hits", headers, hits),
    r.dropped ? table("Dropped by hydration", ["node", "level", "index", "score", "indexed version", "current version", "reason"],
      r.dropped.map((d) => [d.uri, "L" + d.level, d.index, d.score.toFixed(4),
        d.indexed_version === null ? "—" : String(d.indexed_version),
        d.current_version === null ? "—" : String(d.current_version), REASONS[d.reason] || d.reason]))
      : h("p", { class: "muted" }, r.dropped_by_hydration ? "" : "No candidate was dropped by hydration."),
  ];
}

function rank(n) { return n === null || n === undefined ? "—" : String(n); }
