// Indexes page (admin keys): per consumer lag, counts by status, validation state, last
// error and a lag sparkline over the last hour (the server's own samples); dead letters
// with requeue / force-done; the journal's extent; open holds; jobs with cancel / retry.
// Refreshes every 2 s.
import * as api from "./api.js";
import { h, fill, when, table, nodeLink, toast, errorBox } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;

/** A sparkline of `values` (oldest first) as an inline SVG with a text alternative. */
function sparkline(values, label) {
  const w = 160, hgt = 32;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${hgt}`);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const max = Math.max(1, ...values);
  const title = document.createElementNS(SVG, "title");
  title.textContent = values.length
    ? `${label}: ${values.length} samples, max ${max}, now ${values[values.length - 1]}`
    : `${label}: no samples yet`;
  svg.append(title);
  if (values.length) {
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(hgt - 2 - (v / max) * (hgt - 4)).toFixed(1)}`);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", values.length === 1 ? `0,${pts[0].split(",")[1]} ${w},${pts[0].split(",")[1]}` : pts.join(" "));
    svg.append(line);
  }
  return svg;
}

export async function indexesPage(main, _params, session) {
  if (!session.admin) {
    fill(main, h("h1", {}, "Indexes"), h("p", {}, "The index state, dead letters and jobs need an admin key; this key sees one account's nodes only."));
    return null;
  }
  const auto = h("input", { type: "checkbox", id: "auto", checked: true });
  const body = h("div", { id: "indexes-body" });
  const refreshBtn = h("button", { type: "button", onclick: () => refresh() }, "Refresh now");
  fill(main, h("h1", {}, "Indexes"),
    h("p", { class: "actions" }, refreshBtn, h("label", { for: "auto" }, auto, " refresh every 2 s")), body);

  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const [status, history, dead, jobs] = await Promise.all([
        api.get("/v1/status"), api.get("/v1/status/lag"),
        api.get("/v1/outbox/list", { status: "dead", limit: 100 }), api.get("/v1/jobs", { limit: 50 }),
      ]);
      // Re-render only what changed, so a button is not replaced under the pointer or the
      // keyboard focus while nothing happens.
      const parts = [
        ["consumers", [status.consumers, history.samples.length && history.samples[history.samples.length - 1]], () => consumers(status, history)],
        ["dead", dead, () => deadLetters(dead, refresh)],
        ["journal", status.journal, () => journal(status)],
        ["holds", status.holds, () => holds(status)],
        ["jobs", jobs, () => jobsTable(jobs, refresh)],
      ];
      for (const [name, data, render] of parts) {
        const sig = JSON.stringify(data);
        let slot = body.querySelector(`[data-part="${name}"]`);
        if (!slot) { slot = h("div", { "data-part": name }); body.append(slot); }
        if (slot.dataset.sig !== sig) { fill(slot, render()); slot.dataset.sig = sig; }
      }
    } catch (e) {
      fill(body, errorBox(e));
    } finally { busy = false; }
    return null;
  }
  await refresh();
  const timer = setInterval(() => { if (auto.checked) refresh(); }, REFRESH_MS);
  return { stop: () => clearInterval(timer) };
}

function consumers(status, history) {
  const series = (name) => history.samples.map((s) => s.consumers.find((c) => c.consumer === name)?.lag_events ?? 0);
  return h("section", { "aria-labelledby": "consumers-title" },
    h("h2", { id: "consumers-title" }, "Consumers"),
    table(`Lag and deliveries per consumer (sparkline: lag in events over the last ${history.window_seconds / 60} min, sampled every ${history.interval_seconds} s)`,
      ["consumer", "lag events", "lag seconds", "last hour", "pending", "claimed", "retry wait", "done", "dead", "validation", "last error"],
      status.consumers.map((c) => [
        h("strong", {}, c.consumer),
        h("span", { "data-lag": c.consumer }, String(c.lag_events)),
        c.lag_seconds.toFixed(1),
        sparkline(series(c.consumer), c.consumer + " lag"),
        String(c.pending), String(c.claimed), String(c.retry_wait), String(c.done),
        h("span", { "data-dead": c.consumer }, String(c.dead)),
        h("span", { class: "state " + c.validation, title: c.validation_reason }, c.validation,
          c.validation_reason ? h("span", { class: "muted block" }, c.validation_reason) : ""),
        c.last_error ? h("span", {}, h("code", {}, c.last_error.code), " ", c.last_error.message,
          h("span", { class: "muted block" }, `seq ${c.last_error.seq}${c.last_error.dead ? ", dead" : ""}, ${when(c.last_error.at_ms)}`)) : "—",
      ])));
}

