//! `ce kb create|ls|show|rm|add|status|rm-items|reindex` (docs/ingestion.md, "Workflow"):
//! knowledge bases and their items, locally or with `--server URL` (`/v1/kb/...`).
//!
//! `add`, `rm-items` and `reindex` answer once the work is enqueued (`--no-wait`) or follow
//! it to its end with a progress line on stderr at each change (items done / total, and the
//! stages they are in). Locally the command does the work itself meanwhile (jobs, indexing),
//! as `ce worker --once` would; Ctrl-C leaves it durable in the store, and `ce serve` or
//! `ce worker` (or the next `ce worker --once`) finishes it.

use std::time::Duration;

use ce_core::rfc3339;
use ce_server::kb::follow::{KbFollowed, KbProgress};
use ce_server::kb::{AddResult, CreateBase, KbInput, KbJobs, KbSettings, KbStatus};
use ce_server::status::EmbedCacheCounters;
use ce_server::wire::{KbAddBody, KbItemsBody};
use ce_store::{KbItem, KnowledgeBase};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::cli::Cli;
use crate::commands;
use crate::error::{CliError, Result};
use crate::output::{self, Rendered, kv, table};
use crate::remote::{Client, decode, rendered};

/// How often `--server` mode reads the progress it follows.
const REMOTE_POLL: Duration = Duration::from_millis(300);

/// `ce kb ...`.
#[derive(Debug, Subcommand)]
pub enum KbCommand {
    /// Create a knowledge base: a subtree (default ctx://ACCOUNT/resources/NAME) with its
    /// chunking settings.
    Create(KbCreateArgs),
    /// List the knowledge bases.
    Ls,
    /// Show a base: root, settings, items by status.
    Show(KbBaseArg),
    /// Remove a base with all its items and nodes (a cleanup job).
    Rm(KbRmArgs),
    /// Add files, directories (recursively), URLs and notes to a base, then index them; an
    /// input the base has already is re-synced (only files whose stat changed are read).
    Add(KbAddArgs),
    /// A base's items by status, with their errors (one item's subtree with --item).
    Status(KbStatusArgs),
    /// Delete items (with their subtrees and nodes): invisible at once, removed by a job.
    RmItems(KbItemsArgs),
    /// Read, parse and index items again, every file of them (only when every item of their
    /// subtrees is completed or failed).
    Reindex(KbItemsArgs),
}

/// `ce kb create`.
#[derive(Debug, Args)]
pub struct KbCreateArgs {
    /// The base's name ([a-z0-9][a-z0-9_-]*).
    pub name: String,
    /// Its subtree [default: ctx://ACCOUNT/resources/NAME].
    #[arg(long, value_name = "URI", conflicts_with = "account")]
    pub root: Option<String>,
    /// The account of the default root [default: default].
    #[arg(long, value_name = "ACCOUNT")]
    pub account: Option<String>,
    /// The most tokens of one chunk (16-8192) [default: 256].
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Tokens a chunk repeats from the previous one [default: 32].
    #[arg(long, value_name = "N")]
    pub overlap_tokens: Option<usize>,
    /// Sections smaller than this merge with a neighbour [default: 64].
    #[arg(long, value_name = "N")]
    pub min_tokens: Option<usize>,
}

/// A base argument.
#[derive(Debug, Args)]
pub struct KbBaseArg {
    /// The base's name.
    pub base: String,
}

/// `ce kb rm`.
#[derive(Debug, Args)]
pub struct KbRmArgs {
    /// The base's name.
    pub base: String,
    /// Answer once the removal is enqueued.
    #[arg(long)]
    pub no_wait: bool,
}

/// `ce kb add`.
#[derive(Debug, Args)]
pub struct KbAddArgs {
    /// The base's name.
    pub base: String,
    /// Files, directories, or http(s):// URLs.
    #[arg(value_name = "PATH|URL")]
    pub inputs: Vec<String>,
    /// A note (inline text) to add; repeatable.
    #[arg(long, value_name = "TEXT")]
    pub note: Vec<String>,
    /// Answer once the items and their first jobs exist.
    #[arg(long)]
    pub no_wait: bool,
}

