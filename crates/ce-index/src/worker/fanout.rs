//! Per-URI outcomes fanned out to a plan's operations, shared by both apply steps ([`apply`]
//! for nodes, [`relation`] for relation owners): each operation expands into the URIs it
//! syncs, every URI is synced once, and a URI that failed fails exactly the operations that
//! include it — so only the events needing those operations are retried.
//!
//! [`apply`]: super::apply
//! [`relation`]: super::relation

use std::collections::{BTreeMap, HashMap};

use ce_core::CtxUri;
use ce_store::SourceStore;

use super::compact::Op;
use super::error::WorkError;

/// What the source holds within each subtree operation ([`Op::SyncSubtree`]) of a plan, read
/// in one snapshot: a batch of 100 single-node removals costs one read transaction, not 100.
pub(super) struct SourceSubtrees(Result<HashMap<CtxUri, Vec<CtxUri>>, WorkError>);

impl SourceSubtrees {
    /// Reads the source's subtree of every subtree operation of `ops`.
    pub fn read(source: &dyn SourceStore, ops: &[Op]) -> Self {
        let roots: Vec<CtxUri> = ops
            .iter()
            .filter_map(|op| match op {
                Op::SyncSubtree(u) => Some(u.clone()),
                _ => None,
            })
            .collect();
        if roots.is_empty() {
            return SourceSubtrees(Ok(HashMap::new()));
        }
        SourceSubtrees(
            source
                .subtrees_uris(&roots)
                .map(|subtrees| roots.into_iter().zip(subtrees).collect())
                .map_err(WorkError::from),
        )
    }

    /// The URIs the source holds within `u` (`u` included if it holds it); the read's error
    /// if it failed.
    pub fn within(&self, u: &CtxUri) -> Result<&[CtxUri], WorkError> {
        match &self.0 {
            Ok(subtrees) => Ok(subtrees.get(u).map(Vec::as_slice).unwrap_or(&[])),
            Err(e) => Err(e.clone()),
        }
    }
}

/// The outcome of each operation of a plan (by index), plus counts of type `C`.
pub(super) struct Applied<C> {
    pub results: Vec<Result<(), WorkError>>,
    pub counts: C,
}

/// The outcome of each operation of a plan so far, and which operations include each URI.
pub(super) struct OpFanout {
    /// By operation index.
    results: Vec<Result<(), WorkError>>,
    /// The operations (by index) that include each URI.
    needs: BTreeMap<CtxUri, Vec<usize>>,
}

impl OpFanout {
    /// Expands every operation of `ops` with `expand`: `None` means it syncs nothing itself
    /// (a move), an error fails the operation.
    pub fn expand<I>(
        ops: &[Op],
        mut expand: impl FnMut(&Op) -> Option<Result<I, WorkError>>,
    ) -> Self
    where
        I: IntoIterator<Item = CtxUri>,
    {
        let mut results: Vec<Result<(), WorkError>> = (0..ops.len()).map(|_| Ok(())).collect();
        let mut needs: BTreeMap<CtxUri, Vec<usize>> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            match expand(op) {
                None => {}
                Some(Ok(uris)) => {
                    for u in uris {
                        needs.entry(u).or_default().push(i);
                    }
                }
                Some(Err(e)) => results[i] = Err(e),
            }
        }
        OpFanout { results, needs }
    }

    /// Every URI to sync, in order.
    pub fn uris(&self) -> Vec<CtxUri> {
        self.needs.keys().cloned().collect()
    }

    /// Fails every operation that includes a URI (not failed yet) with `e`: a batched read
    /// of all of them failed.
    pub fn fail_all(&mut self, e: &WorkError) {
        for ops in self.needs.values() {
            for &i in ops {
                if self.results[i].is_ok() {
                    self.results[i] = Err(e.clone());
                }
            }
        }
    }

    /// Fails the operations (not failed yet) that include a URI of `failed` with its error.
    pub fn fail_uris(&mut self, failed: HashMap<CtxUri, WorkError>) {
        for (uri, err) in failed {
            for &i in self.needs.get(&uri).map(Vec::as_slice).unwrap_or(&[]) {
                if self.results[i].is_ok() {
                    self.results[i] = Err(err.clone());
                }
            }
        }
    }

    /// The outcome of each operation, with `counts`.
    pub fn finish<C>(self, counts: C) -> Applied<C> {
        Applied {
            results: self.results,
            counts,
        }
    }
}
