//! The four job types of the workflow. Each does one stage, re-reads the item first (a
//! missing or `deleting` item, or one past this stage, makes the run a no-op: handlers are
//! idempotent and a rerun after a crash converges), commits under the base's lock with the
//! stale guard in the same transaction, and leaves "what next" to the workflow
//! ([`schedule_item`]) with one idempotency key per stage.
//!
//! An item whose stage fails for good — a permanent error (`unsupported_format`,
//! `parse_error`, a missing file, a 404), or a retryable one on the last attempt its job
//! has — is marked `failed` with the error, so no item stays active without a job.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use ce_core::{Classify, CoreError, CtxUri, ErrorCode};
use ce_ingest::{Hint, TokenCount};
use ce_store::kb::subtree_of;
use ce_store::{
    ItemError, ItemKind, ItemStatus, Job, KbItem, KbOp, KnowledgeBase, StoreError, WriteOp,
};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::fingerprint::{Reading, TakenStat};
use super::nodes::document_ops;
use super::workflow::{new_item_id, schedule_item};
use super::{KbJob, KbSettings, Stage, is_stale, source};
use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::jobs::{JobContext, JobHandler};

/// The run's result when it had nothing to do.
fn skipped(why: &str) -> Option<Value> {
    Some(json!({"skipped": why}))
}

/// The item, or why the run is a no-op.
fn load(
    engine: &Engine,
    p: &KbJob,
) -> Result<std::result::Result<(KnowledgeBase, KbItem), &'static str>> {
    let item_id = p.item.as_deref().unwrap_or_default();
    let base = match engine.store().kb_base(&p.base) {
        Ok(b) => b,
        Err(StoreError::KbNotFound { .. }) => return Ok(Err("base gone")),
        Err(e) => return Err(e.into()),
    };
    match engine.store().kb_item(&p.base, item_id) {
        Ok(i) if i.status == ItemStatus::Deleting => Ok(Err("item deleting")),
        Ok(i) => Ok(Ok((base, i))),
        Err(StoreError::KbNotFound { .. }) => Ok(Err("item gone")),
        Err(e) => Err(e.into()),
    }
}

/// The final stale guard of a write about `item`: it still exists and is in none of
/// `refuse` (else the whole batch writes nothing).
pub(super) fn guard(item: &KbItem, refuse: Vec<ItemStatus>) -> WriteOp {
    WriteOp::Kb(KbOp::Guard {
        base: item.base.clone(),
        item: item.id.clone(),
        refuse,
    })
}

/// Sets `item`'s status and error.
pub(super) fn set_status(item: &KbItem, status: ItemStatus, error: Option<ItemError>) -> WriteOp {
    WriteOp::Kb(KbOp::SetStatus {
        base: item.base.clone(),
        item: item.id.clone(),
        status,
        error,
    })
}

/// Whether `job`'s run is its last: a retryable failure now would leave it dead.
fn last_attempt(engine: &Engine, job: &Job) -> bool {
    job.attempts + 1 > engine.config().jobs.settings(&job.job_type).max_retries
}

