//! Knowledge bases and their items (issue 17, spec knowledge-workflow; docs/ingestion.md
//! "Workflow"): the durable rows the ingestion workflow decides on. A base is a subtree of
//! ContextFS with its own settings; an item is one user input (file, directory, URL, note)
//! with a durable [`ItemStatus`] and the error of its last failure. Job state and progress
//! live in the jobs, never here (the spec: status is not derived from job state).
//!
//! Writes are [`KbOp`]s inside a source batch ([`crate::WriteOp::Kb`]), so item rows, the
//! nodes an item owns and the jobs that follow commit in one transaction; a
//! [`KbOp::Guard`] that does not hold fails the whole batch with [`StoreError::KbStale`] and
//! writes nothing (the final stale guard). What an op means is written once in `logic.rs`
//! over the row primitives of `rows.rs` each backend implements.

use std::collections::BTreeMap;
use std::str::FromStr;

use ce_core::{CoreError, CtxUri, Millis};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

pub(crate) mod logic;
pub(crate) mod rows;

/// The durable lifecycle of an item.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Created or reset; its first job is enqueued.
    Idle,
    /// A container being expanded into child items (`kb-prepare-root`).
    Preparing,
    /// A container whose children are being indexed.
    Processing,
    /// Being read, parsed and chunked (`kb-index-documents`).
    Reading,
    /// Its nodes are committed; the consumers are indexing them.
    Embedding,
    /// Indexed (terminal).
    Completed,
    /// Failed, with its error (terminal).
    Failed,
    /// Deleted by the user: invisible at once, its cleanup job removes it.
    Deleting,
}

impl ItemStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [ItemStatus; 8] = [
        ItemStatus::Idle,
        ItemStatus::Preparing,
        ItemStatus::Processing,
        ItemStatus::Reading,
        ItemStatus::Embedding,
        ItemStatus::Completed,
        ItemStatus::Failed,
        ItemStatus::Deleting,
    ];

    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Idle => "idle",
            ItemStatus::Preparing => "preparing",
            ItemStatus::Processing => "processing",
            ItemStatus::Reading => "reading",
            ItemStatus::Embedding => "embedding",
            ItemStatus::Completed => "completed",
            ItemStatus::Failed => "failed",
            ItemStatus::Deleting => "deleting",
        }
    }

    /// Completed or failed: the only statuses a reindex accepts.
    pub fn is_terminal(self) -> bool {
        matches!(self, ItemStatus::Completed | ItemStatus::Failed)
    }

    /// Work is under way for it (a durable job must exist).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            ItemStatus::Idle
                | ItemStatus::Preparing
                | ItemStatus::Processing
                | ItemStatus::Reading
                | ItemStatus::Embedding
        )
    }
}

impl FromStr for ItemStatus {
    type Err = CoreError;

    fn from_str(s: &str) -> std::result::Result<ItemStatus, CoreError> {
        ItemStatus::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| CoreError::InvalidField {
                field: "status",
                reason: format!(
                    "{s:?} is not an item status ({})",
                    ItemStatus::ALL.map(ItemStatus::as_str).join(", ")
                ),
            })
    }
}

/// What kind of input an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A local file (`source`: its absolute path).
    File,
    /// A local directory, expanded into child items (`source`: its absolute path).
    Directory,
    /// An HTTP(S) URL (`source`: the URL).
    Url,
    /// Inline text (`source`: the text).
    Note,
}

impl ItemKind {
    /// Every kind.
    pub const ALL: [ItemKind; 4] = [
        ItemKind::File,
        ItemKind::Directory,
        ItemKind::Url,
        ItemKind::Note,
    ];

    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::File => "file",
            ItemKind::Directory => "directory",
            ItemKind::Url => "url",
            ItemKind::Note => "note",
        }
    }

    /// Whether it is expanded into child items rather than indexed itself.
    pub fn is_container(self) -> bool {
        matches!(self, ItemKind::Directory)
    }
}

impl FromStr for ItemKind {
    type Err = CoreError;

    fn from_str(s: &str) -> std::result::Result<ItemKind, CoreError> {
        ItemKind::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| CoreError::InvalidField {
                field: "kind",
                reason: format!("{s:?} is not an item kind (file, directory, url, note)"),
            })
    }
}

/// The lifecycle of a base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BaseStatus {
    /// Accepts items.
    Active,
    /// Being removed: refuses new items, its cleanup job removes it.
    Deleting,
}

impl BaseStatus {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            BaseStatus::Active => "active",
            BaseStatus::Deleting => "deleting",
        }
    }
}

impl FromStr for BaseStatus {
    type Err = CoreError;