/// `ce kb status`.
#[derive(Debug, Args)]
pub struct KbStatusArgs {
    /// The base's name.
    pub base: String,
    /// Only this item and its subtree.
    #[arg(long, value_name = "ID")]
    pub item: Option<String>,
}

/// `ce kb rm-items` / `ce kb reindex`.
#[derive(Debug, Args)]
pub struct KbItemsArgs {
    /// The base's name.
    pub base: String,
    /// Item ids (a directory's descendants fold into it).
    #[arg(required = true, value_name = "ID")]
    pub items: Vec<String>,
    /// Answer once the jobs are enqueued.
    #[arg(long)]
    pub no_wait: bool,
}

impl KbCreateArgs {
    fn request(&self) -> CreateBase {
        let d = KbSettings::default();
        let given =
            self.max_tokens.is_some() || self.overlap_tokens.is_some() || self.min_tokens.is_some();
        CreateBase {
            name: self.name.clone(),
            root: self.root.clone(),
            account: self.account.clone(),
            settings: given.then(|| KbSettings {
                max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
                overlap_tokens: self.overlap_tokens.unwrap_or(d.overlap_tokens),
                min_tokens: self.min_tokens.unwrap_or(d.min_tokens),
            }),
        }
    }
}

impl KbAddArgs {
    /// The inputs: URLs as given, paths made absolute (against the current directory).
    fn inputs(&self) -> Result<Vec<KbInput>> {
        let mut out = Vec::new();
        for i in &self.inputs {
            if i.starts_with("http://") || i.starts_with("https://") {
                out.push(KbInput {
                    url: Some(i.clone()),
                    ..KbInput::default()
                });
            } else {
                let abs = std::path::absolute(i).map_err(|e| {
                    CliError::from(ce_core::CoreError::InvalidField {
                        field: "path",
                        reason: format!("{i:?}: {e}"),
                    })
                })?;
                out.push(KbInput {
                    path: Some(abs.display().to_string()),
                    ..KbInput::default()
                });
            }
        }
        out.extend(self.note.iter().map(|n| KbInput {
            note: Some(n.clone()),
            ..KbInput::default()
        }));
        if out.is_empty() {
            return Err(CliError::Usage(
                "give at least one PATH, URL or --note TEXT".into(),
            ));
        }
        Ok(out)
    }
}

/// What a followed entry answers: what it enqueued and how its work ended.
#[derive(Debug, Serialize)]
struct Followed<'a, T: Serialize> {
    #[serde(flatten)]
    entry: &'a T,
    progress: &'a KbProgress,
    /// Why the command stopped before the end (the rest continues in the background).
    waiting: Option<&'a str>,
    /// What this process embedded meanwhile (local work only; absent with `--server`).
    #[serde(skip_serializing_if = "Option::is_none")]
    embed: Option<EmbedCacheCounters>,
}

/// The embedding counters of the work `engine` did here.
fn embedded(engine: &ce_server::Engine) -> Option<EmbedCacheCounters> {
    engine.embedder().ok().map(|e| e.stats().into())
}