/// Marks `item` failed with `e` (guarded: a deleting item stays deleting).
fn fail_item(engine: &Engine, base: &KnowledgeBase, item: &KbItem, e: &ServerError) -> Result<()> {
    let error = ItemError {
        code: e.code().as_str().to_owned(),
        message: e.to_string(),
    };
    warn!(base = %item.base, item = %item.id, code = %error.code, error = %error.message, "item failed");
    match engine.kb_write(
        base,
        vec![
            guard(item, vec![ItemStatus::Deleting]),
            set_status(item, ItemStatus::Failed, Some(error)),
        ],
    ) {
        Ok(_) => Ok(()),
        Err(e) if is_stale(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs a stage; a failure that ends the job for good marks the item failed first.
fn run_stage(
    engine: &Engine,
    job: &Job,
    base: &KnowledgeBase,
    item: &KbItem,
    stage: impl FnOnce() -> Result<Option<Value>>,
) -> Result<Option<Value>> {
    match stage() {
        Ok(v) => Ok(v),
        Err(e) if is_stale(&e) => Ok(skipped("item deleting")),
        // A cancel or a lost lease: the runner acknowledges it, the item is not touched.
        Err(e @ ServerError::JobStopped { .. }) => Err(e),
        Err(e) if !e.is_retryable() || last_attempt(engine, job) => {
            fail_item(engine, base, item, &e)?;
            Ok(Some(
                json!({"failed": e.code().as_str(), "error": e.to_string()}),
            ))
        }
        Err(e) => Err(e),
    }
}

/// `kb-index-documents`: read → parse → chunk → (base lock) stale guard + the item's nodes,
/// the fingerprint of what was read and `embedding`, one transaction. No embedding here: the
/// outbox does it.
pub struct IndexDocuments;

impl JobHandler for IndexDocuments {
    fn job_type(&self) -> &'static str {
        super::INDEX_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        KbJob::parse(payload, Stage::Index).map(drop)
    }

    fn runs_on(&self, _engine: &Engine) -> bool {
        true
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let p = KbJob::parse(&job.payload, Stage::Index)?;
        let (base, item) = match load(engine, &p)? {
            Ok(x) => x,
            Err(why) => return Ok(skipped(why)),
        };
        if !matches!(item.status, ItemStatus::Idle | ItemStatus::Reading) {
            return Ok(skipped(item.status.as_str()));
        }
        if item.kind.is_container() {
            return Err(CoreError::InvalidField {
                field: "payload",
                reason: format!(
                    "item {} is a {}: it is prepared, not indexed",
                    item.id,
                    item.kind.as_str()
                ),
            }
            .into());
        }
        run_stage(engine, job, &base, &item, || {
            index(engine, ctx, &base, &item)
        })
    }
}

fn index(
    engine: &Engine,
    ctx: &JobContext<'_>,
    base: &KnowledgeBase,
    item: &KbItem,
) -> Result<Option<Value>> {
    if item.status == ItemStatus::Idle {
        engine.kb_write(
            base,
            vec![
                guard(item, vec![ItemStatus::Deleting]),
                set_status(item, ItemStatus::Reading, None),
            ],
        )?;
    }
    ctx.report(json!({"stage": "reading", "item": item.id}));
    let src = source::read(item)?;
    ctx.checkpoint()?;
    let doc = ce_ingest::parse(
        &src.bytes,
        Hint {
            file_name: src.file_name.as_deref(),
            content_type: src.content_type.as_deref(),
        },
    )
    .map_err(ServerError::from)?;
    let settings = KbSettings::of(base)?;
    let counter = engine.token_counter();
    let count = |t: &str| counter.count(t);
    let chunking = ce_ingest::chunk(&doc, &count as &dyn TokenCount, &settings.chunk_options())
        .map_err(ServerError::from)?;
    ctx.checkpoint()?;
    let children: Vec<CtxUri> = match engine.store().ls(&item.node_uri) {
        Ok(stats) => stats.into_iter().map(|s| s.uri).collect(),
        Err(StoreError::NodeNotFound { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let fingerprint = match &src.stat {
        Some(stat) => engine.kb_reading(base)?.fingerprint(stat),
        None => None,
    };
    let mut ops = vec![guard(item, vec![ItemStatus::Deleting])];
    ops.extend(document_ops(item, &src, &doc, &chunking, &children)?);
    let nodes = ops.len() - 1;
    ops.push(WriteOp::Kb(KbOp::SetFingerprint {
        base: item.base.clone(),
        item: item.id.clone(),
        fingerprint,
    }));
    ops.push(set_status(item, ItemStatus::Embedding, None));
    ctx.report(json!({"stage": "committing", "item": item.id, "nodes": nodes}));
    let out = engine.kb_write(base, ops)?;
    let events: usize = out.iter().map(|o| o.event_ids.len()).sum();
    info!(base = %item.base, item = %item.id, format = doc.format.as_str(), nodes, events, "item indexed");
    Ok(Some(json!({
        "format": doc.format.as_str(),
        "chunks": match &chunking { ce_ingest::Chunking::Whole { .. } => 0, ce_ingest::Chunking::Split { chunks } => chunks.len() },
        "events": events,
    })))
}

/// The most entries one directory item is expanded into.
pub const MAX_DIRECTORY_ENTRIES: usize = 10_000;

/// `kb-prepare-root`: expands a directory into child items (files and directories,
/// hidden entries skipped) and schedules each, in one transaction under the base's lock
/// with the stale guard; the directory becomes `processing`. On a re-sync the previous
/// children are kept, matched to the entries by path: a completed file whose fingerprint is
/// unchanged stays as it is (no job, unless the job re-reads), any other is reset and
/// scheduled again, children whose entry is gone are removed. Nodes under the directory
/// that no entry has any more are removed in the same transaction — a derived deletion under
/// the delete-safety policy.
pub struct PrepareRoot;

impl JobHandler for PrepareRoot {
    fn job_type(&self) -> &'static str {
        super::PREPARE_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        KbJob::parse(payload, Stage::Prepare).map(drop)
    }

    fn runs_on(&self, _engine: &Engine) -> bool {
        true
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let p = KbJob::parse(&job.payload, Stage::Prepare)?;
        let (base, item) = match load(engine, &p)? {
            Ok(x) => x,
            Err(why) => return Ok(skipped(why)),
        };
        if item.status != ItemStatus::Preparing {
            return Ok(skipped(item.status.as_str()));
        }
        run_stage(engine, job, &base, &item, || {
            prepare(engine, job, ctx, &base, &item, p.reread)
        })
    }
}

/// One entry of a listed directory.
struct Entry {
    name: String,
    path: std::path::PathBuf,
    is_dir: bool,
    /// A file's stat, taken by the listing.
    stat: Option<TakenStat>,
}

/// Lists `dir`: its entries by name, hidden ones skipped, symlinks followed to files only.
fn list(dir: &std::path::Path) -> Result<Vec<Entry>> {
    let context = format!("listing {}", dir.display());
    let read = std::fs::read_dir(dir).map_err(|e| ServerError::Failed {
        context: context.clone(),
        code: if e.kind() == std::io::ErrorKind::NotFound {
            ErrorCode::NotFound
        } else {
            ErrorCode::Io
        },
        retryable: !matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
        ),
        message: e.to_string(),
    })?;
    let mut entries = Vec::new();
    for e in read {
        let e = e.map_err(|e| ServerError::Io {
            context: context.clone(),
            source: e,
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let ft = e.file_type().map_err(|e| ServerError::Io {
            context: context.clone(),
            source: e,
        })?;
        let path = e.path();
        let taken_at = SystemTime::now();
        // The target's stat; an entry that vanished meanwhile or a dangling link is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        // Symlinks are followed to files only: a linked directory could loop.
        let is_dir = meta.is_dir() && !ft.is_symlink();
        if !is_dir && !meta.is_file() {
            continue;
        }
        entries.push(Entry {
            name,
            stat: (!is_dir).then(|| TakenStat::of(&meta, taken_at)),
            path,
            is_dir,
        });
        if entries.len() > MAX_DIRECTORY_ENTRIES {
            return Err(ServerError::Failed {
                context,
                code: ErrorCode::PayloadTooLarge,
                retryable: false,
                message: format!(
                    "more than {MAX_DIRECTORY_ENTRIES} entries: add its sub-directories \
                     one by one"
                ),
            });
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Whether `item`, a file, can keep its nodes without being read: it completed, its file's
/// fingerprint (`stat`, read the way `reading` says) is the one its nodes were made from,
/// and its node is still there.
fn unchanged(
    item: &KbItem,
    stat: Option<&TakenStat>,
    reading: &Reading,
    node_exists: bool,
) -> bool {
    item.status == ItemStatus::Completed
        && node_exists
        && item.fingerprint.is_some()
        && item.fingerprint == stat.and_then(|s| reading.fingerprint(s))
}

/// The statuses of work under way: a guard refusing them keeps a change to an item that
/// was terminal when read from racing with work started on it meanwhile.
pub(super) fn not_terminal() -> Vec<ItemStatus> {
    ItemStatus::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .collect()
}

fn prepare(
    engine: &Engine,
    job: &Job,
    ctx: &JobContext<'_>,
    base: &KnowledgeBase,
    item: &KbItem,
    reread: bool,
) -> Result<Option<Value>> {
    let dir = std::path::Path::new(&item.source);
    let entries = list(dir)?;
    ctx.checkpoint()?;
    // What the previous expansion made (a re-sync), by source; all terminal or deleting.
    let old = engine.store().kb_children(&item.base, &item.id)?;
    if let Some(busy) = old.iter().find(|c| c.status.is_active()) {
        return Err(busy_entry(dir, busy, Some(busy.status)));
    }
    let mut by_source: HashMap<&str, &KbItem> =
        old.iter().map(|c| (c.source.as_str(), c)).collect();
    let existing: BTreeSet<CtxUri> = match engine.store().ls(&item.node_uri) {
        Ok(stats) => stats.into_iter().map(|s| s.uri).collect(),
        Err(StoreError::NodeNotFound { .. }) => BTreeSet::new(),
        Err(e) => return Err(e.into()),
    };
    let reading = engine.kb_reading(base)?;
    let now = engine.store().clock().now_ms();
    // A deleting child's node is its cleanup's; an entry of its source waits for the next
    // re-sync.
    let mut taken: BTreeSet<CtxUri> = old
        .iter()
        .filter(|c| c.status == ItemStatus::Deleting)
        .map(|c| c.node_uri.clone())
        .collect();
    let mut kept = 0usize;
    let mut again: Vec<KbItem> = Vec::new();
    let mut fresh: Vec<&Entry> = Vec::new();
    for e in &entries {
        let kind = if e.is_dir {
            ItemKind::Directory
        } else {
            ItemKind::File
        };
        let source = e.path.display().to_string();
        match by_source.get(source.as_str()).copied() {
            Some(c) if c.status == ItemStatus::Deleting => {
                by_source.remove(source.as_str());
            }
            Some(c) if c.kind == kind => {
                by_source.remove(source.as_str());
                taken.insert(c.node_uri.clone());
                let skip = !reread
                    && !c.kind.is_container()
                    && unchanged(c, e.stat.as_ref(), &reading, existing.contains(&c.node_uri));
                if skip {
                    kept += 1;
                } else {
                    again.push(c.clone());
                }
            }
            // A new entry, or a file that became a directory (or back): a new item.
            _ => fresh.push(e),
        }
    }
    // Children whose entry is gone (or changed kind): their rows go, and their nodes with
    // the derived deletion below (unless a new entry takes the node).
    let dropped: Vec<&KbItem> = by_source
        .into_values()
        .filter(|c| c.status != ItemStatus::Deleting)
        .collect();
    let mut children = Vec::with_capacity(fresh.len());
    for e in fresh {
        let id = new_item_id();
        let node_uri =
            super::workflow::unique_node(&item.node_uri, &e.name, &format!("item-{id}"), &taken);
        taken.insert(node_uri.clone());
        let mut child = KbItem {
            base: item.base.clone(),
            id,
            parent_id: Some(item.id.clone()),
            kind: if e.is_dir {
                ItemKind::Directory
            } else {
                ItemKind::File
            },
            source: e.path.display().to_string(),
            node_uri,
            status: ItemStatus::Idle,
            error: None,
            through_seq: None,
            fingerprint: None,
            created_at_ms: now,
            updated_at_ms: now,
        };
        child.status = schedule_item(&child, Some(&job.id), reread).0;
        children.push(child);
    }
    // The re-sync's derived deletion: nodes under the directory no entry claims.
    let gone: Vec<CtxUri> = existing
        .into_iter()
        .filter(|u| !taken.contains(u))
        .collect();
    if !gone.is_empty() {
        let scope = engine.store().subtree_uris(&item.node_uri)?.len() as u64;
        let mut removed = 0u64;
        for g in &gone {
            removed += engine.store().subtree_uris(g)?.len() as u64 + 1;
        }
        ce_core::safety::DeleteSafety::check(removed, scope).map_err(StoreError::from)?;
    }
    let mut ops = vec![guard(item, vec![ItemStatus::Deleting])];
    // Children this changes were terminal when read: still so, or the expansion runs again.
    ops.extend(
        again
            .iter()
            .chain(dropped.iter().copied())
            .map(|c| guard(c, not_terminal())),
    );
    if !dropped.is_empty() {
        ops.push(WriteOp::Kb(KbOp::DeleteItems {
            base: item.base.clone(),
            ids: dropped.iter().map(|c| c.id.clone()).collect(),
        }));
    }
    ops.extend(
        children
            .iter()
            .map(|c| WriteOp::Kb(KbOp::InsertItem(c.clone()))),
    );
    for c in &again {
        let (status, spec) = schedule_item(c, Some(&job.id), reread);
        ops.push(set_status(c, status, None));
        ops.push(WriteOp::Enqueue(spec));
    }
    ops.extend(
        children
            .iter()
            .map(|c| WriteOp::Enqueue(schedule_item(c, Some(&job.id), reread).1)),
    );
    ops.extend(gone.iter().map(|u| WriteOp::Rm {
        uri: u.clone(),
        recursive: true,
        expect_version: None,
        trace_id: None,
    }));
    ops.push(set_status(item, ItemStatus::Processing, None));
    match engine.kb_write(base, ops) {
        Ok(_) => {}
        // A child changed meanwhile (a reindex of it started): expand once it is done.
        Err(ServerError::Store(StoreError::KbStale {
            item: stale,
            status,
            ..
        })) if stale != item.id => {
            if let Some(c) = old.iter().find(|c| c.id == stale) {
                return Err(busy_entry(dir, c, status));
            }
            return Err(ServerError::Internal(format!(
                "the stale guard named {stale}, not an entry of {}",
                item.id
            )));
        }
        Err(e) => return Err(e),
    }
    info!(
        base = %item.base,
        item = %item.id,
        entries = entries.len(),
        new = children.len(),
        again = again.len(),
        unchanged = kept,
        removed = gone.len(),
        "directory prepared"
    );
    Ok(Some(json!({
        "entries": entries.len(),
        "new": children.len(),
        "again": again.len(),
        "unchanged": kept,
        "dropped": dropped.len(),
        "removed": gone.len(),
    })))
}

/// The retryable refusal to expand `dir` while its entry `busy` has work under way (it is
/// in `status`; `None`: gone).
fn busy_entry(dir: &std::path::Path, busy: &KbItem, status: Option<ItemStatus>) -> ServerError {
    ServerError::Failed {
        context: format!("expanding {}", dir.display()),
        code: ErrorCode::Busy,
        retryable: true,
        message: format!(
            "entry {} ({}) is {}: the directory is expanded once it is done",
            busy.id,
            busy.source,
            status.map_or("gone", ItemStatus::as_str)
        ),
    }
}

/// Cancels the live jobs of `items` (pending / failed ones at once; a running one at its
/// next checkpoint, where its stale guard would refuse the commit anyway) other than `me`.
fn cancel_jobs_of(engine: &Engine, base: &str, items: &[String], me: &str) -> Result<usize> {
    let mut n = 0;
    for item in items {
        for stage in [Stage::Prepare, Stage::Index, Stage::Reindex] {
            let key = super::job_key(base, item, stage);
            let Some(job) = engine.store().jobs().live_job(&key)? else {
                continue;
            };
            if job.id == me {
                continue;
            }
            match engine.cancel_job(&job.id) {
                Ok(_) => n += 1,
                // It ended meanwhile.
                Err(ServerError::Store(StoreError::JobTransition { .. })) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

/// `kb-delete-subtree`: cancels the subtree's active jobs, removes its nodes, then its
/// rows (last); a whole-base delete does this for every root, then removes the base. At
/// least once: a rerun after a crash finds less to do, a missing row is done already.
pub struct DeleteSubtree;

impl JobHandler for DeleteSubtree {
    fn job_type(&self) -> &'static str {
        super::DELETE_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        KbJob::parse(payload, Stage::Delete).map(drop)
    }

    fn runs_on(&self, _engine: &Engine) -> bool {
        true
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let p = KbJob::parse(&job.payload, Stage::Delete)?;
        let base = match engine.store().kb_base(&p.base) {
            Ok(b) => b,
            Err(StoreError::KbNotFound { .. }) => return Ok(skipped("base gone")),
            Err(e) => return Err(e.into()),
        };
        let all = engine.store().kb_items(&p.base)?;
        let roots: Vec<&KbItem> = match &p.item {
            Some(id) => all.iter().filter(|i| &i.id == id).collect(),
            None => all.iter().filter(|i| i.parent_id.is_none()).collect(),
        };
        let mut removed_nodes = 0u64;
        let mut removed_items = 0usize;
        for root in roots {
            if root.status != ItemStatus::Deleting {
                // Only a durable delete intent is cleaned up.
                continue;
            }
            let sub: Vec<String> = subtree_of(&all, &root.id)
                .iter()
                .map(|i| i.id.clone())
                .collect();
            cancel_jobs_of(engine, &p.base, &sub, &job.id)?;
            ctx.checkpoint()?;
            let rm = WriteOp::Rm {
                uri: root.node_uri.clone(),
                recursive: true,
                expect_version: None,
                trace_id: None,
            };
            match engine.kb_write(&base, vec![rm]) {
                Ok(out) => removed_nodes += out.iter().map(|o| o.nodes_affected).sum::<u64>(),
                Err(ServerError::Store(StoreError::NodeNotFound { .. })) => {}
                Err(e) => return Err(e),
            }
            ctx.checkpoint()?;
            engine.kb_write(
                &base,
                vec![WriteOp::Kb(KbOp::DeleteItems {
                    base: p.base.clone(),
                    ids: vec![root.id.clone()],
                })],
            )?;
            removed_items += sub.len();
        }
        if p.item.is_none() {
            let rm = WriteOp::Rm {
                uri: base.root.clone(),
                recursive: true,
                expect_version: None,
                trace_id: None,
            };
            match engine.kb_write(&base, vec![rm]) {
                Ok(_) | Err(ServerError::Store(StoreError::NodeNotFound { .. })) => {}
                Err(e) => return Err(e),
            }
            engine.kb_write(
                &base,
                vec![WriteOp::Kb(KbOp::DeleteBase {
                    base: p.base.clone(),
                })],
            )?;
            info!(base = %p.base, "knowledge base removed");
        }
        Ok(Some(
            json!({"items": removed_items, "nodes": removed_nodes}),
        ))
    }
}

/// `kb-reindex-subtree`: the entry checked the subtree was terminal; this resets the root
/// and schedules it again — in one transaction, guarded. A directory's children stay: the
/// new expansion matches them to its entries (re-reading every file when the job says
/// `reread`, else skipping the unchanged ones); a file root that completed and is unchanged
/// is left as it is unless the job re-reads. If the schedule cannot be written after the
/// reset is, the root is marked failed (the spec's compensation); a deleting root is
/// skipped.
pub struct ReindexSubtree;

impl JobHandler for ReindexSubtree {
    fn job_type(&self) -> &'static str {
        super::REINDEX_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        KbJob::parse(payload, Stage::Reindex).map(drop)
    }

    fn runs_on(&self, _engine: &Engine) -> bool {
        true
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let p = KbJob::parse(&job.payload, Stage::Reindex)?;
        let (base, item) = match load(engine, &p)? {
            Ok(x) => x,
            Err(why) => return Ok(skipped(why)),
        };
        if !item.status.is_terminal() {
            // Reset already (a rerun) or changed since the entry: nothing to reset.
            return Ok(skipped(item.status.as_str()));
        }
        ctx.checkpoint()?;
        if !p.reread && item.kind == ItemKind::File && file_unchanged(engine, &base, &item)? {
            return Ok(Some(json!({"unchanged": item.id})));
        }
        let (status, spec) = schedule_item(&item, Some(&job.id), p.reread);
        let ops = vec![
            guard(&item, vec![ItemStatus::Deleting]),
            set_status(&item, status, None),
            WriteOp::Enqueue(spec),
        ];
        match engine.kb_write(&base, ops) {
            Ok(_) => Ok(Some(json!({"reset": item.id}))),
            Err(e) if is_stale(&e) => Ok(skipped("item deleting")),
            Err(e) => {
                // Reset and schedule commit together here, so a failed write left the item
                // as it was (terminal); the compensation is only needed if it did not.
                if let Ok(now) = engine.store().kb_item(&p.base, &item.id)
                    && now.status.is_active()
                {
                    fail_item(engine, &base, &now, &e)?;
                }
                Err(e)
            }
        }
    }
}

/// Whether a file item can keep its nodes without being read ([`unchanged`]), by its file's
/// stat now.
fn file_unchanged(engine: &Engine, base: &KnowledgeBase, item: &KbItem) -> Result<bool> {
    let taken_at = SystemTime::now();
    let Ok(meta) = std::fs::metadata(&item.source) else {
        // Gone or unreadable: the index job reports it.
        return Ok(false);
    };
    if !meta.is_file() {
        return Ok(false);
    }
    let node_exists = match engine.store().stat(&item.node_uri) {
        Ok(_) => true,
        Err(StoreError::NodeNotFound { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    Ok(unchanged(
        item,
        Some(&TakenStat::of(&meta, taken_at)),
        &engine.kb_reading(base)?,
        node_exists,
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn a_file_is_skipped_only_completed_with_its_node_and_the_same_fingerprint() {
        let stat = TakenStat {
            stat: ce_core::racy::FileStat::unix(3, 10, (0, 1_000), (0, 1_000)),
            taken_at: UNIX_EPOCH + Duration::from_secs(600),
        };
        let reading = Reading::new(&KbSettings::default(), "estimate");
        let item = KbItem {
            base: "b".into(),
            id: "i".into(),
            parent_id: None,
            kind: ItemKind::File,
            source: "/x/a.md".into(),
            node_uri: CtxUri::parse("ctx://a/resources/b/a.md").expect("uri"),
            status: ItemStatus::Completed,
            error: None,
            through_seq: Some(4),
            fingerprint: reading.fingerprint(&stat),
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        assert!(item.fingerprint.is_some());
        assert!(unchanged(&item, Some(&stat), &reading, true));
        // The same size and times, but the base's settings changed: read again.
        let resized = Reading::new(
            &KbSettings {
                max_tokens: 64,
                ..KbSettings::default()
            },
            "estimate",
        );
        assert!(!unchanged(&item, Some(&stat), &resized, true));
        // Another token counter: read again.
        let model = Reading::new(&KbSettings::default(), "model tokenizer sha256:00");
        assert!(!unchanged(&item, Some(&stat), &model, true));
        // A failed item is read again, whatever its fingerprint.
        let failed = KbItem {
            status: ItemStatus::Failed,
            ..item.clone()
        };
        assert!(!unchanged(&failed, Some(&stat), &reading, true));
        // Its node gone, no stat, no fingerprint recorded, another stat: read again.
        assert!(!unchanged(&item, Some(&stat), &reading, false));
        assert!(!unchanged(&item, None, &reading, true));
        let unknown = KbItem {
            fingerprint: None,
            ..item.clone()
        };
        assert!(!unchanged(&unknown, Some(&stat), &reading, true));
        let mut grown = stat;
        grown.stat.size = 11;
        assert!(!unchanged(&item, Some(&grown), &reading, true));
    }
}
