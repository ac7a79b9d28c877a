//! What each [`KbOp`] means, written once over [`KbTx`]: every check an op makes runs in the
//! transaction of the batch it belongs to, so a failed check writes nothing of the batch.

use ce_core::{CoreError, Millis};

use super::rows::KbTx;
use super::{
    BaseStatus, ItemStatus, KbFailure, KbItem, KbOp, KbOverview, KnowledgeBase, base_not_found,
    check_base_name,
};
use crate::error::{Result, StoreError};

/// The stale error of `item` (missing, or in `status`).
fn stale(base: &str, item: &str, status: Option<ItemStatus>) -> StoreError {
    StoreError::KbStale {
        base: base.to_owned(),
        item: item.to_owned(),
        status,
    }
}

/// An active base, else `not_found` or a refusal.
fn active_base(tx: &mut dyn KbTx, base: &str) -> Result<KnowledgeBase> {
    let b = tx.kb_base(base)?.ok_or_else(|| base_not_found(base))?;
    if b.status == BaseStatus::Deleting {
        return Err(StoreError::KbRefused {
            base: base.to_owned(),
            reason: "the knowledge base is being deleted".into(),
        });
    }
    Ok(b)
}

/// Every item of the subtree of `root` (itself first), read through the children index.
pub(crate) fn subtree(tx: &mut dyn KbTx, base: &str, root: &str) -> Result<Vec<KbItem>> {
    let Some(r) = tx.kb_item(base, root)? else {
        return Ok(Vec::new());
    };
    let mut out = vec![r];
    let mut i = 0;
    while i < out.len() {
        let id = out[i].id.clone();
        out.extend(tx.kb_children(base, &id)?);
        i += 1;
    }
    Ok(out)
}

/// The item an op changes; a missing one is stale.
fn existing(tx: &mut dyn KbTx, base: &str, item: &str) -> Result<KbItem> {
    tx.kb_item(base, item)?
        .ok_or_else(|| stale(base, item, None))
}

/// Writes `next` (stamped `now`) over `old` when it differs; whether it did.
fn write_if_changed(
    tx: &mut dyn KbTx,
    old: &KbItem,
    mut next: KbItem,
    now: Millis,
) -> Result<bool> {
    if next == *old {
        return Ok(false);
    }
    next.updated_at_ms = now;
    tx.kb_update_item(&next)?;
    Ok(true)
}

