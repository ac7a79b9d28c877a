//! `ce repair dead` and `ce repair reconcile`: the two repair jobs of spec §8.3.2
//! (docs/repair.md), locally or with `--server URL` (`POST /v1/repair/dead`,
//! `POST /v1/repair/reconcile`).
//!
//! `--force-done` marks dead deliveries done without applying them: it asks for confirmation
//! on a terminal, or needs `--yes`; without either it refuses before touching anything.
//! A local `reconcile` runs the workers afterwards until the repair events are applied (like
//! `ce reindex`; `--no-wait` only queues them).

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use ce_core::{CoreError, EventType};
use ce_server::engine::repair::{
    ConsumerReconcile, DeadAction, DeadRepairBody, DeadRepairReport, ReconcileBody, ReconcileReport,
};
use ce_server::status::DrainReport;
use ce_store::model::{DeadCounts, DeadFilter};
use clap::{ArgGroup, Args, Subcommand};
use serde::Serialize;
use serde_json::Value;

use crate::cli::Cli;
use crate::commands::{self, parse_uri};
use crate::error::{CliError, Result};
use crate::output::{self, Rendered};
use crate::remote::Client;

/// `ce repair ...`.
#[derive(Debug, Subcommand)]
pub enum RepairCommand {
    /// Requeue dead deliveries (fresh retry budget) or mark them done without applying them.
    Dead(RepairDeadArgs),
    /// Compare every index (or one) with the source of truth: missing, orphan and stale
    /// records; append the events that converge it.
    Reconcile(RepairReconcileArgs),
}

