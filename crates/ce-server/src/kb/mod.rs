//! The ingestion workflow (spec knowledge-workflow; DESIGN.md §9; docs/ingestion.md
//! "Workflow"): knowledge bases, their items, and the jobs that turn items into nodes.
//!
//! ```text
//! API ─► workflow (the one owner of "what next": add / delete / reindex / schedule_item)
//!          │ item rows + first jobs: one source transaction, under the base's TREE lock
//!          ▼
//!   kb-prepare-root ──► child items (scheduled again: directories recurse; on a re-sync the
//!                       previous children are kept, and an unchanged file is not read)
//!   kb-index-documents: read (file / URL / note) ► parse ► chunk ► final stale guard and
//!                       the item's nodes in one transaction ─► outbox (embedding) ─► settle
//!   kb-delete-subtree:  cancel active jobs ► remove nodes ► remove rows (idempotent)
//!   kb-reindex-subtree: reset ► schedule again (compensation: failed)
//! ```
//!
//! - [`workflow`]: the entries, `schedule_item`, the recovery scan and the settle pass
//! - [`source`]: reading an item's input (local file, HTTP(S) URL, note)
//! - [`fingerprint`]: what a file item's nodes were made from, so a re-sync skips it
//! - [`nodes`]: a parsed and chunked document as node writes
//! - [`handlers`]: the four job types
//! - [`follow`]: an entry's work followed to its end (the CLI without `--no-wait`)
//!
//! Every write of a base goes through [`Engine::kb_write`]: one batch under the base's TREE
//! lock with the lease's fences, so base mutations are serialized across processes and the
//! final stale guard ([`ce_store::KbOp::Guard`]) is checked in the transaction that commits.

pub mod fingerprint;
pub mod follow;
pub mod handlers;
pub mod nodes;
pub mod source;
pub mod workflow;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ce_core::{CoreError, CtxUri};
use ce_embed::TokenCounter;
use ce_ingest::ChunkOptions;
use ce_lock::LockRequest;
use ce_store::{ItemStatus, JobSpec, KbItem, KnowledgeBase, StoreError, WriteOp, WriteOutcome};
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::guarded::Guarded;

/// Expands a directory item into child items.
pub const PREPARE_JOB: &str = "kb-prepare-root";
/// Reads, parses and chunks one item and commits its nodes.
pub const INDEX_JOB: &str = "kb-index-documents";
/// Removes a deleting subtree (or a whole base): jobs, nodes, rows.
pub const DELETE_JOB: &str = "kb-delete-subtree";
/// Resets a terminal subtree and schedules it again.
pub const REINDEX_JOB: &str = "kb-reindex-subtree";

/// A workflow stage: the last segment of its idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `kb-prepare-root`.
    Prepare,
    /// `kb-index-documents`.
    Index,
    /// `kb-delete-subtree`.
    Delete,
    /// `kb-reindex-subtree`.
    Reindex,
}

impl Stage {
    /// The key segment.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prepare => "prepare",
            Stage::Index => "index",
            Stage::Delete => "delete",
            Stage::Reindex => "reindex",
        }
    }

    /// The job type.
    pub fn job_type(self) -> &'static str {
        match self {
            Stage::Prepare => PREPARE_JOB,
            Stage::Index => INDEX_JOB,
            Stage::Delete => DELETE_JOB,
            Stage::Reindex => REINDEX_JOB,
        }
    }
}

/// The item segment of the key of a whole-base delete (item ids are hex, so it cannot clash).
pub const WHOLE_BASE: &str = "base";

/// The start of every workflow job's idempotency key.
pub const JOB_KEY_PREFIX: &str = "kb:";

/// The deterministic idempotency key of a stage: `kb:{base}:{item}:{stage}` (docs/jobs.md,
/// "the trap": each stage its own key, so a running stage can enqueue the next).
pub fn job_key(base: &str, item: &str, stage: Stage) -> String {
    format!("{JOB_KEY_PREFIX}{base}:{item}:{}", stage.as_str())
}

/// The payload of every knowledge-base job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KbJob {
    /// The base.
    pub base: String,
    /// The item; `None` for a whole-base delete.
    #[serde(default)]
    pub item: Option<String>,
    /// Read every file again (an explicit reindex), passed on from `kb-reindex-subtree` to
    /// the `kb-prepare-root` jobs it leads to; otherwise (a re-sync) a completed file whose
    /// fingerprint is unchanged is not read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reread: bool,
}

impl KbJob {
    /// The job of `item` (`None`: the whole base) of `base`, not re-reading.
    pub fn of(base: &str, item: Option<&str>) -> KbJob {
        KbJob {
            base: base.to_owned(),
            item: item.map(str::to_owned),
            reread: false,
        }
    }

