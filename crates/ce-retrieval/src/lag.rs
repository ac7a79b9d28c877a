//! Index lag: how many changes the indexes a request read have not applied yet.
//!
//! Indexes follow the source of truth asynchronously, so a search right after a write may not
//! find it. Every answer says, per index it read, how many changes (outbox deliveries) within
//! the request's scope that index has not applied yet and how old the oldest is — one bounded
//! count over the oldest runnable deliveries per index ([`ce_store::OutboxStore::lag`]: at
//! most [`ce_store::LAG_SCAN_LIMIT`] + 1 of them), never a scan of the history. The scope is the request's subtree, else its account, else everything: a
//! tenant (whose searches are bound to its account) only ever sees its own account's counts.

use ce_core::CtxUri;
use ce_index::vector::SearchFilter;
use ce_store::SourceStore;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// How far behind the source of truth one index a request read is, within its scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IndexLag {
    /// The index, named as its outbox consumer (`vector`, `keyword`, `relation`).
    pub index: String,
    /// Changes within the request's scope that the index has not applied yet (pending,
    /// claimed or retrying deliveries; dead ones are not counted: see `ce outbox list
    /// --status dead`).
    pub events: u64,
    /// Whether the index has more than [`ce_store::LAG_SCAN_LIMIT`] changes to apply (in any
    /// scope): only the oldest were examined, so `events` is a lower bound.
    #[serde(default)]
    pub capped: bool,
    /// Age of the oldest of them, in seconds (0 without lag).
    pub oldest_age_seconds: f64,
}

/// The lag of each of `indexes` that is a configured consumer of `source`, within `scope`
/// (everything when `None`): one query per index.
pub(crate) fn lag_of(
    source: &dyn SourceStore,
    indexes: &[&str],
    scope: Option<&CtxUri>,
) -> Result<Vec<IndexLag>> {
    let configured = source.consumers();
    indexes
        .iter()
        .filter(|i| configured.iter().any(|c| c == *i))
        .map(|i| {
            let l = source.lag(i, scope)?;
            Ok(IndexLag {
                index: (*i).to_owned(),
                events: l.events,
                capped: l.capped,
                oldest_age_seconds: l.oldest_age_ms.map_or(0.0, |ms| ms as f64 / 1e3),
            })
        })
        .collect()
}

/// The scope of a search's lag: its subtree, else its account, else everything.
pub(crate) fn search_scope(filter: &SearchFilter) -> Option<CtxUri> {
    filter.subtree.clone().or_else(|| {
        filter
            .account_id
            .as_deref()
            .and_then(|a| CtxUri::root().join(a).ok())
    })
}

/// The scope of a node's lag: its account.
pub(crate) fn account_scope(uri: &CtxUri) -> Option<CtxUri> {
    CtxUri::root().join(uri.account_id()).ok()
}

/// One line for people when some index lags, e.g. `15 changes not indexed yet (keyword
/// index; the oldest 3.2 s ago)`; `None` when every index is up to date. The count is the
/// largest of the indexes' (a change is searchable everywhere once every index has it), with
/// a `+` when it is a lower bound.
pub fn lag_summary(lag: &[IndexLag]) -> Option<String> {
    let behind: Vec<&IndexLag> = lag.iter().filter(|l| l.events > 0 || l.capped).collect();
    let most = behind.iter().map(|l| l.events).max()?;
    let capped = behind.iter().any(|l| l.capped);
    if most == 0 {
        // Only a backlog beyond the scan limit, none of its oldest changes in scope.
        return Some(format!(
            "over {} changes are queued for indexing; some within this scope may not be indexed yet",
            ce_store::LAG_SCAN_LIMIT
        ));
    }
    let oldest = behind
        .iter()
        .map(|l| l.oldest_age_seconds)
        .fold(0.0, f64::max);
    let which = match behind.as_slice() {
        [one] => format!("{} index", one.index),
        many => many
            .iter()
            .map(|l| format!("{} {}", l.index, l.events))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let changes = if most == 1 && !capped {
        "change"
    } else {
        "changes"
    };
    let plus = if capped { "+" } else { "" };
    Some(format!(
        "{most}{plus} {changes} not indexed yet ({which}; the oldest {oldest:.1} s ago)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(index: &str, events: u64, age: f64) -> IndexLag {
        IndexLag {
            index: index.into(),
            events,
            capped: false,
            oldest_age_seconds: age,
        }
    }

    #[test]
    fn the_summary_names_the_indexes_behind_and_the_largest_count() {
        assert_eq!(lag_summary(&[]), None);
        assert_eq!(lag_summary(&[lag("vector", 0, 0.0)]), None);
        assert_eq!(
            lag_summary(&[lag("vector", 0, 0.0), lag("keyword", 15, 3.25)]).as_deref(),
            Some("15 changes not indexed yet (keyword index; the oldest 3.2 s ago)")
        );
        assert_eq!(
            lag_summary(&[lag("vector", 12, 9.0), lag("keyword", 15, 3.0)]).as_deref(),
            Some("15 changes not indexed yet (vector 12, keyword 15; the oldest 9.0 s ago)")
        );
        assert_eq!(
            lag_summary(&[lag("relation", 1, 0.0)]).as_deref(),
            Some("1 change not indexed yet (relation index; the oldest 0.0 s ago)")
        );
        let capped = |events| IndexLag {
            capped: true,
            ..lag("keyword", events, 7.0)
        };
        assert_eq!(
            lag_summary(&[capped(1001)]).as_deref(),
            Some("1001+ changes not indexed yet (keyword index; the oldest 7.0 s ago)")
        );
        let none_in_scope = lag_summary(&[capped(0)]).expect("a line");
        assert!(
            none_in_scope.starts_with("over 1000 changes are queued"),
            "{none_in_scope}"
        );
    }

    #[test]
    fn the_scope_is_the_subtree_else_the_account() {
        let u = |s: &str| CtxUri::parse(s).expect("uri");
        let mut f = SearchFilter::default();
        assert_eq!(search_scope(&f), None);
        f.account_id = Some("acc".into());
        assert_eq!(search_scope(&f), Some(u("ctx://acc")));
        f.subtree = Some(u("ctx://acc/docs"));
        assert_eq!(search_scope(&f), Some(u("ctx://acc/docs")));
        assert_eq!(account_scope(&u("ctx://acc/docs/a")), Some(u("ctx://acc")));
    }
}