/// Runs `c` against the data directory.
pub fn run(cli: &Cli, c: &KbCommand) -> Result<Rendered> {
    // While `ce worker` / `ce serve` holds the embedded vector index, reads work and
    // followed work is shared with that process (it applies the vectors).
    let engine = commands::observe_engine(cli, ce_server::engine::DEFAULT_WORKERS, "kb")?;
    let out = match c {
        KbCommand::Create(a) => {
            let b = engine.kb_create(a.request())?;
            Rendered::new(&b, base_text(&b))
        }
        KbCommand::Ls => {
            let bases = engine.kb_bases()?;
            Rendered::new(&bases, bases_text(&bases))
        }
        KbCommand::Show(a) => {
            let s = engine.kb_status(&a.base, None)?;
            Rendered::new(&s, show_text(&s))
        }
        KbCommand::Status(a) => {
            let s = engine.kb_status(&a.base, a.item.as_deref())?;
            Rendered::new(&s, status_text(&s))
        }
        KbCommand::Rm(a) => {
            let j = engine.kb_remove(&a.base)?;
            follow_local(cli, &engine, &a.base, &j, a.no_wait, "kb rm")
        }
        KbCommand::Add(a) => {
            let r = engine.kb_add(&a.base, a.inputs()?)?;
            let roots: Vec<String> = r.items.iter().map(|i| i.id.clone()).collect();
            let j = KbJobs {
                roots,
                jobs: r.jobs.clone(),
            };
            if a.no_wait {
                Rendered::new(&r, added_text(&r, None))
            } else {
                hint_background(cli.json);
                let f = engine.kb_follow(&a.base, &j.roots, &j.jobs, &|p| {
                    print_progress(p, cli.json, "kb add")
                })?;
                let r = refreshed(r, engine.kb_status(&a.base, None)?.items);
                let out = Followed {
                    entry: &r,
                    progress: &f.progress,
                    waiting: f.waiting.as_deref(),
                    embed: embedded(&engine),
                };
                Rendered::new(&out, added_text(&r, Some(&f)))
            }
        }
        KbCommand::RmItems(a) => {
            let j = engine.kb_delete_items(&a.base, &a.items)?;
            follow_local(cli, &engine, &a.base, &j, a.no_wait, "kb rm-items")
        }
        KbCommand::Reindex(a) => {
            let j = engine.kb_reindex_items(&a.base, &a.items)?;
            follow_local(cli, &engine, &a.base, &j, a.no_wait, "kb reindex")
        }
    };
    engine.shutdown();
    out
}

fn hint_background(json: bool) {
    if !json {
        output::print_stderr(
            "kb: indexing here; Ctrl-C stops watching and leaves the work queued (durable): \
             `ce serve` or `ce worker` finishes it, `ce kb status` shows it\n",
        );
    }
}

fn follow_local(
    cli: &Cli,
    engine: &ce_server::Engine,
    base: &str,
    j: &KbJobs,
    no_wait: bool,
    label: &str,
) -> Result<Rendered> {
    if no_wait {
        return Rendered::new(j, jobs_text(j, None));
    }
    hint_background(cli.json);
    let f = engine.kb_follow(base, &j.roots, &j.jobs, &|p| {
        print_progress(p, cli.json, label)
    })?;
    let out = Followed {
        entry: j,
        progress: &f.progress,
        waiting: f.waiting.as_deref(),
        embed: embedded(engine),
    };
    Rendered::new(&out, jobs_text(j, Some(&f)))
}

/// `r` with its items as they are now (`current`: the base's visible items).
fn refreshed(mut r: AddResult, current: Vec<KbItem>) -> AddResult {
    for i in &mut r.items {
        if let Some(now) = current.iter().find(|c| c.id == i.id) {
            *i = now.clone();
        }
    }
    r
}