/// `ce repair dead`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("action").required(true).args(["requeue", "force_done", "dry_run"])))]
pub struct RepairDeadArgs {
    /// Only this consumer's deliveries.
    #[arg(long, value_name = "C")]
    pub consumer: Option<String>,
    /// Only events of this type, e.g. UPSERT_CONTEXT.
    #[arg(long = "type", value_name = "EVENT_TYPE")]
    pub event_type: Option<String>,
    /// Only events whose URI is this URI or lies below it.
    #[arg(long, value_name = "URI")]
    pub subtree: Option<String>,
    /// Only deliveries that died with this error code, e.g. embed_timeout.
    #[arg(long, value_name = "CODE")]
    pub error_code: Option<String>,
    /// Only sequence numbers at or above SEQ.
    #[arg(long, value_name = "SEQ")]
    pub from_seq: Option<i64>,
    /// Only sequence numbers at or below SEQ.
    #[arg(long, value_name = "SEQ")]
    pub to_seq: Option<i64>,
    /// Only deliveries that died by exhausting their retries (every failure retryable).
    #[arg(long)]
    pub exhausted_only: bool,
    /// Put them back to pending with a fresh retry budget.
    #[arg(long)]
    pub requeue: bool,
    /// Mark them done WITHOUT applying them (asks for confirmation, or needs --yes).
    #[arg(long)]
    pub force_done: bool,
    /// Only count them.
    #[arg(long)]
    pub dry_run: bool,
    /// Confirm --force-done without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `ce repair reconcile`.
#[derive(Debug, Args)]
pub struct RepairReconcileArgs {
    /// Only this consumer's index [default: every configured consumer with an index].
    #[arg(long, value_name = "C")]
    pub consumer: Option<String>,
    /// Only this subtree [default: everything].
    #[arg(long, value_name = "URI")]
    pub subtree: Option<String>,
    /// Report only; append nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Append orphan deletes even beyond the delete-safety limits (more than 1,000 records,
    /// or more than 25 % of a scope of at least 20): check that the source is complete first.
    #[arg(long)]
    pub allow_large_delete: bool,
    /// Locally: only queue the repair events (do not run the workers until they are applied).
    #[arg(long)]
    pub no_wait: bool,
}

/// Runs `c` against the data directory.
pub fn run(cli: &Cli, c: &RepairCommand) -> Result<Rendered> {
    match c {
        RepairCommand::Dead(a) => {
            let body = dead_body(a)?;
            let store = commands::open_store(cli)?;
            let count = |f: &DeadFilter| Ok(store.count_dead(f)?);
            confirm(a, &body, count)?;
            let counts = match body.action {
                DeadAction::Count => store.count_dead(&body.filter)?,
                DeadAction::Requeue => store.requeue_dead_matching(&body.filter)?,
                DeadAction::ForceDone => store.force_done(&body.filter)?,
            };
            let report = DeadRepairReport {
                action: body.action,
                filter: body.filter,
                total: counts.values().sum(),
                counts,
            };
            Rendered::new(&report, dead_text(&report))
        }
        RepairCommand::Reconcile(a) => {
            let body = reconcile_body(a)?;
            let engine =
                commands::open_engine(cli, ce_server::engine::DEFAULT_WORKERS, false, "repair")?;
            let report = engine.reconcile(&body)?;
            let drain = if a.no_wait || report.emitted == 0 {
                None
            } else {
                Some(commands::drain_with_progress(&engine, cli.json, "repair")?)
            };
            engine.shutdown();
            let out = ReconcileOutput {
                report: &report,
                drain: drain.as_ref(),
            };
            let mut text = reconcile_text(&report);
            if let Some(d) = &drain {
                text.push_str(&output::drain(d));
            }
            Rendered::new(&out, text)
        }
    }
}

/// Runs `c` against the server of `client`.
pub fn remote(client: &Client, c: &RepairCommand) -> Result<Rendered> {
    match c {
        RepairCommand::Dead(a) => {
            let body = dead_body(a)?;
            let count = |f: &DeadFilter| {
                let b = DeadRepairBody {
                    action: DeadAction::Count,
                    filter: f.clone(),
                    confirm: false,
                };
                let r: DeadRepairReport = decode(client.post("/v1/repair/dead", &b)?)?;
                Ok(r.counts)
            };
            confirm(a, &body, count)?;
            let json = client.post("/v1/repair/dead", &body)?;
            let r: DeadRepairReport = decode(json.clone())?;
            Ok(Rendered {
                human: dead_text(&r),
                json,
            })
        }
        RepairCommand::Reconcile(a) => {
            let body = reconcile_body(a)?;
            let json = client.post("/v1/repair/reconcile", &body)?;
            let r: ReconcileReport = decode(json.clone())?;
            Ok(Rendered {
                human: reconcile_text(&r),
                json,
            })
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| CliError::Transport {
        url: "answer".into(),
        message: format!("unexpected answer shape: {e}"),
    })
}

/// The request of a `ce repair dead` (validated).
fn dead_body(a: &RepairDeadArgs) -> Result<DeadRepairBody> {
    if let (Some(from), Some(to)) = (a.from_seq, a.to_seq)
        && from > to
    {
        return Err(CoreError::InvalidField {
            field: "from_seq",
            reason: format!("--from-seq {from} is above --to-seq {to}"),
        }
        .into());
    }
    let action = if a.requeue {
        DeadAction::Requeue
    } else if a.force_done {
        DeadAction::ForceDone
    } else {
        DeadAction::Count
    };
    Ok(DeadRepairBody {
        action,
        filter: DeadFilter {
            consumer: a.consumer.clone(),
            event_type: a
                .event_type
                .as_deref()
                .map(str::parse::<EventType>)
                .transpose()?,
            subtree: a.subtree.as_deref().map(parse_uri).transpose()?,
            error_code: a.error_code.clone(),
            min_seq: a.from_seq,
            max_seq: a.to_seq,
            exhausted_only: a.exhausted_only,
        },
        confirm: a.force_done && a.yes,
    })
}

/// For `--force-done`: `--yes`, else a `y` on the terminal after seeing the count; refuses
/// without a terminal. Sets nothing for other actions.
fn confirm(
    a: &RepairDeadArgs,
    body: &DeadRepairBody,
    count: impl Fn(&DeadFilter) -> Result<DeadCounts>,
) -> Result<()> {
    if body.action != DeadAction::ForceDone || a.yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(
            "--force-done marks dead deliveries done without applying them: confirm with --yes (there is no terminal to ask on); nothing was changed".into(),
        ));
    }
    let counts = count(&body.filter)?;
    let total: u64 = counts.values().sum();
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "mark {total} dead deliveries ({}) done WITHOUT applying them? [y/N] ",
        counts_text(&counts)
    );
    let _ = err.flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| std::io::Error::new(e.kind(), format!("reading the answer: {e}")))?;
    if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        Err(CliError::Usage("not confirmed: nothing was changed".into()))
    }
}