/// Applies one op at `now`; returns whether it changed anything.
pub(crate) fn apply(tx: &mut dyn KbTx, op: KbOp, now: Millis) -> Result<bool> {
    match op {
        KbOp::CreateBase(b) => {
            check_base_name(&b.name)?;
            if b.root.is_root() || b.root.depth() < 2 {
                return Err(CoreError::InvalidField {
                    field: "root",
                    reason: format!("{} is not below an account", b.root),
                }
                .into());
            }
            if !tx.kb_insert_base(&b)? {
                return Err(StoreError::KbExists {
                    name: b.name,
                    root: b.root,
                });
            }
            Ok(true)
        }
        KbOp::MarkBaseDeleting { base } => {
            tx.kb_base(&base)?.ok_or_else(|| base_not_found(&base))?;
            tx.kb_set_base_status(&base, BaseStatus::Deleting, now)?;
            Ok(true)
        }
        KbOp::DeleteBase { base } => {
            if tx.kb_base(&base)?.is_none() {
                return Ok(false);
            }
            if !tx.kb_items(&base)?.is_empty() {
                return Err(StoreError::KbRefused {
                    base,
                    reason: "it still has items".into(),
                });
            }
            tx.kb_delete_base(&base)?;
            Ok(true)
        }
        KbOp::InsertItem(item) => {
            let b = active_base(tx, &item.base)?;
            if !item.node_uri.is_within(&b.root) || item.node_uri == b.root {
                return Err(CoreError::InvalidField {
                    field: "node_uri",
                    reason: format!("{} is not below the base's root {}", item.node_uri, b.root),
                }
                .into());
            }
            if let Some(p) = &item.parent_id {
                match tx.kb_item(&item.base, p)? {
                    Some(parent) if parent.status != ItemStatus::Deleting => {}
                    Some(parent) => return Err(stale(&item.base, p, Some(parent.status))),
                    None => return Err(stale(&item.base, p, None)),
                }
            }
            if !tx.kb_insert_item(&item)? {
                return Err(StoreError::KbRefused {
                    base: item.base,
                    reason: format!("another item owns {}", item.node_uri),
                });
            }
            Ok(true)
        }
        KbOp::Guard { base, item, refuse } => match tx.kb_item(&base, &item)? {
            Some(i) if !refuse.contains(&i.status) => Ok(false),
            Some(i) => Err(stale(&base, &item, Some(i.status))),
            None => Err(stale(&base, &item, None)),
        },
        KbOp::SetFingerprint {
            base,
            item,
            fingerprint,
        } => {
            let i = existing(tx, &base, &item)?;
            let next = KbItem {
                fingerprint,
                ..i.clone()
            };
            write_if_changed(tx, &i, next, now)
        }
        KbOp::SetStatus {
            base,
            item,
            status,
            error,
        } => {
            let i = existing(tx, &base, &item)?;
            let through_seq = if status == ItemStatus::Embedding {
                Some(tx.kb_max_seq()?)
            } else {
                i.through_seq
            };
            let next = KbItem {
                status,
                error,
                through_seq,
                ..i.clone()
            };
            write_if_changed(tx, &i, next, now)
        }
        KbOp::MarkDeleting { base, root } => {
            let mut changed = false;
            for mut i in subtree(tx, &base, &root)? {
                if i.status != ItemStatus::Deleting || i.error.is_some() {
                    i.status = ItemStatus::Deleting;
                    i.error = None;
                    i.updated_at_ms = now;
                    tx.kb_update_item(&i)?;
                    changed = true;
                }
            }
            Ok(changed)
        }
        KbOp::DeleteItems { base, ids } => {
            let mut changed = false;
            for id in ids {
                let mut all = subtree(tx, &base, &id)?;
                // Leaves first, so a crash image never holds an orphan child.
                all.reverse();
                for i in all {
                    tx.kb_delete_item(&base, &i.id)?;
                    changed = true;
                }
            }
            Ok(changed)
        }
    }
}

/// [`super::KbStore::kb_overview`] over one snapshot: the bases, the grouped counts, and the
/// ranked failures.
pub(crate) fn overview(tx: &mut dyn KbTx, failures_per_base: usize) -> Result<Vec<KbOverview>> {
    let mut out: Vec<KbOverview> = tx
        .kb_bases()?
        .into_iter()
        .map(|b| KbOverview {
            name: b.name,
            root: b.root,
            status: b.status,
            counts: ItemStatus::ALL.into_iter().map(|s| (s, 0)).collect(),
            recent_failures: Vec::new(),
        })
        .collect();
    let slot = |out: &mut Vec<KbOverview>, base: &str| out.iter().position(|o| o.name == base);
    for (base, status, n) in tx.kb_status_counts()? {
        let status: ItemStatus = status
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("knowledge base row: bad status: {e}")))?;
        if let Some(i) = slot(&mut out, &base) {
            out[i].counts.insert(status, u64::try_from(n).unwrap_or(0));
        }
    }
    if failures_per_base > 0 {
        let limit = i64::try_from(failures_per_base).unwrap_or(i64::MAX);
        for item in tx.kb_recent_failures(limit)? {
            let (Some(i), Some(error)) = (slot(&mut out, &item.base), item.error) else {
                continue;
            };
            out[i].recent_failures.push(KbFailure {
                id: item.id,
                kind: item.kind,
                node_uri: item.node_uri,
                error,
                at_ms: item.updated_at_ms,
            });
        }
    }
    Ok(out)
}

