//! The workflow service: the one owner of "what next" (spec knowledge-workflow,
//! `KnowledgeWorkflowService`). Its entries each keep their own explicit guards — the spec
//! says not to force them into one validation pipeline:
//!
//! - `add`: cheap synchronous preflight (base exists and is active, input shape), then the
//!   item rows in their first active status and their first jobs in **one** transaction
//!   (stronger than the spec's write-then-enqueue: there is no gap to compensate);
//! - `delete`: the durable `deleting` mark of every folded root's subtree and its
//!   `kb-delete-subtree` job, in one transaction; the items are invisible from then on;
//! - `reindex`: only subtrees entirely `completed` / `failed`, checked again inside the
//!   transaction that enqueues `kb-reindex-subtree` (no active status is written here);
//! - [`schedule_item`]: a container gets `kb-prepare-root`, anything else
//!   `kb-index-documents`; handlers call it for the next stage.
//!
//! Two passes complete the picture: the start-up recovery scan re-enqueues the cleanup of
//! leftover `deleting` roots (e.g. after a delete job went dead), and the settle pass
//! moves `embedding` items to `completed` once every configured consumer has applied the
//! events of their commit (the import holds' `applied_through`), `processing` containers to
//! `completed` once all their children are terminal, and fails an active item whose stage
//! job ended without moving it on (cancelled by hand, dead after a panic), so that nothing
//! stays active without a durable job.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ce_core::{Classify as _, CoreError, CtxUri, ErrorCode};
use ce_store::kb::{fold_roots, subtree_of};
use ce_store::{
    BaseStatus, ItemKind, ItemStatus, JobSpec, KbItem, KbOp, KnowledgeBase, StoreError, WriteOp,
};
use tracing::{info, warn};

use super::handlers::{guard, not_terminal, set_status};
use super::nodes::segment_for;
use super::source::{MAX_NOTE_BYTES, check_url, url_file_name, url_host};
use super::{
    AddResult, CreateBase, KbInput, KbJob, KbJobs, KbStatus, Stage, default_root, is_stale,
};
use crate::engine::Engine;
use crate::error::{Result, ServerError};

/// The status a scheduled item starts in, and its job: `kb-prepare-root` for a container
/// (passing `reread` on), `kb-index-documents` for anything else (spec `scheduleItem`).
pub fn schedule_item(
    item: &KbItem,
    parent_job: Option<&str>,
    reread: bool,
) -> (ItemStatus, JobSpec) {
    let job = KbJob {
        reread: reread && item.kind.is_container(),
        ..KbJob::of(&item.base, Some(&item.id))
    };
    if item.kind.is_container() {
        (ItemStatus::Preparing, job.spec(Stage::Prepare, parent_job))
    } else {
        (ItemStatus::Idle, job.spec(Stage::Index, parent_job))
    }
}

/// A new item id: unique and ordered by creation time.
pub fn new_item_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A node under `parent` named `name` that no uri in `taken` holds: `name`, else
/// `stem_1.ext`, `stem_2.ext`, … (the spec's automatic naming).
pub fn unique_node(
    parent: &CtxUri,
    name: &str,
    fallback: &str,
    taken: &BTreeSet<CtxUri>,
) -> CtxUri {
    let first = segment_for(parent, name, fallback);
    if !taken.contains(&first) {
        return first;
    }
    let seg = first.name().to_owned();
    let (stem, ext) = match seg.rfind('.') {
        Some(i) if i > 0 => (&seg[..i], &seg[i..]),
        _ => (seg.as_str(), ""),
    };
    (1..)
        .map(|n| segment_for(parent, &format!("{stem}_{n}{ext}"), fallback))
        .find(|u| !taken.contains(u))
        .unwrap_or(first)
}

fn refused(base: &str, reason: String) -> ServerError {
    StoreError::KbRefused {
        base: base.to_owned(),
        reason,
    }
    .into()
}

fn invalid(field: &'static str, reason: String) -> ServerError {
    CoreError::InvalidField { field, reason }.into()
}

/// The visible items: deleting ones (and their subtrees) are invisible.
fn visible(items: &[KbItem]) -> Vec<KbItem> {
    items
        .iter()
        .filter(|i| i.status != ItemStatus::Deleting)
        .cloned()
        .collect()
}