    fn from_str(s: &str) -> std::result::Result<BaseStatus, CoreError> {
        match s {
            "active" => Ok(BaseStatus::Active),
            "deleting" => Ok(BaseStatus::Deleting),
            _ => Err(CoreError::InvalidField {
                field: "status",
                reason: format!("{s:?} is not a base status (active, deleting)"),
            }),
        }
    }
}

/// A knowledge base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KnowledgeBase {
    /// Its name, also its id (`[a-z0-9][a-z0-9_-]{0,63}`).
    pub name: String,
    /// The subtree its items' nodes live under.
    pub root: CtxUri,
    /// Its settings (parser and chunk options; a change affects future indexing only).
    pub settings: serde_json::Value,
    /// Its lifecycle.
    pub status: BaseStatus,
    /// Creation time.
    pub created_at_ms: Millis,
    /// Last change.
    pub updated_at_ms: Millis,
}

/// The error an item failed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ItemError {
    /// Its code (`unsupported_format`, `parse_error`, `upstream`, …).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// An item: one user input and the nodes it produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbItem {
    /// Its base.
    pub base: String,
    /// Its id (unique within the base).
    pub id: String,
    /// The container item it was expanded from.
    pub parent_id: Option<String>,
    /// Its kind.
    pub kind: ItemKind,
    /// The input: a path, a URL, or the note's text.
    pub source: String,
    /// The node it owns (with its subtree: a document's chunks, a directory's entries).
    pub node_uri: CtxUri,
    /// Its lifecycle.
    pub status: ItemStatus,
    /// The error of its failure (`failed` only).
    pub error: Option<ItemError>,
    /// The last journal sequence of the commit of its nodes (from `embedding` on).
    pub through_seq: Option<i64>,
    /// What its nodes were last made from, for a file: a digest of the file's size,
    /// modification and change times and inode, and of what reading depends on (the base's
    /// settings, the parser and chunker version, the token counter). A re-sync skips a
    /// completed file whose fingerprint is unchanged (docs/ingestion.md, "Re-sync").
    pub fingerprint: Option<String>,
    /// Creation time.
    pub created_at_ms: Millis,
    /// Last change.
    pub updated_at_ms: Millis,
}

/// A base's items counted by status, with its most recent failures: what the status report
/// shows of it ([`KbStore::kb_overview`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbOverview {
    /// The base's name.
    pub name: String,
    /// Its root.
    pub root: CtxUri,
    /// Its lifecycle.
    pub status: BaseStatus,
    /// Its items by status, every status listed (zeros included; `deleting` counts the
    /// invisible ones still being removed).
    pub counts: BTreeMap<ItemStatus, u64>,
    /// Its most recently failed items, newest first (bounded by the caller).
    pub recent_failures: Vec<KbFailure>,
}

/// A failed item of [`KbOverview`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbFailure {
    /// The item.
    pub id: String,
    /// Its kind.
    pub kind: ItemKind,
    /// The node it owns.
    pub node_uri: CtxUri,
    /// Why it failed.
    pub error: ItemError,
    /// When it failed (its last change).
    pub at_ms: Millis,
}

/// The longest base name.
pub const MAX_BASE_NAME: usize = 64;

/// Checks a base name: 1 to 64 of `[a-z0-9_-]`, starting with a letter or digit.
pub fn check_base_name(name: &str) -> std::result::Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_BASE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidField {
            field: "name",
            reason: format!(
                "{name:?} is not a knowledge base name: 1 to {MAX_BASE_NAME} of [a-z0-9_-], \
                 starting with a letter or digit"
            ),
        })
    }
}

