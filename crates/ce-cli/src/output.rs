//! Rendering: every command produces a [`Rendered`] holding both its JSON document and its
//! human text; `main` prints one of them.

use std::collections::BTreeMap;
use std::io::{self, Write};

use ce_core::{
    Classify, CtxUri, Delivery, Level, LevelSource, Millis, OutboxEvent, RelationEdge, rfc3339,
};
use ce_index::relation::Direction;
use ce_index::worker::dry_run::DryRunReport;
use ce_retrieval::{
    HierarchicalResponse, IndexLag, ModeRanks, RelatedResponse, SearchMode, SearchResponse,
    lag_summary,
};
use ce_server::MigrateReport;
use ce_server::status::{DrainProgress, DrainReport, ReindexReport, Status};
use ce_server::wire::CatAnswer;
use ce_store::layout::{ExportReport, ImportReport};
use ce_store::{ConsumerStats, DeliveryRow, NodeStat, Relations, WriteOutcome};
use serde::Serialize;
use serde_json::Value;

use crate::error::{CliError, Result};

/// A command's answer in both forms.
#[derive(Debug)]
pub struct Rendered {
    /// The `--json` document.
    pub json: Value,
    /// The human-readable text (ends with a newline unless empty).
    pub human: String,
}

impl Rendered {
    /// Nothing at all, not even with `--json`: for `ce mcp`, whose stdout is the protocol.
    pub fn nothing() -> Self {
        Rendered {
            json: Value::Null,
            human: String::new(),
        }
    }

    /// Pairs the JSON of `value` with `human`.
    pub fn new(value: &impl Serialize, human: String) -> Result<Self> {
        let json = serde_json::to_value(value).map_err(|e| CliError::Other(e.into()))?;
        Ok(Rendered { json, human })
    }
}

/// Writes `text` to stdout; a closed pipe (`ce tree ... | head`) is not an error.
pub fn print_stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Prints `err` on stderr: `error: <message> [<code>]`, or a JSON object with `--json`.
pub fn print_error(err: &CliError, json: bool) {
    let code = err.code_text();
    let text = if json {
        let body = serde_json::json!({
            "code": code,
            "message": err.to_string(),
            "retryable": err.is_retryable(),
        });
        format!("{body}\n")
    } else {
        format!("error: {} [{code}]\n", escape_controls(&err.to_string()))
    };
    // Nothing sensible is left to do if stderr itself is gone.
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`, …): an error names what
/// was wrong, a file name with a newline included, and still prints as the one documented
/// line (found by `cli::fuzz_args`: `--abstract-file` of a name with a newline).
fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `ce migrate`.
pub fn migrate(r: &MigrateReport) -> String {
    let schema = if r.from == r.to {
        format!("{} (up to date)", r.to)
    } else {
        format!("{} -> {} ({} applied)", r.from, r.to, r.to - r.from)
    };
    kv(&[
        ("backend", r.backend.clone()),
        ("location", r.location.clone()),
        ("schema", schema),
    ])
}

/// Formats a JSON document for printing.
pub fn json_text(value: &Value) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    s.push('\n');
    s
}

/// Aligns `rows` under `headers` in columns separated by two spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(c);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(c.chars().count());
            l.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Aligns `key  value` lines.
pub fn kv(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n"))
        .collect()
}

/// A byte count, e.g. `812 B`, `1.4 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

fn time(ms: Millis) -> String {
    rfc3339(ms)
}

fn opt_time(ms: Option<Millis>) -> String {
    ms.map_or_else(|| "-".to_owned(), rfc3339)
}

fn layer_sizes(b: [u64; 3]) -> String {
    format!("L0 {}, L1 {}, L2 {}", bytes(b[0]), bytes(b[1]), bytes(b[2]))
}

fn meta_text(meta: &ce_core::Meta) -> String {
    if meta.is_empty() {
        "-".to_owned()
    } else {
        serde_json::to_string(meta).unwrap_or_default()
    }
}

/// The outcome of a write (put, rm, mv, link, unlink): the number of events it appended, and
/// their ids when `verbose` (a put that creates ancestors or an `rm -r` appends many).
pub fn outcome(o: &WriteOutcome, verbose: bool) -> String {
    let events = match (o.event_ids.len(), verbose) {
        (0, _) => "0".to_owned(),
        (n, true) => format!("{n}: {}", o.event_ids.join(" ")),
        (n, false) => n.to_string(),
    };
    let mut pairs = vec![
        ("uri", o.uri.to_string()),
        ("version", o.version.to_string()),
        ("changed", o.changed.to_string()),
        ("nodes", o.nodes_affected.to_string()),
        ("events", events),
        ("trace_id", o.trace_id.clone()),
    ];
    if !o.layers_removed.is_empty() {
        let layers: Vec<String> = o
            .layers_removed
            .iter()
            .map(|&l| format!("L{l} ({})", layer_name(l)))
            .collect();
        pairs.push((
            "removed",
            format!(
                "{}: replace mode keeps only the layers given (--mode merge keeps the others)",
                layers.join(", ")
            ),
        ));
    }
    kv(&pairs)
}

/// The name of a layer, as its `put` option says it.
fn layer_name(level: Level) -> &'static str {
    match level {
        Level::L0 => "abstract",
        Level::L1 => "overview",
        Level::L2 => "content",
    }
}