    /// Parses and checks a payload of `stage`.
    pub fn parse(payload: &serde_json::Value, stage: Stage) -> Result<KbJob> {
        let p = KbJob::deserialize(payload).map_err(|e| CoreError::InvalidField {
            field: "payload",
            reason: format!(
                "not a knowledge-base job payload {{\"base\", \"item\", \"reread\"}}: {e}"
            ),
        })?;
        ce_store::kb::check_base_name(&p.base)?;
        if p.item.is_none() && stage != Stage::Delete {
            return Err(CoreError::InvalidField {
                field: "payload",
                reason: format!("{} needs an item", stage.job_type()),
            }
            .into());
        }
        Ok(p)
    }

    /// The job of `stage` for this payload, enqueued by `parent` when a job does it.
    pub fn spec(&self, stage: Stage, parent: Option<&str>) -> JobSpec {
        JobSpec {
            job_type: stage.job_type().into(),
            payload: serde_json::json!(self),
            idempotency_key: Some(job_key(
                &self.base,
                self.item.as_deref().unwrap_or(WHOLE_BASE),
                stage,
            )),
            run_at_ms: None,
            parent_job_id: parent.map(str::to_owned),
        }
    }
}

/// A base's settings: its chunk options (a change affects future indexing only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KbSettings {
    /// The most tokens of one chunk (16–8192).
    pub max_tokens: usize,
    /// The most tokens a chunk repeats from the previous chunk of its section.
    pub overlap_tokens: usize,
    /// Sections smaller than this merge with a neighbour.
    pub min_tokens: usize,
}

impl Default for KbSettings {
    fn default() -> Self {
        let d = ChunkOptions::default();
        KbSettings {
            max_tokens: d.max_tokens,
            overlap_tokens: d.overlap_tokens,
            min_tokens: d.min_tokens,
        }
    }
}

impl KbSettings {
    /// The chunk options.
    pub fn chunk_options(&self) -> ChunkOptions {
        ChunkOptions {
            max_tokens: self.max_tokens,
            overlap_tokens: self.overlap_tokens,
            min_tokens: self.min_tokens,
        }
    }

    /// Checks the ranges (`invalid_field` naming the option).
    pub fn check(&self) -> Result<()> {
        self.chunk_options().validate().map_err(|e| {
            ServerError::from(CoreError::InvalidField {
                field: "settings",
                reason: e.to_string(),
            })
        })
    }

    /// A base's stored settings.
    pub fn of(base: &KnowledgeBase) -> Result<KbSettings> {
        KbSettings::deserialize(&base.settings).map_err(|e| {
            StoreError::Corrupt(format!("knowledge base {}: bad settings: {e}", base.name)).into()
        })
    }
}

/// A request to create a base.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBase {
    /// Its name (`[a-z0-9][a-z0-9_-]{0,63}`).
    pub name: String,
    /// Its subtree [default: `ctx://{account}/resources/{name}`].
    #[serde(default)]
    pub root: Option<String>,
    /// The account of the default root [default: `default`].
    #[serde(default)]
    pub account: Option<String>,
    /// Its settings [default: the chunking defaults].
    #[serde(default)]
    pub settings: Option<KbSettings>,
}

/// One input of `add`: exactly one of `path`, `url`, `note`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KbInput {
    /// A local file or directory (absolute, on the machine the engine runs on).
    #[serde(default)]
    pub path: Option<String>,
    /// An HTTP(S) URL.
    #[serde(default)]
    pub url: Option<String>,
    /// Inline text.
    #[serde(default)]
    pub note: Option<String>,
    /// The node name of a note [default: `note-…` from its id].
    #[serde(default)]
    pub name: Option<String>,
}

/// What `add` did: the new items and their first jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AddResult {
    /// The new items.
    pub items: Vec<KbItem>,
    /// Their first jobs' ids.
    pub jobs: Vec<String>,
}

/// The jobs an entry enqueued (delete, reindex, base removal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbJobs {
    /// The selected items folded to their top-level roots.
    pub roots: Vec<String>,
    /// The jobs' ids.
    pub jobs: Vec<String>,
}

/// A base and its visible items (deleting ones are invisible).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbStatus {
    /// The base.
    pub base: KnowledgeBase,
    /// Items by status (every status listed, zeros included; `deleting` counts the
    /// invisible ones still being removed).
    pub counts: BTreeMap<ItemStatus, u64>,
    /// Visible items that are completed or failed.
    pub done: u64,
    /// Visible items.
    pub total: u64,
    /// The visible items (one item and its subtree with `--item`), by id.
    pub items: Vec<KbItem>,
    /// What counts tokens for chunking (`model tokenizer` or `estimate`).
    pub token_counter: String,
}