/// One knowledge-base write inside a source batch ([`crate::WriteOp::Kb`]).
#[derive(Debug, Clone, PartialEq)]
pub enum KbOp {
    /// Creates a base; `already_exists` when its name or root is taken.
    CreateBase(KnowledgeBase),
    /// Marks a base `deleting` (it refuses new items from then on).
    MarkBaseDeleting {
        /// The base.
        base: String,
    },
    /// Removes a base's row once it has no items left; a missing base is done already.
    DeleteBase {
        /// The base.
        base: String,
    },
    /// Inserts an item: its base must exist and be active, its parent (if any) must exist
    /// and not be deleting, and no other item may own its node.
    InsertItem(KbItem),
    /// The stale guard: fails the batch with [`StoreError::KbStale`] unless the item exists
    /// with a status outside `refuse`.
    Guard {
        /// The base.
        base: String,
        /// The item.
        item: String,
        /// The statuses that make the batch stale.
        refuse: Vec<ItemStatus>,
    },
    /// Sets what an item's nodes are made from ([`KbItem::fingerprint`]). A missing item is
    /// stale.
    SetFingerprint {
        /// The base.
        base: String,
        /// The item.
        item: String,
        /// The fingerprint; `None` when the input has none (or it cannot be trusted).
        fingerprint: Option<String>,
    },
    /// Sets an item's status and error (cleared unless given); `embedding` also records the
    /// journal sequence reached so far in the batch. A missing item is stale.
    SetStatus {
        /// The base.
        base: String,
        /// The item.
        item: String,
        /// The new status.
        status: ItemStatus,
        /// Its error (`failed`).
        error: Option<ItemError>,
    },
    /// Marks an item and all its descendants `deleting` (errors cleared); a missing item
    /// is done already.
    MarkDeleting {
        /// The base.
        base: String,
        /// The subtree's root.
        root: String,
    },
    /// Removes items with all their descendants; missing ones are done already.
    DeleteItems {
        /// The base.
        base: String,
        /// The items.
        ids: Vec<String>,
    },
}

/// Reads of the knowledge-base rows (writes go through [`crate::ContextFs::apply_fenced`]
/// with [`crate::WriteOp::Kb`]).
pub trait KbStore: Send + Sync {
    /// One base (`not_found` when absent).
    fn kb_base(&self, name: &str) -> Result<KnowledgeBase>;
    /// Every base, by name.
    fn kb_bases(&self) -> Result<Vec<KnowledgeBase>>;
    /// One item (`not_found` when absent).
    fn kb_item(&self, base: &str, id: &str) -> Result<KbItem>;
    /// Every item of a base, deleting ones included, by id (creation order).
    fn kb_items(&self, base: &str) -> Result<Vec<KbItem>>;
    /// The direct children of an item, deleting ones included, by id.
    fn kb_children(&self, base: &str, parent: &str) -> Result<Vec<KbItem>>;
    /// Every item of every base in `status`, by base and id.
    fn kb_items_in(&self, status: ItemStatus) -> Result<Vec<KbItem>>;
    /// The roots of deleting subtrees of every base: deleting items whose parent is not
    /// deleting (the start-up recovery scan re-enqueues their cleanup).
    fn kb_deleting_roots(&self) -> Result<Vec<KbItem>>;
    /// Every base with its items counted by status (one grouped query) and its last
    /// `failures_per_base` failures, from one read snapshot.
    fn kb_overview(&self, failures_per_base: usize) -> Result<Vec<KbOverview>>;
}

/// The error of a base that is not there.
pub(crate) fn base_not_found(name: &str) -> StoreError {
    StoreError::KbNotFound {
        what: "knowledge base",
        id: name.to_owned(),
    }
}

/// The error of an item that is not there.
pub(crate) fn item_not_found(base: &str, id: &str) -> StoreError {
    StoreError::KbNotFound {
        what: "item",
        id: format!("{base}/{id}"),
    }
}

/// Every item of `items` within the subtree of `root` (itself first), in breadth order.
/// Linear in `items` (a base of 10,000 files is followed by calling this in a loop).
pub fn subtree_of<'a>(items: &'a [KbItem], root: &str) -> Vec<&'a KbItem> {
    let mut children: std::collections::HashMap<&str, Vec<&KbItem>> =
        std::collections::HashMap::new();
    for c in items {
        if let Some(p) = c.parent_id.as_deref() {
            children.entry(p).or_default().push(c);
        }
    }
    let mut out: Vec<&KbItem> = items.iter().filter(|i| i.id == root).collect();
    let mut i = 0;
    while i < out.len() {
        if let Some(cs) = children.get(out[i].id.as_str()) {
            out.extend(cs.iter().copied());
        }
        i += 1;
    }
    out
}

/// Folds a selection to its top-level roots: duplicates dropped, and an item whose
/// ancestor is selected too is left to that ancestor (spec: nested selections fold).
/// Unknown ids are kept (their entry decides).
pub fn fold_roots(items: &[KbItem], ids: &[String]) -> Vec<String> {
    let selected: std::collections::BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let parent_of = |id: &str| {
        items
            .iter()
            .find(|i| i.id == id)
            .and_then(|i| i.parent_id.clone())
    };
    let mut out: Vec<String> = Vec::new();
    for id in ids {
        if out.contains(id) {
            continue;
        }
        let mut p = parent_of(id);
        let mut nested = false;
        while let Some(pid) = p {
            if selected.contains(pid.as_str()) {
                nested = true;
                break;
            }
            p = parent_of(&pid);
        }
        if !nested {
            out.push(id.clone());
        }
    }
    out
}