/// Implements [`super::KbStore`] for a backend type that has
/// `fn read_kb<T>(&self, f: impl FnOnce(&mut dyn KbTx) -> Result<T>) -> Result<T>`.
macro_rules! impl_kb_store {
    ($store:ty) => {
        impl $crate::kb::KbStore for $store {
            fn kb_base(&self, name: &str) -> $crate::Result<$crate::kb::KnowledgeBase> {
                self.read_kb(|tx| {
                    tx.kb_base(name)?
                        .ok_or_else(|| $crate::kb::base_not_found(name))
                })
            }

            fn kb_bases(&self) -> $crate::Result<Vec<$crate::kb::KnowledgeBase>> {
                self.read_kb(|tx| tx.kb_bases())
            }

            fn kb_item(&self, base: &str, id: &str) -> $crate::Result<$crate::kb::KbItem> {
                self.read_kb(|tx| {
                    tx.kb_item(base, id)?
                        .ok_or_else(|| $crate::kb::item_not_found(base, id))
                })
            }

            fn kb_items(&self, base: &str) -> $crate::Result<Vec<$crate::kb::KbItem>> {
                self.read_kb(|tx| tx.kb_items(base))
            }

            fn kb_children(
                &self,
                base: &str,
                parent: &str,
            ) -> $crate::Result<Vec<$crate::kb::KbItem>> {
                self.read_kb(|tx| tx.kb_children(base, parent))
            }

            fn kb_items_in(
                &self,
                status: $crate::kb::ItemStatus,
            ) -> $crate::Result<Vec<$crate::kb::KbItem>> {
                self.read_kb(|tx| tx.kb_in_status(status))
            }

            fn kb_deleting_roots(&self) -> $crate::Result<Vec<$crate::kb::KbItem>> {
                self.read_kb(|tx| {
                    let all = tx.kb_in_status($crate::kb::ItemStatus::Deleting)?;
                    // Linear: a deleted directory of 10,000 files is 10,000 deleting items.
                    let deleting: std::collections::HashSet<(&str, &str)> = all
                        .iter()
                        .map(|i| (i.base.as_str(), i.id.as_str()))
                        .collect();
                    Ok(all
                        .iter()
                        .filter(|i| {
                            !i.parent_id
                                .as_deref()
                                .is_some_and(|p| deleting.contains(&(i.base.as_str(), p)))
                        })
                        .cloned()
                        .collect())
                })
            }

            fn kb_overview(
                &self,
                failures_per_base: usize,
            ) -> $crate::Result<Vec<$crate::kb::KbOverview>> {
                self.read_kb(|tx| $crate::kb::logic::overview(tx, failures_per_base))
            }
        }
    };
}
pub(crate) use impl_kb_store;

#[cfg(test)]
mod tests {
    use super::super::{ItemKind, fold_roots, subtree_of};
    use super::*;

    fn item(id: &str, parent: Option<&str>) -> KbItem {
        KbItem {
            base: "b".into(),
            id: id.into(),
            parent_id: parent.map(str::to_owned),
            kind: ItemKind::File,
            source: String::new(),
            node_uri: ce_core::CtxUri::parse(&format!("ctx://a/resources/b/{id}")).expect("uri"),
            status: ItemStatus::Completed,
            error: None,
            through_seq: None,
            fingerprint: None,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn nested_selections_fold_to_their_top_level_roots() {
        let items = vec![
            item("d", None),
            item("d1", Some("d")),
            item("d2", Some("d1")),
            item("f", None),
        ];
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(fold_roots(&items, &ids(&["d2", "d", "f", "d"])), ["d", "f"]);
        assert_eq!(fold_roots(&items, &ids(&["d2", "x"])), ["d2", "x"]);
        let sub: Vec<&str> = subtree_of(&items, "d")
            .iter()
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(sub, ["d", "d1", "d2"]);
    }
}