/// `ce cat`: the layer's text, newline-terminated.
pub fn cat_text(a: &CatAnswer) -> String {
    newline_terminated(&a.text)
}

/// What `ce cat` says on stderr when the layer is empty (stdout stays the exact text).
pub fn cat_note(a: &CatAnswer) -> Option<String> {
    if !a.text.is_empty() {
        return None;
    }
    let l = a.level;
    if a.pending {
        return Some(format!(
            "L{l} ({}) of {} is not derived yet: the derive consumer writes it (ce worker), and \
             search has no L{l} record of it until then\n",
            layer_name(l),
            a.uri
        ));
    }
    Some(match a.fallback {
        Some(LevelSource { level, max_chars }) => {
            let part = max_chars.map_or_else(
                || format!("L{level}"),
                |n| format!("the first {n} characters of L{level}"),
            );
            format!(
                "L{l} ({}) of {} is empty; search uses {part} ({}) for it\n",
                layer_name(l),
                a.uri,
                layer_name(level)
            )
        }
        None if l == Level::L2 => format!(
            "L2 (content) of {} is empty; L2 has no fallback, so search has no L2 record of it\n",
            a.uri
        ),
        None => format!(
            "L{l} ({}) of {} is empty, and so is every layer it falls back to: search has no L{l} record of it\n",
            layer_name(l),
            a.uri
        ),
    })
}

/// Prints [`cat_note`] on stderr, in human mode.
pub fn print_cat_note(a: &CatAnswer, json: bool) {
    if !json && let Some(note) = cat_note(a) {
        print_stderr(&note);
    }
}

/// Writes `text` on stderr (notes and progress: stdout stays the answer, clean for pipes).
pub fn print_stderr(text: &str) {
    // Nothing sensible is left to do if stderr itself is gone.
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

fn newline_terminated(text: &str) -> String {
    let mut t = text.to_owned();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t
}

/// The first line of `text`, at most `max` characters (with `…` when cut).
pub fn one_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None if text.trim().lines().count() > 1 => format!("{line} …"),
        None => line.to_owned(),
    }
}

