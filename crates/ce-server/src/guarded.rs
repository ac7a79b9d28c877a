//! Writes under path locks (DESIGN.md decision 10; docs/locks.md): `rm`, `mv` and `import`
//! take their locks from the [`LockManager`], write with the lease's fencing tokens (the
//! store refuses them once a newer holder wrote), and release — or, for an import, hand the
//! lease off to the background work that indexes it ([`WriteOp::Hold`], ended by
//! [`crate::engine`]'s hold keeper once the consumers applied the import).
//!
//! The server and the local CLI both write through here, so a `ce rm` on the command line
//! and a `POST /v1/rm` to a running server exclude each other (filesystem or Redis provider).

use std::path::Path;

use ce_core::{Clock as _, CtxUri, SystemClock};
use ce_lock::{Lease, LeaseRef, LockError, LockManager, LockRequest, scope_of};
use ce_store::layout::{self, ImportOptions, ImportReport};
use ce_store::plan;
use ce_store::{SourceStore, StoreError, WriteFence, WriteOp, WriteOutcome};

use crate::error::{Result, ServerError};

/// A store and the lock manager its multi-step writes go through.
#[derive(Clone, Copy)]
pub struct Guarded<'a> {
    /// The source of truth.
    pub store: &'a dyn SourceStore,
    /// The path locks.
    pub locks: &'a LockManager,
}

/// The store's view of a lease's fencing tokens.
pub fn write_fences(lease: &Lease) -> Vec<WriteFence> {
    lease
        .fences()
        .into_iter()
        .map(|f| WriteFence {
            path: f.path,
            token: f.token.0,
        })
        .collect()
}

/// Releases `lease`; a failure is logged, never returned (its tokens go stale).
fn release(lease: Lease) {
    if let Err(e) = lease.release() {
        tracing::warn!(error = %e, "lease not released: its tokens go stale");
    }
}

/// Locks `reqs` with one lease per provider scope (a move between accounts spans two),
/// taken in scope order so that two such moves cannot wait on each other in a cycle.
fn acquire_all(locks: &LockManager, reqs: &[LockRequest]) -> Result<Vec<Lease>> {
    let mut scopes: Vec<Option<&str>> = reqs.iter().map(|r| scope_of(&r.path)).collect();
    scopes.sort_unstable();
    scopes.dedup();
    let mut leases = Vec::with_capacity(scopes.len());
    for scope in scopes {
        let group: Vec<LockRequest> = reqs
            .iter()
            .filter(|r| scope_of(&r.path) == scope)
            .cloned()
            .collect();
        // On failure the leases taken so far are dropped, which releases them.
        leases.push(locks.acquire(&group)?);
    }
    Ok(leases)
}

