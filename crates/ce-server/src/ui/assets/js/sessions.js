// Sessions and memories: the sessions of the key's accounts, a session's archives, and
// each commit's memory diff (what Phase 2 added, updated, superseded or left unchanged).
import * as api from "./api.js";
import { h, fill, when, table, nodeLink, errorBox } from "./dom.js";

export async function sessionsPage(main, params, session) {
  const list = h("section", { "aria-labelledby": "sessions-title" }, h("h2", { id: "sessions-title" }, "Sessions"));
  const detail = h("section", { "aria-labelledby": "session-title", class: "detail" });
  fill(main, h("h1", {}, "Sessions and memories"), h("div", { class: "split" }, list, detail));
  const rows = [];
  for (const acc of session.accounts) {
    try { rows.push(...await api.get("/v1/sessions/ls", { uri: acc })); } catch (e) { list.append(errorBox(e)); }
  }
  list.append(table(`${rows.length} sessions`, ["session", "title", "messages", "archives", "updated"],
    rows.map((s) => [h("a", { href: "#/sessions?uri=" + encodeURIComponent(s.uri) }, s.uri), s.title, String(s.appended),
      String(s.archives), when(s.updated_at_ms)])));
  const show = async (uri) => {
    if (!uri) { fill(detail, h("h2", { id: "session-title" }, "Session"), h("p", { class: "muted" }, "Choose a session.")); return; }
    try { fill(detail, await sessionView(uri)); } catch (e) { fill(detail, h("h2", { id: "session-title" }, uri), errorBox(e)); }
  };
  await show(params.get("uri"));
  return { update: (p) => show(p.get("uri")) };
}

async function sessionView(uri) {
  const s = await api.get("/v1/sessions/show", { uri });
  const archives = await Promise.all(s.archives.map(async (a) => {
    let diff = null;
    if (a.diff) {
      try { diff = JSON.parse((await api.get("/v1/cat", { uri: a.diff, level: 2 })).text); } catch { diff = null; }
    }
    return h("section", { "aria-labelledby": "archive-" + a.number, class: "archive" },
      h("h3", { id: "archive-" + a.number }, `Archive ${a.number}`),
      h("p", {}, nodeLink(a.uri), ` · ${a.messages} messages · ${a.state || "pending"} · extraction ${a.extraction}`,
        a.note ? ` (${a.note})` : ""),
      a.summary ? h("p", {}, a.summary) : "",
      diff ? diffTable(diff, a.diff) : h("p", { class: "muted" }, a.diff ? "the diff could not be read" : "no memory diff yet"));
  }));
  return [
    h("h2", { id: "session-title", class: "uri" }, s.title || s.uri),
    h("p", {}, nodeLink(s.uri), ` · version ${s.version} · ${s.messages.length} live messages · next seq ${s.next_seq}`),
    table("Live messages", ["seq", "role", "content"], s.messages.map((m) => [String(m.seq), m.role, m.content])),
    archives.length ? archives : h("p", { class: "muted" }, "No commit yet."),
  ];
}

function diffTable(d, uri) {
  const c = d.counts || {};
  return h("div", {},
    h("p", {}, "Memory diff ", nodeLink(uri), `: ${c.added ?? 0} added, ${c.updated ?? 0} updated, ${c.superseded ?? 0} superseded, ${c.unchanged ?? 0} unchanged`,
      d.model ? ` (model ${d.model})` : ""),
    table("Changes", ["op", "memory", "before", "after"],
      (d.entries || []).map((e) => [e.op, nodeLink(e.uri), e.before ? e.before.fact : "—", e.after ? e.after.fact : "—"])));
}