/// Runs `c` against the server of `client`.
pub fn remote(client: &Client, c: &KbCommand, json: bool) -> Result<Rendered> {
    match c {
        KbCommand::Create(a) => {
            let v = client.post("/v1/kb/create", &a.request())?;
            rendered(v, |b: KnowledgeBase| Ok(base_text(&b)))
        }
        KbCommand::Ls => {
            let v = client.get("/v1/kb", &[])?;
            rendered(v, |b: Vec<KnowledgeBase>| Ok(bases_text(&b)))
        }
        KbCommand::Show(a) => {
            let v = client.get(&format!("/v1/kb/{}", a.base), &[])?;
            rendered(v, |s: KbStatus| Ok(show_text(&s)))
        }
        KbCommand::Status(a) => {
            let mut q = Vec::new();
            if let Some(i) = &a.item {
                q.push(("item", i.clone()));
            }
            let v = client.get(&format!("/v1/kb/{}/status", a.base), &q)?;
            rendered(v, |s: KbStatus| Ok(status_text(&s)))
        }
        KbCommand::Rm(a) => {
            let j: KbJobs =
                decode(&client.post(&format!("/v1/kb/{}/rm", a.base), &serde_json::json!({}))?)?;
            follow_remote(client, &a.base, &j, a.no_wait, json, "kb rm")
        }
        KbCommand::Add(a) => {
            let body = KbAddBody {
                inputs: a.inputs()?,
            };
            let r: AddResult = decode(&client.post(&format!("/v1/kb/{}/items", a.base), &body)?)?;
            if a.no_wait {
                return Rendered::new(&r, added_text(&r, None));
            }
            let j = KbJobs {
                roots: r.items.iter().map(|i| i.id.clone()).collect(),
                jobs: r.jobs.clone(),
            };
            let p = poll_remote(client, &a.base, &j, json, "kb add")?;
            let now: KbStatus = decode(&client.get(&format!("/v1/kb/{}/status", a.base), &[])?)?;
            let r = refreshed(r, now.items);
            let f = KbFollowed {
                progress: p,
                waiting: None,
            };
            let out = Followed {
                entry: &r,
                progress: &f.progress,
                waiting: None,
                embed: None,
            };
            Rendered::new(&out, added_text(&r, Some(&f)))
        }
        KbCommand::RmItems(a) => {
            let body = KbItemsBody {
                items: a.items.clone(),
            };
            let j: KbJobs = decode(&client.post(&format!("/v1/kb/{}/items/rm", a.base), &body)?)?;
            follow_remote(client, &a.base, &j, a.no_wait, json, "kb rm-items")
        }
        KbCommand::Reindex(a) => {
            let body = KbItemsBody {
                items: a.items.clone(),
            };
            let j: KbJobs = decode(&client.post(&format!("/v1/kb/{}/reindex", a.base), &body)?)?;
            follow_remote(client, &a.base, &j, a.no_wait, json, "kb reindex")
        }
    }
}

fn follow_remote(
    client: &Client,
    base: &str,
    j: &KbJobs,
    no_wait: bool,
    json: bool,
    label: &str,
) -> Result<Rendered> {
    if no_wait {
        return Rendered::new(j, jobs_text(j, None));
    }
    let p = poll_remote(client, base, j, json, label)?;
    let f = KbFollowed {
        progress: p,
        waiting: None,
    };
    let out = Followed {
        entry: j,
        progress: &f.progress,
        waiting: None,
        embed: None,
    };
    Rendered::new(&out, jobs_text(j, Some(&f)))
}

/// Polls the server's progress of `j` until it has finished.
fn poll_remote(
    client: &Client,
    base: &str,
    j: &KbJobs,
    json: bool,
    label: &str,
) -> Result<KbProgress> {
    if !json {
        output::print_stderr(
            "kb: the server does the work; Ctrl-C stops watching, the work goes on\n",
        );
    }
    let body = serde_json::json!({"roots": j.roots, "jobs": j.jobs});
    let mut last: Option<KbProgress> = None;
    loop {
        let p: KbProgress = decode(&client.post(&format!("/v1/kb/{base}/progress"), &body)?)?;
        if last.as_ref() != Some(&p) {
            print_progress(&p, json, label);
            last = Some(p.clone());
        }
        if p.finished {
            return Ok(p);
        }
        std::thread::sleep(REMOTE_POLL);
    }
}

/// One progress line on stderr: text, or a JSON object with a `progress` key (`--json`).
pub fn print_progress(p: &KbProgress, json: bool, label: &str) {
    let line = if json {
        format!(
            "{}\n",
            serde_json::json!({"progress": label, "done": p.done, "total": p.total,
                "failed": p.failed, "by_status": p.by_status, "jobs_open": p.jobs_open})
        )
    } else {
        let stages: Vec<String> = p
            .by_status
            .iter()
            .filter(|(s, n)| **n > 0 && !s.is_terminal())
            .map(|(s, n)| format!("{n} {}", s.as_str()))
            .collect();
        let stages = if stages.is_empty() {
            String::new()
        } else {
            format!(" ({})", stages.join(", "))
        };
        let failed = if p.failed > 0 {
            format!(", {} failed", p.failed)
        } else {
            String::new()
        };
        format!(
            "{label}: {}/{} items done{failed}{stages}\n",
            p.done, p.total
        )
    };
    output::print_stderr(&line);
}