impl Guarded<'_> {
    /// Whether `uri` has children (a subtree), `None` when it does not exist.
    fn has_children(&self, uri: &CtxUri) -> Result<Option<bool>> {
        match self.store.stat(uri) {
            Ok(s) => Ok(Some(s.children > 0)),
            Err(StoreError::NodeNotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `e`, naming the import when the busy lock is an import's hold (its id and age).
    fn explain_busy(&self, e: LockError) -> ServerError {
        let LockError::Busy { path, held, .. } = &e else {
            return e.into();
        };
        let hold = self
            .store
            .holds()
            .ok()
            .and_then(|hs| hs.into_iter().find(|h| &h.at == held));
        match hold {
            Some(h) => ServerError::HeldByImport {
                path: path.clone(),
                age_seconds: u64::try_from(
                    SystemClock.now_ms().saturating_sub(h.created_at_ms) / 1000,
                )
                .unwrap_or(0),
                hold: h.id,
                at: h.at,
            },
            None => e.into(),
        }
    }

    /// Runs `ops` under leases on `reqs`, then releases them.
    fn locked(&self, reqs: &[LockRequest], ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        Ok(self.apply_locked(reqs, ops)?.remove(0))
    }

    /// Runs the batch `ops` in one transaction under leases on `reqs`, written with their
    /// fencing tokens, then releases them; every op's outcome (e.g. a knowledge base's
    /// mutations under its TREE lock).
    pub fn apply_locked(
        &self,
        reqs: &[LockRequest],
        ops: Vec<WriteOp>,
    ) -> Result<Vec<WriteOutcome>> {
        self.with_locks(reqs, |fences| {
            ce_core::failpoint::hit("lock.after_acquire");
            let out = self.store.apply_fenced(fences, ops);
            ce_core::failpoint::hit("lock.before_release");
            Ok(out?)
        })
    }

    /// Runs `work` under leases on `reqs` — it reads what it needs and writes with the
    /// leases' `fences` (`apply_fenced`) — then releases them: a multi-step write whose
    /// reads must not change before it commits (a session commit's Phase 1).
    pub fn with_locks<T>(
        &self,
        reqs: &[LockRequest],
        work: impl FnOnce(&[WriteFence]) -> Result<T>,
    ) -> Result<T> {
        let leases = acquire_all(self.locks, reqs).map_err(|e| match e {
            ServerError::Lock(l) => self.explain_busy(l),
            e => e,
        })?;
        let fences: Vec<WriteFence> = leases.iter().flat_map(write_fences).collect();
        let out = work(&fences);
        // The write's answer stands whatever the release does: a token left behind goes
        // stale, and the fences already protect what was written.
        for lease in leases {
            release(lease);
        }
        out
    }

    /// `rm` under TREE (a subtree, or a recursive remove) or EXACT (a leaf). An rm of a path
    /// the source lacks still queues the removal of index records left under it, then
    /// answers not-found.
    pub fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        let req = match self.has_children(uri)? {
            Some(true) => LockRequest::tree(uri.clone()),
            Some(false) if !recursive => LockRequest::exact(uri.clone()),
            _ => LockRequest::tree(uri.clone()),
        };
        let op = WriteOp::Rm {
            uri: uri.clone(),
            recursive,
            expect_version,
            trace_id: trace_id.clone(),
        };
        match self.locked(&[req], vec![op]) {
            Err(crate::ServerError::Store(e @ StoreError::NodeNotFound { .. }))
                if expect_version.is_none() =>
            {
                self.store.purge_missing(uri, trace_id)?;
                Err(e.into())
            }
            r => r,
        }
    }

    /// `mv` under the spec's MV lock: TREE on source and target when the source has
    /// children, EXACT on both for a leaf.
    pub fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome> {
        // Bad moves are refused before anything is locked (a move onto the root would
        // otherwise ask for a lock on it).
        plan::check_move(from, to)?;
        let op = WriteOp::Mv {
            from: from.clone(),
            to: to.clone(),
            trace_id,
        };
        if from == to {
            // Nothing moves (the store answers unchanged, or not-found).
            return Ok(self.store.apply_batch(vec![op])?.remove(0));
        }
        let src_is_dir = self.has_children(from)?.unwrap_or(false);
        let reqs = LockRequest::mv(from.clone(), to.clone(), src_is_dir);
        self.locked(&reqs, vec![op])
    }

    /// The lifecycle lease of an import into `into`, and whether it is an earlier import's
    /// (then the new hold must supersede it whatever the import writes). A hold left by an
    /// earlier import of the same target that no keeper has adopted (no engine runs, or it
    /// has not come round yet) is taken over — imports of one target follow each other
    /// without waiting for the earlier lease to go stale — and the new hold supersedes it. A
    /// hold a keeper is keeping (its import still being indexed) makes this import wait,
    /// then busy.
    fn import_lease(&self, into: &CtxUri) -> Result<(Lease, bool)> {
        let prior = self.store.holds()?.into_iter().find(|h| &h.at == into);
        let reference = prior.and_then(|h| serde_json::from_str::<LeaseRef>(&h.lease).ok());
        match reference {
            Some(r) if r.covered == [LockRequest::tree(into.clone())] => Ok((
                self.locks.adopt(&r).map_err(|e| self.explain_busy(e))?,
                true,
            )),
            _ => Ok((
                self.locks
                    .acquire(&[LockRequest::tree(into.clone())])
                    .map_err(|e| self.explain_busy(e))?,
                false,
            )),
        }
    }

    /// `import` under a lifecycle TREE lock on `into`: the nodes are written with the lease's
    /// fences and, in the same transaction, the lease is handed off as a hold that lasts
    /// until the consumers have applied the import; a concurrent rm of the subtree meanwhile
    /// gets the busy error. An import that appended no events (nothing changed) records no
    /// hold and frees the lock at once, unless it took over an earlier import's hold (whose
    /// events still wait). Returns the report and the hold's id, if one was recorded.
    ///
    /// With `options.prune`, nodes under `into` that `dir` no longer has are removed in the
    /// same transaction, within the delete-safety limits.
    pub fn import(
        &self,
        dir: &Path,
        into: &CtxUri,
        options: ImportOptions,
    ) -> Result<(ImportReport, Option<String>)> {
        let (lease, supersedes) = self.import_lease(into)?;
        ce_core::failpoint::hit("lock.after_acquire");
        let fences = write_fences(&lease);
        let id = format!("import-{}", uuid::Uuid::now_v7().simple());
        let reference = lease.hand_off();
        ce_core::failpoint::hit("lock.after_hand_off");
        let hold = WriteOp::Hold {
            id: id.clone(),
            at: into.clone(),
            lease: serde_json::to_string(&reference).map_err(|e| {
                crate::ServerError::Internal(format!("lease reference does not serialise: {e}"))
            })?,
            only_with_events: !supersedes,
        };
        let written =
            layout::import_dir_fenced(self.store, dir, into, options, &fences, Some(hold));
        let held = matches!(written, Ok((_, true)));
        if !held {
            // No hold keeps the lease (nothing changed, or nothing was written): take it back
            // and free it.
            if let Ok(lease) = self.locks.adopt(&reference) {
                release(lease);
            }
        }
        let (report, _) = written?;
        Ok((report, held.then_some(id)))
    }
}
