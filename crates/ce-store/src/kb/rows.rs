//! The row primitives of the knowledge-base tables ([`KbTx`]) each dialect implements with
//! its own SQL, and the column mapping both share. What an op means is decided once, in
//! [`super::logic`].

use ce_core::CtxUri;

use super::{BaseStatus, ItemError, ItemStatus, KbItem, KnowledgeBase};
use crate::error::{Result, StoreError};
use crate::jobs::rows::ColumnReader;

/// The columns of `knowledge_bases`, in [`base_from`]'s order.
pub(crate) const BASE_COLUMNS: &str = "name, root_uri, settings, status, created_at, updated_at";

/// The columns of `kb_items`, in [`item_from`]'s order.
pub(crate) const ITEM_COLUMNS: &str = "base, id, parent_id, kind, source, node_uri, status, \
     error_code, error_message, through_seq, created_at, updated_at, fingerprint";

/// Row operations on the knowledge-base tables inside one transaction.
pub(crate) trait KbTx {
    /// Inserts a base; false when its name or root is taken.
    fn kb_insert_base(&mut self, b: &KnowledgeBase) -> Result<bool>;
    /// One base.
    fn kb_base(&mut self, name: &str) -> Result<Option<KnowledgeBase>>;
    /// Every base, by name.
    fn kb_bases(&mut self) -> Result<Vec<KnowledgeBase>>;
    /// Sets a base's status.
    fn kb_set_base_status(&mut self, name: &str, status: BaseStatus, now: i64) -> Result<()>;
    /// Removes a base's row.
    fn kb_delete_base(&mut self, name: &str) -> Result<()>;
    /// Inserts an item; false when another item owns its node.
    fn kb_insert_item(&mut self, i: &KbItem) -> Result<bool>;
    /// One item.
    fn kb_item(&mut self, base: &str, id: &str) -> Result<Option<KbItem>>;
    /// Every item of a base, by id.
    fn kb_items(&mut self, base: &str) -> Result<Vec<KbItem>>;
    /// The direct children of an item, by id.
    fn kb_children(&mut self, base: &str, parent: &str) -> Result<Vec<KbItem>>;
    /// Every item in `status`, by base and id.
    fn kb_in_status(&mut self, status: ItemStatus) -> Result<Vec<KbItem>>;
    /// Writes an item's status, error, journal sequence, fingerprint and update time.
    fn kb_update_item(&mut self, i: &KbItem) -> Result<()>;
    /// Removes one item's row.
    fn kb_delete_item(&mut self, base: &str, id: &str) -> Result<()>;
    /// The last journal sequence written so far (0 for none).
    fn kb_max_seq(&mut self) -> Result<i64>;
    /// Items per base and status, as `(base, status, count)` (one grouped query).
    fn kb_status_counts(&mut self) -> Result<Vec<(String, String, i64)>>;
    /// Failed items, at most `per_base` per base: by base, newest first within a base.
    fn kb_recent_failures(&mut self, per_base: i64) -> Result<Vec<KbItem>>;
}

/// The grouped count behind [`KbTx::kb_status_counts`] (the same SQL on both dialects).
pub(crate) const STATUS_COUNTS_SQL: &str =
    "SELECT base, status, count(*) FROM kb_items GROUP BY base, status ORDER BY base, status";

/// The query behind [`KbTx::kb_recent_failures`], `{limit}` its one parameter's placeholder:
/// the failed rows (along `kb_items_by_status`) ranked per base by their last change.
pub(crate) fn recent_failures_sql(limit: &str) -> String {
    format!(
        "SELECT {ITEM_COLUMNS} FROM (
             SELECT {ITEM_COLUMNS}, row_number() OVER
                 (PARTITION BY base ORDER BY updated_at DESC, id DESC) AS rank
             FROM kb_items WHERE status = 'failed'
         ) AS failed WHERE rank <= {limit} ORDER BY base, updated_at DESC, id DESC"
    )
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("knowledge base row: bad {what}: {e}"))
}

/// Decodes a `SELECT {BASE_COLUMNS}` row.
pub(crate) fn base_from(r: &impl ColumnReader) -> Result<KnowledgeBase> {
    Ok(KnowledgeBase {
        name: r.text(0)?,
        root: CtxUri::parse_stored(&r.text(1)?).map_err(|e| corrupt("root_uri", e))?,
        settings: serde_json::from_str(&r.text(2)?).map_err(|e| corrupt("settings", e))?,
        status: r.text(3)?.parse().map_err(|e| corrupt("status", e))?,
        created_at_ms: r.int(4)?,
        updated_at_ms: r.int(5)?,
    })
}

/// Decodes a `SELECT {ITEM_COLUMNS}` row.
pub(crate) fn item_from(r: &impl ColumnReader) -> Result<KbItem> {
    let error = match (r.text_opt(7)?, r.text_opt(8)?) {
        (Some(code), message) => Some(ItemError {
            code,
            message: message.unwrap_or_default(),
        }),
        (None, _) => None,
    };
    Ok(KbItem {
        base: r.text(0)?,
        id: r.text(1)?,
        parent_id: r.text_opt(2)?,
        kind: r.text(3)?.parse().map_err(|e| corrupt("kind", e))?,
        source: r.text(4)?,
        node_uri: CtxUri::parse_stored(&r.text(5)?).map_err(|e| corrupt("node_uri", e))?,
        status: r.text(6)?.parse().map_err(|e| corrupt("status", e))?,
        error,
        through_seq: r.int_opt(9)?,
        fingerprint: r.text_opt(12)?,
        created_at_ms: r.int(10)?,
        updated_at_ms: r.int(11)?,
    })
}

/// A base's columns as bound (settings serialized).
pub(crate) fn base_settings(b: &KnowledgeBase) -> Result<String> {
    Ok(serde_json::to_string(&b.settings)?)
}

/// An item's error columns.
pub(crate) fn error_columns(i: &KbItem) -> (Option<&str>, Option<&str>) {
    match &i.error {
        Some(e) => (Some(e.code.as_str()), Some(e.message.as_str())),
        None => (None, None),
    }
}