fn base_text(b: &KnowledgeBase) -> String {
    kv(&[
        ("name", b.name.clone()),
        ("root", b.root.to_string()),
        ("status", b.status.as_str().to_owned()),
        ("settings", b.settings.to_string()),
        ("created", rfc3339(b.created_at_ms)),
    ])
}

fn bases_text(bases: &[KnowledgeBase]) -> String {
    if bases.is_empty() {
        return "no knowledge bases (`ce kb create NAME`)\n".into();
    }
    let rows: Vec<Vec<String>> = bases
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.root.to_string(),
                b.status.as_str().to_owned(),
                rfc3339(b.created_at_ms),
            ]
        })
        .collect();
    table(&["NAME", "ROOT", "STATUS", "CREATED"], &rows)
}

/// Items by status, the zeros left out (`3 completed, 1 failed`; `no items`).
pub(crate) fn counts_line(
    counts: &std::collections::BTreeMap<ce_store::ItemStatus, u64>,
) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(st, n)| format!("{n} {}", st.as_str()))
        .collect();
    if parts.is_empty() {
        "no items".into()
    } else {
        parts.join(", ")
    }
}

fn show_text(s: &KbStatus) -> String {
    let mut text = base_text(&s.base);
    text.push_str(&kv(&[
        ("items", counts_line(&s.counts)),
        ("done", format!("{}/{}", s.done, s.total)),
        ("token_counter", s.token_counter.clone()),
    ]));
    text
}

fn item_row(i: &KbItem) -> Vec<String> {
    let source = if i.kind == ce_store::ItemKind::Note {
        let first: String = i.source.chars().take(40).collect();
        format!("note: {}", first.replace('\n', " "))
    } else {
        i.source.clone()
    };
    vec![
        i.id.clone(),
        i.kind.as_str().to_owned(),
        i.status.as_str().to_owned(),
        i.node_uri.to_string(),
        source,
        i.error
            .as_ref()
            .map(|e| format!("{}: {}", e.code, e.message))
            .unwrap_or_else(|| "-".into()),
    ]
}

fn status_text(s: &KbStatus) -> String {
    let mut text = format!(
        "{}: {} ({}/{} done)\n",
        s.base.name,
        counts_line(&s.counts),
        s.done,
        s.total
    );
    if !s.items.is_empty() {
        let rows: Vec<Vec<String>> = s.items.iter().map(item_row).collect();
        text.push_str(&table(
            &["ID", "KIND", "STATUS", "NODE", "SOURCE", "ERROR"],
            &rows,
        ));
    }
    text
}

fn ended_text(f: Option<&KbFollowed>) -> String {
    match f {
        None => "enqueued: a running `ce serve` or `ce worker` does the work (or `ce worker \
                 --once`); `ce kb status` follows it\n"
            .into(),
        Some(f) => {
            let mut t = format!(
                "{}/{} items done, {} failed\n",
                f.progress.done, f.progress.total, f.progress.failed
            );
            if let Some(w) = &f.waiting {
                t.push_str(&format!(
                    "stopped before the end: {w}; the rest continues in `ce serve` / `ce worker`\n"
                ));
            }
            t
        }
    }
}

fn added_text(r: &AddResult, f: Option<&KbFollowed>) -> String {
    let rows: Vec<Vec<String>> = r.items.iter().map(item_row).collect();
    let mut text = table(&["ID", "KIND", "STATUS", "NODE", "SOURCE", "ERROR"], &rows);
    text.push_str(&ended_text(f));
    text
}

fn jobs_text(j: &KbJobs, f: Option<&KbFollowed>) -> String {
    let mut text = kv(&[("roots", j.roots.join(", ")), ("jobs", j.jobs.join(", "))]);
    text.push_str(&ended_text(f));
    text
}