/// `ce search`: the notice of a fallback first, then (hybrid) how the scores were fused, the
/// hits, a summary, and a line when an index read lags behind (`catch_up` says what to do).
pub fn search(r: &SearchResponse, catch_up: &str) -> String {
    let mut out = String::new();
    if let Some(n) = &r.notice {
        out.push_str(&format!("notice: {n}\n"));
    }
    let hybrid = r.mode_used == SearchMode::Hybrid;
    if hybrid {
        out.push_str(&format!(
            "hybrid search: reciprocal rank fusion ({}), SCORE = Σ weight / (k + rank); \
             VECTOR and KEYWORD are the ranks in each mode\n",
            r.fusion.as_deref().unwrap_or("rrf")
        ));
    }
    let rank = |n: Option<usize>| n.map_or_else(|| "-".to_owned(), |n| format!("#{n}"));
    let rows: Vec<Vec<String>> = r
        .hits
        .iter()
        .map(|h| {
            let mut row = vec![format!("{:.4}", h.score)];
            if hybrid {
                let ranks = h.ranks.unwrap_or(ModeRanks {
                    vector: None,
                    keyword: None,
                });
                row.push(rank(ranks.vector));
                row.push(rank(ranks.keyword));
            }
            row.extend([
                format!("L{}", h.level),
                h.uri.to_string(),
                one_line(&h.abstract_text, 100),
            ]);
            row
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no hits\n");
    } else if hybrid {
        out.push_str(&table(
            &["SCORE", "VECTOR", "KEYWORD", "LEVEL", "URI", "ABSTRACT"],
            &rows,
        ));
    } else {
        out.push_str(&table(&["SCORE", "LEVEL", "URI", "ABSTRACT"], &rows));
    }
    out.push_str(&format!(
        "({} from {}, {} dropped by hydration, {} search, {} ms)\n",
        count(r.hits.len(), "hit"),
        count(r.candidates, "candidate"),
        r.dropped_by_hydration,
        r.mode_used,
        r.timings.total_ms
    ));
    push_lag(&mut out, &r.lag, catch_up);
    out
}

/// What the lag line of a local command suggests.
pub const LOCAL_CATCH_UP: &str = "run `ce worker --once` or keep `ce serve` running";
/// What the lag line of a `--server` command suggests.
pub const REMOTE_CATCH_UP: &str = "the server's workers have not applied them yet (`ce status`)";

/// The lag line (after the answer, on stdout) when an index read lags behind.
fn push_lag(out: &mut String, lag: &[IndexLag], catch_up: &str) {
    if let Some(summary) = lag_summary(lag) {
        out.push_str(&format!("{summary} — {catch_up}\n"));
    }
}

/// `n` and `unit`, plural unless `n` is 1: `1 hit`, `2 hits`.
fn count(n: usize, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// `ce search --mode hierarchical`.
pub fn hierarchical(r: &HierarchicalResponse, catch_up: &str) -> String {
    let mut out = String::new();
    if r.hits.is_empty() {
        out.push_str("no hits\n");
    }
    for h in &r.hits {
        out.push_str(&format!(
            "{:.4}  {}  {}\n",
            h.score,
            h.uri,
            one_line(&h.abstract_text, 100)
        ));
        for step in &h.path {
            out.push_str(&format!(
                "        in {} ({:.4}): {}\n",
                step.uri,
                step.score,
                one_line(&step.abstract_text, 80)
            ));
        }
    }
    let s = &r.stats;
    out.push_str(&format!(
        "({}, {} containers expanded, {} index searches{}, {} dropped by hydration, {} ms)\n",
        count(r.hits.len(), "hit"),
        s.containers_expanded,
        s.index_searches,
        if s.converged { ", converged" } else { "" },
        r.dropped_by_hydration,
        s.total_ms
    ));
    push_lag(&mut out, &r.lag, catch_up);
    out
}

/// The size of an index whose consumer may not be configured.
fn size(n: Option<u64>, unit: &str) -> String {
    n.map_or_else(|| "not configured".into(), |n| format!("{n} {unit}"))
}

/// `ce status`.
pub fn status(s: &Status) -> String {
    let ready = if s.ready {
        "yes".to_owned()
    } else {
        format!("no: {}", s.not_ready.join("; "))
    };
    let model = s
        .model
        .as_ref()
        .map_or_else(|| "not loaded".to_owned(), |m| m.key());
    let index_model = s
        .index_model
        .as_ref()
        .map_or_else(|| "unbound".to_owned(), |m| m.key());
    let cache = s.embed_cache.map_or_else(
        || "-".to_owned(),
        |c| {
            let mut text = format!(
                "{} vectors of this model ({} in all, {:.1} MiB)",
                c.entries,
                c.all_entries,
                c.bytes as f64 / (1024.0 * 1024.0)
            );
            if let Some(n) = c.counters {
                text.push_str(&format!(
                    "; this server: {} hits, {} misses, {} model calls, {} texts embedded",
                    n.hits, n.misses, n.provider_calls, n.texts_embedded
                ));
            }
            text
        },
    );
    let mut out = kv(&[
        ("ready", ready),
        ("data_dir", s.data_dir.clone()),
        ("store", format!("{} {}", s.store_backend, s.store_location)),
        ("model", model),
        (
            "vector_index",
            format!(
                "{} records, model {index_model} ({})",
                s.index_records, s.vector_destination
            ),
        ),
        ("keyword_index", size(s.keyword_records, "records")),
        ("relation_index", size(s.relation_records, "edges")),
        (
            "workers",
            if s.workers == 0 {
                "none in this process (`ce worker --once` indexes what is pending; `ce serve` \
                 or `ce worker` keeps indexing)"
                    .to_owned()
            } else {
                format!("{} ({})", s.workers, s.worker_consumers.join(", "))
            },
        ),
        ("embed_cache", cache),
        ("jobs", crate::jobs::status_line(&s.jobs)),
        (
            "derive",
            s.derive
                .as_ref()
                .map_or_else(|| "off (no derive consumer)".to_owned(), derive_line),
        ),
        (
            "sessions",
            if s.sessions.extraction {
                format!(
                    "memory extraction on ({}); keep last {}; same memory: {}",
                    s.sessions.model.as_deref().unwrap_or(""),
                    s.sessions.keep_last,
                    s.sessions.merge_rule
                )
            } else {
                format!(
                    "memory extraction off: {}; keep last {}",
                    s.sessions.extraction_off, s.sessions.keep_last
                )
            },
        ),
        ("knowledge_bases", kb_line(&s.kb)),
        ("journal", journal_line(&s.journal)),
        (
            "holds",
            if s.holds.is_empty() {
                "none".to_owned()
            } else {
                s.holds
                    .iter()
                    .map(|h| format!("{} ({}, {} s)", h.at, h.id, h.age_seconds))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
    ]);
    out.push('\n');
    let rows: Vec<Vec<String>> = s
        .consumers
        .iter()
        .map(|c| {
            vec![
                c.consumer.clone(),
                c.pending.to_string(),
                c.claimed.to_string(),
                c.retry_wait.to_string(),
                c.done.to_string(),
                c.dead.to_string(),
                c.lag_events.to_string(),
                format!("{:.1}", c.lag_seconds),
                c.validation.as_str().to_owned(),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "CONSUMER",
            "PENDING",
            "CLAIMED",
            "RETRY_WAIT",
            "DONE",
            "DEAD",
            "LAG_EVENTS",
            "LAG_SECONDS",
            "VALIDATION",
        ],
        &rows,
    ));
    for c in s.consumers.iter().filter(|c| !c.applied) {
        out.push_str(&format!("{}: {}\n", c.consumer, c.validation_reason));
    }
    for c in &s.consumers {
        if let Some(e) = &c.last_error {
            let state = if e.dead { "dead" } else { "retrying" };
            out.push_str(&format!(
                "{}: last error at seq {} ({}, {state}): {}: {}\n",
                c.consumer, e.seq, e.event_id, e.code, e.message
            ));
        }
    }
    if !s.kb.bases.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> =
            s.kb.bases
                .iter()
                .map(|b| {
                    vec![
                        b.name.clone(),
                        b.status.as_str().to_owned(),
                        crate::kb::counts_line(&b.counts),
                    ]
                })
                .collect();
        out.push_str(&table(&["BASE", "STATUS", "ITEMS"], &rows));
        for b in &s.kb.bases {
            for f in &b.recent_failures {
                out.push_str(&format!(
                    "{}: item {} ({}) failed at {}: {}: {}\n",
                    b.name,
                    f.id,
                    f.node_uri,
                    rfc3339(f.at_ms),
                    f.error.code,
                    one_line(&f.error.message, 200)
                ));
            }
        }
    }
    out
}

/// `ce status`'s journal line: what the outbox journal holds and how long it keeps it.
fn journal_line(j: &ce_server::status::JournalStatus) -> String {
    let e = &j.extent;
    let mut out = match (e.oldest_seq, e.newest_seq) {
        (Some(a), Some(b)) => format!(
            "{} (seq {a}–{b}), {}",
            count(e.events as usize, "event"),
            if e.deliveries == 1 {
                "1 delivery".to_owned()
            } else {
                format!("{} deliveries", e.deliveries)
            }
        ),
        _ => "empty".to_owned(),
    };
    out.push_str(&if j.retention_seconds == 0 {
        "; kept forever (index.outbox.journal_retention_seconds = 0)".to_owned()
    } else {
        format!(
            "; what every consumer applied is kept {}",
            human_seconds(u64::from(j.retention_seconds))
        )
    });
    if e.pruned_through > 0 {
        out.push_str(&format!("; pruned through seq {}", e.pruned_through));
    }
    if !j.rebuilds_needed.is_empty() {
        out.push_str(&format!(
            "; rebuild from the source queued for {} (the journal no longer held what it missed)",
            j.rebuilds_needed.join(", ")
        ));
    }
    out
}

/// `s` seconds as the largest whole unit that divides it (`1 day`, `90 min`, `45 s`).
fn human_seconds(s: u64) -> String {
    if s.is_multiple_of(86_400) {
        count((s / 86_400) as usize, "day")
    } else if s.is_multiple_of(3_600) {
        count((s / 3_600) as usize, "hour")
    } else if s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// The `knowledge_bases` line of `ce status`: bases, items under way and failed, and the
/// workflow's jobs not ended.
fn kb_line(k: &ce_server::status::KnowledgeStatus) -> String {
    if k.bases.is_empty() {
        return "none".to_owned();
    }
    let count = |pick: fn(ce_store::ItemStatus) -> bool| -> u64 {
        k.bases
            .iter()
            .flat_map(|b| b.counts.iter())
            .filter(|(st, _)| pick(**st))
            .map(|(_, n)| n)
            .sum()
    };
    let jobs: Vec<String> = k
        .active_jobs
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    format!(
        "{} ({} items under way, {} failed); jobs under way: {}",
        k.bases.len(),
        count(ce_store::ItemStatus::is_active),
        count(|st| st == ce_store::ItemStatus::Failed),
        if jobs.is_empty() {
            "none".to_owned()
        } else {
            jobs.join(", ")
        }
    )
}

/// A progress line of a drain: events and their deliveries (one per consumer) separately.
pub fn drain_progress(label: &str, p: &DrainProgress) -> String {
    format!(
        "{label}: {} events, {} deliveries done, {} retried, {} dead ({:.0} ms)\n",
        p.events, p.succeeded, p.retried, p.failed, p.elapsed_ms
    )
}

/// `ce worker --once` (and the indexing step of the demo and of a local reindex). An event
/// has one delivery per consumer: both are counted, and both rates given.
pub fn drain(d: &DrainReport) -> String {
    let p = &d.progress;
    let per_second = |n: u64| {
        if p.elapsed_ms > 0.0 {
            n as f64 * 1000.0 / p.elapsed_ms
        } else {
            0.0
        }
    };
    let mut pairs = vec![
        ("events", p.events.to_string()),
        (
            "deliveries",
            format!(
                "{} done, {} retried, {} dead (one per event and consumer)",
                p.succeeded, p.retried, p.failed
            ),
        ),
        ("batches", p.batches.to_string()),
        ("workers", d.workers.to_string()),
        (
            "took",
            format!(
                "{:.0} ms ({:.0} events/s, {:.0} deliveries/s)",
                p.elapsed_ms,
                per_second(p.events),
                per_second(p.succeeded)
            ),
        ),
    ];
    let remaining: Vec<String> = d
        .remaining
        .iter()
        .map(|r| {
            format!(
                "{}: {} pending, {} claimed, {} retry_wait, {} dead ({})",
                r.consumer,
                r.pending,
                r.claimed,
                r.retry_wait,
                r.dead,
                r.validation.as_str()
            )
        })
        .collect();
    if !remaining.is_empty() {
        pairs.push(("remaining", remaining.join("; ")));
    }
    kv(&pairs)
}

/// `ce worker --dry-run`.
pub fn dry_runs(reports: &[DryRunReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let actions: Vec<String> = r
            .actions
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        let mut pairs = vec![
            ("consumer", r.consumer.clone()),
            (
                "events",
                format!(
                    "{}{} (through seq {})",
                    r.events,
                    if r.truncated { "+, truncated" } else { "" },
                    r.through_seq.map_or_else(|| "-".into(), |s| s.to_string())
                ),
            ),
            (
                "would",
                if actions.is_empty() {
                    "change nothing".into()
                } else {
                    actions.join(", ")
                },
            ),
        ];
        if let Some(s) = &r.spend {
            pairs.push((
                "would spend",
                format!(
                    "{} derivations by {}: about {} tokens in, at most {} out",
                    s.derivations, s.generator, s.tokens_in, s.tokens_out
                ),
            ));
        }
        for (kind, uris) in &r.samples {
            pairs.push(("sample", format!("{kind}: {}", uris.join(" "))));
        }
        for e in &r.errors {
            pairs.push(("error", e.clone()));
        }
        pairs.push(("valid", r.valid.to_string()));
        out.push_str(&kv(&pairs));
        out.push('\n');
    }
    out
}

/// `ce reindex`.
pub fn reindex(r: &ReindexReport, d: Option<&DrainReport>, job_id: &str) -> String {
    let mut out = kv(&[
        ("job", job_id.to_owned()),
        ("consumer", r.consumer.clone()),
        (
            "model",
            r.model.as_ref().map_or_else(|| "-".into(), |m| m.key()),
        ),
        ("cleared", format!("{} records", r.cleared_records)),
        ("requeued", format!("{} nodes", r.requeued)),
        ("queued_in", format!("{} ms", r.took_ms)),
    ]);
    match d {
        Some(d) => out.push_str(&drain(d)),
        None => out.push_str(
            "the workers rebuild the index in the background (ce status shows the lag)\n",
        ),
    }
    out
}

/// `ce stat`.
pub fn stat(s: &NodeStat) -> String {
    kv(&[
        ("uri", s.uri.to_string()),
        ("parent", s.parent_uri.to_string()),
        ("kind", s.kind.to_string()),
        ("type", s.context_type.to_string()),
        (
            "category",
            if s.category.is_empty() {
                "-".to_owned()
            } else {
                s.category.clone()
            },
        ),
        ("owner_space", s.owner_space.to_string()),
        ("version", s.version.to_string()),
        ("relation_version", s.relation_version.to_string()),
        ("content_hash", s.content_hash.clone()),
        ("layers", layer_sizes(s.layer_bytes)),
        ("abstract_origin", origin(&s.provenance.abstract_origin)),
        ("overview_origin", origin(&s.provenance.overview_origin)),
        ("children", s.children.to_string()),
        ("meta", meta_text(&s.meta)),
        ("created", time(s.created_at_ms)),
        ("updated", time(s.updated_at_ms)),
    ])
}

/// A layer's origin (docs/derive.md): who wrote it, or how it was derived.
fn origin(o: &ce_core::LayerOrigin) -> String {
    use ce_core::LayerOrigin;
    match o {
        LayerOrigin::None => "none (the fallback of the projector applies)".to_owned(),
        LayerOrigin::User => "user".to_owned(),
        LayerOrigin::Pending => "pending (the derive consumer has it queued)".to_owned(),
        LayerOrigin::Derived(d) => {
            let tokens = if d.tokens_in + d.tokens_out > 0 {
                format!(", {} tokens in, {} out", d.tokens_in, d.tokens_out)
            } else {
                String::new()
            };
            format!("derived by {} at {}{tokens}", d.generator, time(d.at_ms))
        }
        LayerOrigin::Failed(f) => format!(
            "failed ({} by {}: {}; the fallback applies)",
            f.code, f.generator, f.message
        ),
    }
}

/// The `derive` line of `ce status`.
fn derive_line(d: &ce_server::status::DeriveStatus) -> String {
    let budget = match (d.max_tokens_per_day, d.over_budget) {
        (0, _) => "no token budget".to_owned(),
        (max, false) => format!("budget {max} tokens/day"),
        (max, true) => format!("budget {max} tokens/day SPENT (extractive until 00:00 UTC)"),
    };
    let mut line = format!(
        "{} for {}; {} dirty; today {} derived, {} discarded by coalescing, {} tokens in, {} out; {budget}",
        d.generator,
        d.types.join(", "),
        d.dirty,
        d.today.derivations,
        d.today.discarded,
        d.today.tokens_in,
        d.today.tokens_out,
    );
    if let Some(r) = &d.last_refusal {
        line.push_str(&format!("; last refusal: {r}"));
    }
    line
}

fn display_name(s: &NodeStat) -> String {
    let name = s.uri.name();
    if s.children > 0 {
        format!("{name}/")
    } else {
        name.to_owned()
    }
}

/// `ce ls URI`: its children, or what is there when it has none.
pub fn ls(uri: &CtxUri, children: &[NodeStat]) -> String {
    if children.is_empty() {
        return if uri.is_root() {
            "no accounts yet (`ce put ctx://ACCOUNT/...` creates one)\n".to_owned()
        } else {
            format!(
                "{uri} has no children (`ce stat {uri}` shows the node, `ce cat {uri}` its content)\n"
            )
        };
    }
    let rows: Vec<Vec<String>> = children
        .iter()
        .map(|s| {
            vec![
                display_name(s),
                s.kind.to_string(),
                s.context_type.to_string(),
                format!("v{}", s.version),
                bytes(s.layer_bytes.iter().sum()),
                s.children.to_string(),
                time(s.updated_at_ms),
            ]
        })
        .collect();
    table(
        &[
            "NAME", "KIND", "TYPE", "VERSION", "SIZE", "CHILDREN", "UPDATED",
        ],
        &rows,
    )
}

/// `ce tree`: box-drawn, children by name under their parent.
pub fn tree(root: &CtxUri, nodes: &[NodeStat]) -> String {
    let mut children: BTreeMap<&CtxUri, Vec<&NodeStat>> = BTreeMap::new();
    let mut top = None;
    for n in nodes {
        if &n.uri == root {
            top = Some(n);
        } else {
            children.entry(&n.parent_uri).or_default().push(n);
        }
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| a.uri.name().cmp(b.uri.name()));
    }
    let mut out = String::new();
    match top {
        Some(t) => out.push_str(&format!("{}{}\n", root, tree_info(t))),
        None => out.push_str(&format!("{root}\n")),
    }
    tree_children(root, &children, "", &mut out);
    out
}

fn tree_children(
    parent: &CtxUri,
    children: &BTreeMap<&CtxUri, Vec<&NodeStat>>,
    prefix: &str,
    out: &mut String,
) {
    let Some(list) = children.get(parent) else {
        return;
    };
    for (i, n) in list.iter().enumerate() {
        let last = i + 1 == list.len();
        let (branch, cont) = if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        out.push_str(&format!(
            "{prefix}{branch}{}{}\n",
            display_name(n),
            tree_info(n)
        ));
        tree_children(&n.uri, children, &format!("{prefix}{cont}"), out);
    }
}

fn tree_info(n: &NodeStat) -> String {
    let size: u64 = n.layer_bytes.iter().sum();
    if size == 0 {
        String::new()
    } else {
        format!("  [{} v{}, {}]", n.context_type, n.version, bytes(size))
    }
}

/// `ce relations`.
pub fn relations(uri: &CtxUri, r: &Relations) -> String {
    if r.outgoing.is_empty() && r.incoming.is_empty() {
        return format!("{uri} has no relations\n");
    }
    let row = |dir: &str, other: &CtxUri, e: &RelationEdge| {
        vec![
            dir.to_owned(),
            e.relation_type.clone(),
            other.to_string(),
            e.weight.to_string(),
            e.reason.clone(),
        ]
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    rows.extend(r.outgoing.iter().map(|e| row("->", &e.to_uri, e)));
    rows.extend(r.incoming.iter().map(|e| row("<-", &e.from_uri, e)));
    table(&["DIR", "TYPE", "NODE", "WEIGHT", "REASON"], &rows)
}

/// `ce related`.
pub fn related(r: &RelatedResponse, catch_up: &str) -> String {
    let mut out = if r.edges.is_empty() {
        format!("{} has no indexed relations\n", r.uri)
    } else {
        let rows: Vec<Vec<String>> = r
            .edges
            .iter()
            .map(|e| {
                vec![
                    if e.direction == Direction::Out {
                        "->"
                    } else {
                        "<-"
                    }
                    .to_owned(),
                    e.relation_type.clone(),
                    e.other.to_string(),
                    e.weight.to_string(),
                    e.abstract_text.clone(),
                ]
            })
            .collect();
        table(&["DIR", "TYPE", "NODE", "WEIGHT", "ABSTRACT"], &rows)
    };
    if r.dropped_by_hydration > 0 {
        out.push_str(&format!(
            "({} indexed edges the source no longer holds were left out)\n",
            r.dropped_by_hydration
        ));
    }
    push_lag(&mut out, &r.lag, catch_up);
    out
}

/// `ce outbox list`.
pub fn outbox_list(rows: &[DeliveryRow]) -> String {
    if rows.is_empty() {
        return "no deliveries\n".to_owned();
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.event.seq.to_string(),
                r.event.event_id.clone(),
                r.event.event_type.to_string(),
                r.delivery.consumer.clone(),
                r.delivery.status.to_string(),
                r.delivery.retry_count.to_string(),
                r.event.uri.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "SEQ", "EVENT_ID", "TYPE", "CONSUMER", "STATUS", "RETRIES", "URI",
        ],
        &rows,
    )
}

/// `ce outbox show`.
pub fn outbox_show(event: &OutboxEvent, deliveries: &[Delivery]) -> String {
    let mut out = event_kv(event);
    out.push_str("payload\n");
    let payload = serde_json::to_string_pretty(&event.payload).unwrap_or_default();
    for line in payload.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|d| {
            vec![
                d.consumer.clone(),
                d.status.to_string(),
                d.retry_count.to_string(),
                opt_time(d.next_visible_at_ms),
                d.claimed_by.clone().unwrap_or_else(|| "-".to_owned()),
                d.last_error.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &[
            "CONSUMER",
            "STATUS",
            "RETRIES",
            "NEXT_VISIBLE",
            "CLAIMED_BY",
            "LAST_ERROR",
        ],
        &rows,
    ));
    out
}

/// An event's header lines.
pub fn event_kv(event: &OutboxEvent) -> String {
    kv(&[
        ("seq", event.seq.to_string()),
        ("event_id", event.event_id.clone()),
        ("type", event.event_type.to_string()),
        ("uri", event.uri.to_string()),
        ("trace_id", event.payload.trace_id().to_owned()),
        ("created", time(event.created_at_ms)),
    ])
}

/// `ce outbox stats`.
pub fn outbox_stats(stats: &[ConsumerStats]) -> String {
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            vec![
                s.consumer.clone(),
                s.pending.to_string(),
                s.claimed.to_string(),
                s.retry_wait.to_string(),
                s.done.to_string(),
                s.dead.to_string(),
                s.low_watermark_seq
                    .map_or_else(|| "-".to_owned(), |v| v.to_string()),
                opt_time(s.oldest_pending_created_at_ms),
            ]
        })
        .collect();
    table(
        &[
            "CONSUMER",
            "PENDING",
            "CLAIMED",
            "RETRY_WAIT",
            "DONE",
            "DEAD",
            "LOW_WATERMARK",
            "OLDEST_PENDING",
        ],
        &rows,
    )
}

/// `ce import`.
pub fn import(r: &ImportReport) -> String {
    let mut out = kv(&[
        ("nodes_written", r.nodes_written.to_string()),
        ("nodes_unchanged", r.nodes_unchanged.to_string()),
        ("nodes_not_read", r.nodes_not_read.to_string()),
        ("relations_written", r.relations_written.to_string()),
        ("events", r.events.to_string()),
        ("nodes_removed", r.nodes_removed.to_string()),
        ("skipped", r.skipped.len().to_string()),
    ]);
    for s in &r.skipped {
        out.push_str(&format!("  skipped {s}\n"));
    }
    out.push_str(&format!(
        "took               {:.3} s (reading {:.3}, writing {:.3}, recording {:.3})\n",
        (r.read_ms + r.write_ms + r.record_ms) / 1e3,
        r.read_ms / 1e3,
        r.write_ms / 1e3,
        r.record_ms / 1e3
    ));
    out
}

/// `ce export`.
pub fn export(r: &ExportReport) -> String {
    kv(&[
        ("nodes", r.nodes.to_string()),
        ("files", r.files.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_is_one_line_with_control_characters_escaped() {
        assert_eq!(
            escape_controls("failed to open file `a.md\ndocs\t\u{1b}[31m-😀\u{202e}`"),
            "failed to open file `a.md\\ndocs\\t\\u{1b}[31m-😀\u{202e}`"
        );
        assert_eq!(escape_controls("plain: 100 % é"), "plain: 100 % é");
    }

    #[test]
    fn table_aligns_columns_and_trims_line_ends() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz\n");
    }

    #[test]
    fn the_journal_line_says_what_is_held_kept_and_queued() {
        use ce_server::status::JournalStatus;
        use ce_store::model::JournalExtent;
        let pruned = JournalStatus {
            extent: JournalExtent {
                events: 1,
                deliveries: 0,
                oldest_seq: Some(10_002),
                newest_seq: Some(10_002),
                pruned_through: 10_001,
            },
            retention_seconds: 86_400,
            rebuilds_needed: vec!["keyword".into()],
        };
        assert_eq!(
            journal_line(&pruned),
            "1 event (seq 10002–10002), 0 deliveries; what every consumer applied is kept \
             1 day; pruned through seq 10001; rebuild from the source queued for keyword \
             (the journal no longer held what it missed)"
        );
        let empty = JournalStatus {
            retention_seconds: 0,
            ..JournalStatus::default()
        };
        assert_eq!(
            journal_line(&empty),
            "empty; kept forever (index.outbox.journal_retention_seconds = 0)"
        );
        assert_eq!(human_seconds(5_400), "90 min");
        assert_eq!(human_seconds(7_200), "2 hours");
        assert_eq!(human_seconds(61), "61 s");
    }

    #[test]
    fn bytes_switch_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }
}