/// The request of a `ce repair reconcile` (validated).
fn reconcile_body(a: &RepairReconcileArgs) -> Result<ReconcileBody> {
    if let Some(c) = &a.consumer {
        commands::check_consumer(c)?;
    }
    Ok(ReconcileBody {
        consumer: a.consumer.clone(),
        subtree: a.subtree.as_deref().map(parse_uri).transpose()?,
        dry_run: a.dry_run,
        allow_large_delete: a.allow_large_delete,
    })
}

/// The `--json` answer of a local `ce repair reconcile`.
#[derive(Debug, Serialize)]
struct ReconcileOutput<'a> {
    #[serde(flatten)]
    report: &'a ReconcileReport,
    /// The workers' run that applied the repair events (absent with `--no-wait`, on a dry
    /// run, or when nothing was appended).
    drain: Option<&'a DrainReport>,
}

fn counts_text(c: &DeadCounts) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn dead_text(r: &DeadRepairReport) -> String {
    let verb = match r.action {
        DeadAction::Count => "dead deliveries matching",
        DeadAction::Requeue => "requeued",
        DeadAction::ForceDone => "forced done without applying",
    };
    format!("{verb}: {} ({})\n", r.total, counts_text(&r.counts))
}

fn samples(c: &ConsumerReconcile) -> Vec<String> {
    let f = &c.findings;
    let mut lines = Vec::new();
    for (kind, finding) in [
        ("missing", &f.missing),
        ("orphan", &f.orphan),
        ("stale", &f.stale),
    ] {
        if finding.records == 0 {
            continue;
        }
        let more = if finding.uris > finding.samples.len() as u64 {
            format!(" (+{} more)", finding.uris - finding.samples.len() as u64)
        } else {
            String::new()
        };
        let list: Vec<&str> = finding.samples.iter().map(|u| u.as_str()).collect();
        lines.push(format!("  {} {kind}: {}{more}", f.consumer, list.join(" ")));
    }
    if let Some(m) = &f.model_mismatch {
        lines.push(format!("  {}: {m}", f.consumer));
    }
    if let Some(l) = &c.large_delete {
        lines.push(format!("  {}: delete safety: {l}", f.consumer));
    }
    lines
}

fn reconcile_text(r: &ReconcileReport) -> String {
    let rows: Vec<Vec<String>> = r
        .consumers
        .iter()
        .map(|c| {
            let f = &c.findings;
            vec![
                f.consumer.clone(),
                f.source_records.to_string(),
                f.index_records.to_string(),
                f.missing.records.to_string(),
                f.orphan.records.to_string(),
                f.stale.records.to_string(),
                c.events.to_string(),
                c.emitted.to_string(),
            ]
        })
        .collect();
    let mut out = format!("reconcile of {}\n", r.scope);
    out.push_str(&output::table(
        &[
            "CONSUMER", "SOURCE", "INDEX", "MISSING", "ORPHAN", "STALE", "EVENTS", "EMITTED",
        ],
        &rows,
    ));
    for c in &r.consumers {
        for line in samples(c) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if r.dry_run {
        out.push_str("dry run: nothing appended\n");
    } else {
        out.push_str(&format!("appended {} repair events\n", r.emitted));
    }
    out
}