async function repair(action, row, refresh) {
  const filter = { consumer: row.delivery.consumer, min_seq: row.event.seq, max_seq: row.event.seq };
  try {
    const r = await api.post("/v1/repair/dead", { action, filter, confirm: action === "force_done" });
    toast(`${action === "requeue" ? "requeued" : "forced done"}: ${r.total} delivery`);
  } catch (e) { toast(`${e.code}: ${e.message}`); }
  await refresh();
}

function deadLetters(rows, refresh) {
  return h("section", { "aria-labelledby": "dead-title" },
    h("h2", { id: "dead-title" }, "Dead letters"),
    table(`${rows.length} dead deliveries (oldest first, at most 100)`,
      ["seq", "consumer", "event", "node", "error", "actions"],
      rows.map((r) => [String(r.event.seq), r.delivery.consumer, r.event.event_type, nodeLink(r.event.uri),
        h("span", {}, h("code", {}, r.delivery.error_code || ""), " ", r.delivery.last_error || ""),
        h("span", { class: "actions" },
          h("button", { type: "button", class: "requeue", "data-seq": r.event.seq, onclick: () => repair("requeue", r, refresh) },
            "Requeue", h("span", { class: "sr-only" }, ` seq ${r.event.seq} ${r.delivery.consumer}`)),
          h("button", { type: "button", class: "danger", onclick: () => {
            if (window.confirm(`Mark seq ${r.event.seq} (${r.delivery.consumer}) done without applying it?`)) repair("force_done", r, refresh);
          } }, "Force done", h("span", { class: "sr-only" }, ` seq ${r.event.seq} ${r.delivery.consumer}`)))])));
}

/** The outbox journal: what it holds, how long it keeps what every consumer applied. */
function journal(status) {
  const j = status.journal || {};
  const held = j.oldest_seq == null ? "empty"
    : `${j.events} events (seq ${j.oldest_seq}–${j.newest_seq}), ${j.deliveries} deliveries`;
  const keep = j.retention_seconds
    ? `what every consumer applied is kept ${j.retention_seconds} s, then pruned`
    : "kept forever (retention 0)";
  const rebuilds = (j.rebuilds_needed || []).length
    ? h("p", { class: "state" }, `Rebuild from the source queued for ${j.rebuilds_needed.join(", ")}: the journal no longer held events they missed.`)
    : "";
  return h("section", { "aria-labelledby": "journal-title" },
    h("h2", { id: "journal-title" }, "Journal"),
    h("p", {}, `${held}; ${keep}${j.pruned_through ? `; pruned through seq ${j.pruned_through}` : ""}.`),
    rebuilds);
}

function holds(status) {
  return h("section", { "aria-labelledby": "holds-title" },
    h("h2", { id: "holds-title" }, "Open holds"),
    table("Subtrees an import keeps locked until it is indexed", ["id", "subtree", "through seq", "age (s)"],
      (status.holds || []).map((x) => [x.id, x.at, String(x.through_seq), String(x.age_seconds)])));
}

async function jobAction(job, action, refresh) {
  try { await api.post(`/v1/jobs/${encodeURIComponent(job.id)}/${action}`, {}); toast(`${action}: ${job.id}`); }
  catch (e) { toast(`${e.code}: ${e.message}`); }
  await refresh();
}

function jobsTable(jobs, refresh) {
  const canCancel = (j) => ["pending", "delayed", "failed", "running"].includes(j.state) && !j.cancel_requested;
  const canRetry = (j) => ["dead", "cancelled"].includes(j.state);
  return h("section", { "aria-labelledby": "jobs-title" },
    h("h2", { id: "jobs-title" }, "Jobs"),
    table("The newest 50 jobs", ["id", "type", "state", "attempts", "error", "updated", "actions"],
      jobs.map((j) => [h("code", {}, j.id), j.job_type, j.state + (j.cancel_requested ? " (cancel requested)" : ""), String(j.attempts),
        j.last_error ? `${j.error_code || ""} ${j.last_error}` : "—", when(j.updated_at_ms),
        h("span", { class: "actions" },
          canCancel(j) ? h("button", { type: "button", onclick: () => jobAction(j, "cancel", refresh) }, "Cancel", h("span", { class: "sr-only" }, " " + j.id)) : "",
          canRetry(j) ? h("button", { type: "button", onclick: () => jobAction(j, "retry", refresh) }, "Retry", h("span", { class: "sr-only" }, " " + j.id)) : "")])));
}