/// Failures per base the status report shows (`ce status`, `GET /v1/status`, `kb_list`).
pub const STATUS_FAILURES: usize = 5;

/// The job types of the workflow.
pub const JOB_TYPES: [&str; 4] = [PREPARE_JOB, INDEX_JOB, DELETE_JOB, REINDEX_JOB];

/// How often the settle pass runs beside a job runner.
pub const SETTLE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The engine's knowledge-base state: the token counter (loaded on first use) and the settle
/// pass while a job runner runs.
#[derive(Default)]
pub struct KbRuntime {
    counter: OnceLock<TokenCounter>,
    settle: std::sync::Mutex<Option<crate::engine::periodic::Periodic>>,
}

impl std::fmt::Debug for KbRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KbRuntime").finish_non_exhaustive()
    }
}

/// Beside a job runner: the start-up recovery scan once, then the settle pass every
/// [`SETTLE_EVERY`] until [`stop_background`].
pub(crate) fn start_background(engine: &std::sync::Arc<Engine>) {
    if let Err(e) = engine.kb_recover() {
        tracing::warn!(error = %e, "knowledge base recovery scan failed");
    }
    let weak = std::sync::Arc::downgrade(engine);
    let p = crate::engine::periodic::Periodic::start("ce-kb-settle", SETTLE_EVERY, move || {
        if let Some(engine) = weak.upgrade()
            && let Err(e) = engine.kb_settle()
        {
            tracing::warn!(error = %e, "knowledge items not settled");
        }
        SETTLE_EVERY
    });
    let mut slot = engine
        .kb
        .settle
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(old) = slot.replace(p) {
        old.stop();
    }
}

/// Stops the settle pass.
pub(crate) fn stop_background(engine: &Engine) {
    let p = engine
        .kb
        .settle
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(p) = p {
        p.stop();
    }
}

impl Engine {
    /// The token counter chunking uses (the embedding model's tokenizer when it is local).
    pub fn token_counter(&self) -> &TokenCounter {
        self.kb
            .counter
            .get_or_init(|| TokenCounter::for_config(&self.config().index.embedding))
    }

    /// What reading a file of `base` depends on besides the file: its chunk settings, the
    /// parser and chunker version, the node layout version and the token counter — a part
    /// of every file fingerprint ([`fingerprint::Reading`]).
    pub fn kb_reading(&self, base: &KnowledgeBase) -> Result<fingerprint::Reading> {
        Ok(fingerprint::Reading::new(
            &KbSettings::of(base)?,
            &self.token_counter().identity(),
        ))
    }

    /// The knowledge-base section of the status report: every base's overview (one grouped
    /// count and the latest failures, [`STATUS_FAILURES`] per base) and, from `jobs` (the
    /// report's job counts), the workflow's jobs not ended.
    pub fn kb_report(&self, jobs: &[ce_store::JobCount]) -> Result<crate::status::KnowledgeStatus> {
        let mut active_jobs: BTreeMap<String, u64> =
            JOB_TYPES.iter().map(|t| ((*t).to_owned(), 0)).collect();
        for c in jobs.iter().filter(|c| !c.state.is_terminal()) {
            if let Some(n) = active_jobs.get_mut(&c.job_type) {
                *n += c.count;
            }
        }
        Ok(crate::status::KnowledgeStatus {
            bases: self.store().kb_overview(STATUS_FAILURES)?,
            active_jobs,
        })
    }

    /// Applies `ops` in one transaction under the TREE lock of `base`'s root (base
    /// serialization), then wakes the workers and the job runner.
    pub fn kb_write(&self, base: &KnowledgeBase, ops: Vec<WriteOp>) -> Result<Vec<WriteOutcome>> {
        let out = Guarded {
            store: self.store().as_ref(),
            locks: self.locks(),
        }
        .apply_locked(&[LockRequest::tree(base.root.clone())], ops)?;
        self.wakeup().notify();
        Ok(out)
    }
}

/// Whether `e` is the stale guard's refusal (the write was skipped, nothing written).
pub fn is_stale(e: &ServerError) -> bool {
    matches!(e, ServerError::Store(StoreError::KbStale { .. }))
}

/// The default root of a base: `ctx://{account}/resources/{name}`.
pub fn default_root(account: &str, name: &str) -> Result<CtxUri> {
    Ok(CtxUri::parse(&format!("ctx://{account}/resources/{name}")).map_err(CoreError::from)?)
}