impl Engine {
    /// Creates a base (its root defaults to `ctx://{account}/resources/{name}`).
    pub fn kb_create(&self, req: CreateBase) -> Result<KnowledgeBase> {
        ce_store::kb::check_base_name(&req.name)?;
        let root = match (&req.root, &req.account) {
            (Some(r), None) => CtxUri::parse(r).map_err(CoreError::from)?,
            (None, a) => default_root(a.as_deref().unwrap_or("default"), &req.name)?,
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "root",
                    "give a root or an account, not both".into(),
                ));
            }
        };
        let settings = req.settings.unwrap_or_default();
        settings.check()?;
        let now = self.store().clock().now_ms();
        let base = KnowledgeBase {
            name: req.name,
            root,
            settings: serde_json::to_value(settings)
                .map_err(|e| ServerError::Internal(format!("settings do not serialise: {e}")))?,
            status: BaseStatus::Active,
            created_at_ms: now,
            updated_at_ms: now,
        };
        if let Some(other) = self
            .store()
            .kb_bases()?
            .into_iter()
            .find(|b| b.root.is_within(&base.root) || base.root.is_within(&b.root))
            .filter(|b| b.name != base.name)
        {
            return Err(refused(
                &base.name,
                format!(
                    "its root {} overlaps base {} at {}",
                    base.root, other.name, other.root
                ),
            ));
        }
        self.kb_write(&base, vec![WriteOp::Kb(KbOp::CreateBase(base.clone()))])?;
        info!(base = %base.name, root = %base.root, "knowledge base created");
        Ok(base)
    }

    /// Drops the hits (`uri_of`: a hit's node) that lie in the subtree of a `deleting` item
    /// (spec: search excludes deleted items from the moment of the delete, before the
    /// cleanup job removes their nodes). Flat and hierarchical search both call it.
    pub fn kb_hide_deleting<T>(
        &self,
        hits: &mut Vec<T>,
        uri_of: impl Fn(&T) -> &CtxUri,
    ) -> Result<()> {
        if hits.is_empty() {
            return Ok(());
        }
        let gone = self.store().kb_deleting_roots()?;
        if !gone.is_empty() {
            hits.retain(|h| !gone.iter().any(|g| uri_of(h).is_within(&g.node_uri)));
        }
        Ok(())
    }

    /// Every base, by name.
    pub fn kb_bases(&self) -> Result<Vec<KnowledgeBase>> {
        Ok(self.store().kb_bases()?)
    }

    /// A base's visible items by status (`item`: that item and its subtree only).
    pub fn kb_status(&self, name: &str, item: Option<&str>) -> Result<KbStatus> {
        let base = self.store().kb_base(name)?;
        let all = self.store().kb_items(name)?;
        let mut counts: BTreeMap<ItemStatus, u64> =
            ItemStatus::ALL.into_iter().map(|s| (s, 0)).collect();
        for i in &all {
            *counts.entry(i.status).or_default() += 1;
        }
        let mut items = visible(&all);
        if let Some(id) = item {
            let found = items.iter().any(|i| i.id == id);
            if !found {
                return Err(StoreError::KbNotFound {
                    what: "item",
                    id: format!("{name}/{id}"),
                }
                .into());
            }
            items = subtree_of(&items, id).into_iter().cloned().collect();
        }
        let done = items.iter().filter(|i| i.status.is_terminal()).count() as u64;
        Ok(KbStatus {
            base,
            counts,
            done,
            total: items.len() as u64,
            items,
            token_counter: self.token_counter().describe().to_owned(),
        })
    }

    /// `addItems`: the preflight, then the rows and their first jobs in one transaction
    /// under the base's lock. Resolves when both exist (not when indexing is done).
    pub fn kb_add(&self, name: &str, inputs: Vec<KbInput>) -> Result<AddResult> {
        let base = self.store().kb_base(name)?;
        if base.status != BaseStatus::Active {
            return Err(refused(name, "the knowledge base is being deleted".into()));
        }
        if inputs.is_empty() {
            return Err(invalid(
                "inputs",
                "give at least one path, url or note".into(),
            ));
        }
        let all = self.store().kb_items(name)?;
        let mut taken: BTreeSet<CtxUri> = all
            .iter()
            .filter(|i| i.parent_id.is_none())
            .map(|i| i.node_uri.clone())
            .collect();
        let now = self.store().clock().now_ms();
        let mut items = Vec::with_capacity(inputs.len());
        let mut fresh = Vec::new();
        let mut resync = Vec::new();
        for (n, input) in inputs.into_iter().enumerate() {
            let id = new_item_id();
            let (kind, source, node_name) = preflight(&input, n, &id)?;
            // Re-adding an input the base has (same kind and source, a visible top-level
            // item) is a re-sync of that item, not a second copy: reindexed when its subtree
            // is terminal (an unchanged input then appends no event), left to its running
            // work otherwise.
            if let Some(old) = all.iter().find(|i| {
                i.parent_id.is_none()
                    && i.kind == kind
                    && i.source == source
                    && i.status != ItemStatus::Deleting
            }) {
                if !items.iter().any(|i: &KbItem| i.id == old.id) {
                    if subtree_of(&all, &old.id)
                        .iter()
                        .all(|i| i.status.is_terminal())
                    {
                        resync.push(old.id.clone());
                    }
                    items.push(old.clone());
                }
                continue;
            }
            let fallback = format!("item-{id}");
            let node_uri = unique_node(&base.root, &node_name, &fallback, &taken);
            taken.insert(node_uri.clone());
            let mut item = KbItem {
                base: name.to_owned(),
                id,
                parent_id: None,
                kind,
                source,
                node_uri,
                status: ItemStatus::Idle,
                error: None,
                through_seq: None,
                fingerprint: None,
                created_at_ms: now,
                updated_at_ms: now,
            };
            item.status = schedule_item(&item, None, false).0;
            fresh.push(item.clone());
            items.push(item);
        }
        let mut ops: Vec<WriteOp> = fresh
            .iter()
            .map(|i| WriteOp::Kb(KbOp::InsertItem(i.clone())))
            .collect();
        ops.extend(
            fresh
                .iter()
                .map(|i| WriteOp::Enqueue(schedule_item(i, None, false).1)),
        );
        // A re-sync does not re-read unchanged files (`kb reindex` does).
        for r in &resync {
            ops.extend(reindex_ops(name, &all, r, false));
        }
        if ops.is_empty() {
            return Ok(AddResult {
                items,
                jobs: Vec::new(),
            });
        }
        let out = self.kb_write(&base, ops).map_err(|e| {
            if is_stale(&e) {
                refused(name, format!("an item changed meanwhile ({e}); try again"))
            } else {
                e
            }
        })?;
        let jobs = out.into_iter().filter_map(|o| o.job_id).collect();
        info!(
            base = name,
            new = fresh.len(),
            resynced = resync.len(),
            "knowledge items added"
        );
        Ok(AddResult { items, jobs })
    }

    /// `deleteItems`: the folded roots' subtrees marked `deleting` (invisible from now on)
    /// and their cleanup jobs enqueued, in one transaction. Deleting again re-enqueues.
    pub fn kb_delete_items(&self, name: &str, ids: &[String]) -> Result<KbJobs> {
        let base = self.store().kb_base(name)?;
        if ids.is_empty() {
            return Err(invalid("items", "give at least one item id".into()));
        }
        let all = self.store().kb_items(name)?;
        let roots = fold_roots(&all, ids);
        for r in &roots {
            if !all.iter().any(|i| &i.id == r) {
                return Err(StoreError::KbNotFound {
                    what: "item",
                    id: format!("{name}/{r}"),
                }
                .into());
            }
        }
        let mut ops = Vec::new();
        for r in &roots {
            ops.push(WriteOp::Kb(KbOp::MarkDeleting {
                base: name.to_owned(),
                root: r.clone(),
            }));
            ops.push(WriteOp::Enqueue(
                KbJob::of(name, Some(r)).spec(Stage::Delete, None),
            ));
        }
        let out = self.kb_write(&base, ops)?;
        Ok(KbJobs {
            roots,
            jobs: out.into_iter().filter_map(|o| o.job_id).collect(),
        })
    }

    /// `reindexItems`: accepted only when every item of every folded root's subtree is
    /// completed or failed (the whole batch is refused otherwise, naming an item that is
    /// not); the check is repeated inside the transaction that enqueues the jobs.
    pub fn kb_reindex_items(&self, name: &str, ids: &[String]) -> Result<KbJobs> {
        let base = self.store().kb_base(name)?;
        if base.status != BaseStatus::Active {
            return Err(refused(name, "the knowledge base is being deleted".into()));
        }
        if ids.is_empty() {
            return Err(invalid("items", "give at least one item id".into()));
        }
        let all = self.store().kb_items(name)?;
        let roots = fold_roots(&all, ids);
        let mut ops = Vec::new();
        for r in &roots {
            let sub = subtree_of(&all, r);
            if sub.is_empty() {
                return Err(StoreError::KbNotFound {
                    what: "item",
                    id: format!("{name}/{r}"),
                }
                .into());
            }
            if let Some(busy) = sub.iter().find(|i| !i.status.is_terminal()) {
                return Err(refused(
                    name,
                    format!(
                        "reindex needs every item of the subtree of {r} completed or failed: \
                         {} is {}",
                        busy.id,
                        busy.status.as_str()
                    ),
                ));
            }
            // The user asked to read the items again: no fingerprint skips a file.
            ops.extend(reindex_ops(name, &all, r, true));
        }
        let out = self.kb_write(&base, ops).map_err(|e| {
            if is_stale(&e) {
                refused(name, format!("an item changed meanwhile ({e}); try again"))
            } else {
                e
            }
        })?;
        Ok(KbJobs {
            roots,
            jobs: out.into_iter().filter_map(|o| o.job_id).collect(),
        })
    }

    /// Removes a base: it refuses new items at once, every root is marked `deleting`, and
    /// one cleanup job removes everything, the base row last.
    pub fn kb_remove(&self, name: &str) -> Result<KbJobs> {
        let base = self.store().kb_base(name)?;
        let all = self.store().kb_items(name)?;
        let roots: Vec<String> = all
            .iter()
            .filter(|i| i.parent_id.is_none())
            .map(|i| i.id.clone())
            .collect();
        let mut ops = vec![WriteOp::Kb(KbOp::MarkBaseDeleting {
            base: name.to_owned(),
        })];
        ops.extend(roots.iter().map(|r| {
            WriteOp::Kb(KbOp::MarkDeleting {
                base: name.to_owned(),
                root: r.clone(),
            })
        }));
        ops.push(WriteOp::Enqueue(
            KbJob::of(name, None).spec(Stage::Delete, None),
        ));
        let out = self.kb_write(&base, ops)?;
        Ok(KbJobs {
            roots,
            jobs: out.into_iter().filter_map(|o| o.job_id).collect(),
        })
    }

    /// The start-up recovery scan: enqueues the cleanup of every leftover `deleting` root
    /// and `deleting` base whose job is gone (dead, cancelled, or never enqueued); a live
    /// job holding the key is found by its idempotency key and kept. Returns the jobs created.
    pub fn kb_recover(&self) -> Result<usize> {
        let mut specs: Vec<JobSpec> = self
            .store()
            .kb_deleting_roots()?
            .into_iter()
            .map(|i| KbJob::of(&i.base, Some(&i.id)).spec(Stage::Delete, None))
            .collect();
        specs.extend(
            self.store()
                .kb_bases()?
                .into_iter()
                .filter(|b| b.status == BaseStatus::Deleting)
                .map(|b| KbJob::of(&b.name, None).spec(Stage::Delete, None)),
        );
        let mut created = 0;
        for spec in specs {
            if self.store().jobs().enqueue(spec)?.created {
                created += 1;
            }
        }
        if created > 0 {
            info!(
                jobs = created,
                "knowledge base recovery: cleanup re-enqueued"
            );
            self.wakeup().notify();
        }
        Ok(created)
    }

    /// The settle pass: `embedding` items whose commit every configured consumer has
    /// applied become `completed`; `processing` containers whose children are all
    /// terminal become `completed`. Each move is guarded (a delete meanwhile wins). Returns
    /// how many items moved.
    pub fn kb_settle(&self) -> Result<usize> {
        let consumers = self.config().index.outbox.consumers.clone();
        let mut moved = 0;
        let mut bases: BTreeMap<String, Option<KnowledgeBase>> = BTreeMap::new();
        let mut base_of = |engine: &Engine, name: &str| -> Option<KnowledgeBase> {
            bases
                .entry(name.to_owned())
                .or_insert_with(|| engine.store().kb_base(name).ok())
                .clone()
        };
        // One read for the whole pass (a query per item made a pass over 10,000 embedding
        // items scan the deliveries 10,000 times).
        let embedding = self.store().kb_items_in(ItemStatus::Embedding)?;
        let first_open = if embedding.is_empty() {
            None
        } else {
            self.store().first_open(&consumers)?
        };
        for item in embedding {
            let seq = item.through_seq.unwrap_or(0);
            if first_open.is_some_and(|open| open <= seq) {
                continue;
            }
            let Some(base) = base_of(self, &item.base) else {
                continue;
            };
            if self.settle_one(&base, &item, ItemStatus::Embedding)? {
                moved += 1;
            }
        }
        // Orphans: an active item whose stage's job ended without moving it on (cancelled by
        // hand, or dead after a panic) would wait forever; it fails, naming the job. The
        // items are read before the live keys (an item and its job are written together, and
        // a job ends after moving its item on), in one read each: a base of 10,000 idle files
        // is checked every pass.
        let mut waiting = Vec::new();
        for (status, stage) in [
            (ItemStatus::Idle, Stage::Index),
            (ItemStatus::Reading, Stage::Index),
            (ItemStatus::Preparing, Stage::Prepare),
        ] {
            waiting.extend(
                self.store()
                    .kb_items_in(status)?
                    .into_iter()
                    .map(|item| (item, stage)),
            );
        }
        if !waiting.is_empty() {
            let live: std::collections::HashSet<String> = self
                .store()
                .jobs()
                .live_keys(super::JOB_KEY_PREFIX)?
                .into_iter()
                .collect();
            for (item, stage) in waiting {
                if live.contains(&super::job_key(&item.base, &item.id, stage)) {
                    continue;
                }
                let Some(base) = base_of(self, &item.base) else {
                    continue;
                };
                if self.fail_orphan(&base, &item, stage)? {
                    moved += 1;
                }
            }
        }
        // Each base's items read once per pass (not once per directory: a base of 10,000
        // files has a hundred directories processing at once).
        let mut items_of: BTreeMap<String, Vec<KbItem>> = BTreeMap::new();
        for item in self.store().kb_items_in(ItemStatus::Processing)? {
            let Some(base) = base_of(self, &item.base) else {
                continue;
            };
            let children = match items_of.entry(item.base.clone()) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(self.store().kb_items(&item.base)?)
                }
            };
            let all_done = children
                .iter()
                .filter(|c| c.parent_id.as_deref() == Some(&item.id))
                .all(|c| c.status.is_terminal());
            if all_done && self.settle_one(&base, &item, ItemStatus::Processing)? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// Fails an active `item` whose `stage` job is gone, unless it moved on meanwhile.
    fn fail_orphan(&self, base: &KnowledgeBase, item: &KbItem, stage: Stage) -> Result<bool> {
        let refuse = ItemStatus::ALL
            .into_iter()
            .filter(|s| *s != item.status)
            .collect();
        let error = ce_store::ItemError {
            code: ErrorCode::StateTransition.as_str().to_owned(),
            message: format!(
                "its {} job ended without finishing it (cancelled, or dead); `ce kb reindex` \
                 runs it again",
                stage.job_type()
            ),
        };
        let ops = vec![
            guard(item, refuse),
            set_status(item, ItemStatus::Failed, Some(error)),
        ];
        match self.kb_write(base, ops) {
            Ok(_) => {
                warn!(base = %base.name, item = %item.id, "item failed: its job is gone");
                Ok(true)
            }
            Err(e) if is_stale(&e) => Ok(false),
            Err(e) if e.is_retryable() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves `item` from `from` to `completed`, unless it changed meanwhile.
    fn settle_one(&self, base: &KnowledgeBase, item: &KbItem, from: ItemStatus) -> Result<bool> {
        let refuse = ItemStatus::ALL.into_iter().filter(|s| *s != from).collect();
        let ops = vec![
            guard(item, refuse),
            set_status(item, ItemStatus::Completed, None),
        ];
        match self.kb_write(base, ops) {
            Ok(_) => Ok(true),
            Err(e) if is_stale(&e) => Ok(false),
            Err(e) if e.is_retryable() => {
                warn!(base = %base.name, item = %item.id, error = %e, "item not settled; next round");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// The reindex of `root` (whose subtree the caller found terminal): a stale guard per item
/// of the subtree refusing any non-terminal status — the entry's check, repeated in the
/// transaction — and the `kb-reindex-subtree` job (`reread`: every file read again, else
/// unchanged ones are skipped).
fn reindex_ops(base: &str, all: &[KbItem], root: &str, reread: bool) -> Vec<WriteOp> {
    let mut ops: Vec<WriteOp> = subtree_of(all, root)
        .iter()
        .map(|i| guard(i, not_terminal()))
        .collect();
    ops.push(WriteOp::Enqueue(
        KbJob {
            reread,
            ..KbJob::of(base, Some(root))
        }
        .spec(Stage::Reindex, None),
    ));
    ops
}

/// The kind, source and node name of one input (its shape only: what the source holds is
/// the job's business).
fn preflight(input: &KbInput, n: usize, id: &str) -> Result<(ItemKind, String, String)> {
    let given = [
        input.path.is_some(),
        input.url.is_some(),
        input.note.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if given != 1 {
        return Err(invalid(
            "inputs",
            format!("input {n}: give exactly one of path, url, note"),
        ));
    }
    if let Some(path) = &input.path {
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(invalid(
                "path",
                format!("input {n}: {path:?} is not an absolute path"),
            ));
        }
        let kind = if p.is_dir() {
            ItemKind::Directory
        } else {
            ItemKind::File
        };
        let name = input.name.clone().unwrap_or_else(|| {
            p.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "root".into())
        });
        return Ok((kind, path.clone(), name));
    }
    if let Some(url) = &input.url {
        check_url(url)?;
        let name = input
            .name
            .clone()
            .unwrap_or_else(|| match url_file_name(url) {
                Some(f) => format!("{}-{f}", url_host(url)),
                None => url_host(url),
            });
        return Ok((ItemKind::Url, url.clone(), name));
    }
    let note = input.note.clone().unwrap_or_default();
    if note.trim().is_empty() {
        return Err(invalid("note", format!("input {n}: the note is empty")));
    }
    if note.len() > MAX_NOTE_BYTES {
        return Err(CoreError::TooLarge {
            field: "note",
            len: note.len(),
            max: MAX_NOTE_BYTES,
        }
        .into());
    }
    let name = input
        .name
        .clone()
        .unwrap_or_else(|| format!("note-{}", &id[id.len().saturating_sub(8)..]));
    Ok((ItemKind::Note, note, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_a_numbered_suffix_when_taken() {
        let p = CtxUri::parse("ctx://a/resources/b").expect("uri");
        let mut taken = BTreeSet::new();
        let a = unique_node(&p, "guide.md", "x", &taken);
        taken.insert(a.clone());
        let b = unique_node(&p, "guide.md", "x", &taken);
        taken.insert(b.clone());
        let c = unique_node(&p, "guide.md", "x", &taken);
        assert_eq!(a.name(), "guide.md");
        assert_eq!(b.name(), "guide_1.md");
        assert_eq!(c.name(), "guide_2.md");
        assert_eq!(
            unique_node(&p, "README", "x", &[p.join("README").expect("u")].into()).name(),
            "README_1"
        );
    }

    #[test]
    fn inputs_need_exactly_one_source_of_a_valid_shape() {
        let none = KbInput::default();
        assert!(preflight(&none, 0, "0123456789abcdef").is_err());
        let two = KbInput {
            url: Some("https://e.com".into()),
            note: Some("x".into()),
            ..KbInput::default()
        };
        assert!(preflight(&two, 0, "0123456789abcdef").is_err());
        let rel = KbInput {
            path: Some("docs/a.md".into()),
            ..KbInput::default()
        };
        assert!(preflight(&rel, 0, "0123456789abcdef").is_err());
        let empty = KbInput {
            note: Some("  ".into()),
            ..KbInput::default()
        };
        assert!(preflight(&empty, 0, "0123456789abcdef").is_err());
        let note = KbInput {
            note: Some("remember the milk".into()),
            ..KbInput::default()
        };
        let (kind, _, name) = preflight(&note, 0, "0123456789abcdef").expect("note");
        assert_eq!(kind, ItemKind::Note);
        assert_eq!(name, "note-89abcdef");
        let url = KbInput {
            url: Some("https://example.com/docs/a.html".into()),
            ..KbInput::default()
        };
        assert_eq!(
            preflight(&url, 0, "0123456789abcdef").expect("url").2,
            "example.com-a.html"
        );
    }
}
