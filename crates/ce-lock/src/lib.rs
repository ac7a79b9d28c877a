//! Path locks (DESIGN.md decision 10, spec `path-locks-crash-recovery`): EXACT / TREE / MV
//! leases over `ctx://` paths, with renewal, stale detection, hand-off to background work and
//! fencing tokens, on three providers: `memory` (one process), `filesystem` (lock files: the
//! processes of one host) and `redis` (every host that reaches the server).
//!
//! A lock is a lease, not a proof: a holder that stops renewing (paused, partitioned, dead)
//! loses it after `lock_expire`. What makes that safe is the fencing token every grant
//! carries: the source of truth rejects a write whose token is older than the newest it has
//! seen for the path (see `ce-store`), so a holder that lost its lease cannot write after the
//! next holder did.
//!
//! - [`LockMode`], [`LockRequest`], [`conflicts`]: the spec's conflict table, as one pure
//!   function every provider is checked against
//! - [`LockProvider`]: what a provider does (batch check-and-set, refresh, release, transfer)
//! - [`LockManager`] / [`Lease`]: waiting with jittered backoff, renewal, hand-off and adopt

use std::fmt;

use ce_core::{Classify, CtxUri, ErrorCode};
use serde::{Deserialize, Serialize};

/// The scope of a lock: what it protects of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// The path itself (a leaf write, a single-node delete, a move of a leaf).
    Exact,
    /// The path and its whole subtree (recursive delete, a directory move, an import).
    Tree,
}

impl LockMode {
    /// The letter in a provider token: `E` or `T`.
    pub fn letter(self) -> char {
        match self {
            LockMode::Exact => 'E',
            LockMode::Tree => 'T',
        }
    }
}

/// One path to lock, and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockRequest {
    /// The path (a node that exists or not: locks protect names).
    pub path: CtxUri,
    /// Exact or tree.
    pub mode: LockMode,
}

impl LockRequest {
    /// An EXACT request.
    pub fn exact(path: CtxUri) -> Self {
        LockRequest {
            path,
            mode: LockMode::Exact,
        }
    }

    /// A TREE request.
    pub fn tree(path: CtxUri) -> Self {
        LockRequest {
            path,
            mode: LockMode::Tree,
        }
    }

    /// The spec's MV lock: TREE on source and target for a directory, EXACT on both for a
    /// leaf.
    pub fn mv(from: CtxUri, to: CtxUri, src_is_dir: bool) -> [LockRequest; 2] {
        if src_is_dir {
            [LockRequest::tree(from), LockRequest::tree(to)]
        } else {
            [LockRequest::exact(from), LockRequest::exact(to)]
        }
    }
}

/// Whether a lock `held` by one owner conflicts with a lock `wanted` by another (spec table
/// "锁类型"): EXACT conflicts with the same path and with ancestor TREE locks; TREE conflicts
/// with the same path, with any lock on a descendant and with ancestor TREE locks.
/// `Tree(/docs/a.md)` never widens to `/docs`; `Exact(/docs)` does not protect `/docs/a.md`.
/// Locks in different provider scopes ([`scope_of`]) never conflict.
pub fn conflicts(held: &LockRequest, wanted: &LockRequest) -> bool {
    if scope_of(&held.path) != scope_of(&wanted.path) {
        return false;
    }
    if held.path == wanted.path {
        return true;
    }
    let held_is_ancestor = wanted.path.is_within(&held.path);
    let held_is_descendant = held.path.is_within(&wanted.path);
    (held_is_ancestor && held.mode == LockMode::Tree)
        || (held_is_descendant && wanted.mode == LockMode::Tree)
}

/// The provider scope of a path: its account, or `None` for the root (the global scope).
/// A batch never spans scopes (spec "跨 scope batch 会被拒绝").
pub fn scope_of(path: &CtxUri) -> Option<&str> {
    (!path.is_root()).then(|| path.account_id())
}

/// A strictly increasing number issued with every grant; writes made under a lease carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FenceToken(pub u64);

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What the fencing check of the store needs of a lease: for each locked path, the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The locked path.
    pub path: CtxUri,
    /// The grant's token.
    pub token: FenceToken,
}

/// A lock as a provider stores it: the spec's token `{owner}:{time_ns}:{E|T}` plus the
/// grant's fencing token, and where the provider keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The locked path and mode.
    pub request: LockRequest,
    /// The owner (a lease holder id: no `:`).
    pub owner: String,
    /// When the token was written or last refreshed, in nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// The grant's fencing token (unchanged by refresh and transfer).
    pub fence: FenceToken,
    /// Where the provider keeps it: a lock-file path, a Redis hash key and field, a map key.
    pub location: String,
}

/// Why one acquire attempt did not get its locks.
#[derive(Debug)]
pub enum Attempt {
    /// A live lock of another owner conflicts with a request of the batch.
    Conflict {
        /// The conflicting lock.
        held: LockRequest,
        /// Its owner.
        owner: String,
    },
    /// The provider failed.
    Failed(LockError),
}

impl From<LockError> for Attempt {
    fn from(e: LockError) -> Self {
        Attempt::Failed(e)
    }
}

/// A lock provider: the storage of tokens with an atomic (or double-checked) batch
/// check-and-set. Every method is one attempt; waiting, renewal timing and hand-off
/// bookkeeping live in the manager.
pub trait LockProvider: Send + Sync {
    /// `memory`, `filesystem` or `redis`.
    fn name(&self) -> &'static str;
    /// Tries to lock every request of the batch for `owner`, all or none: tokens older than
    /// `expire_ns` at `now_ns` that it meets are stale and removed; a live token of another
    /// owner that [`conflicts`] with a request fails the attempt (and leaves nothing written).
    /// Every granted token carries one fencing token, strictly greater than any this provider
    /// namespace issued before.
    fn try_acquire(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Vec<Token>, Attempt>;
    /// Re-stamps `tokens` with `now_ns` if each is still stored as written (same owner and
    /// fence); otherwise [`LockError::Lost`] naming the first one that is not.
    fn refresh(&self, tokens: &[Token], now_ns: u64) -> Result<Vec<Token>>;
    /// Removes the tokens that are still stored as written; others are left alone.
    fn release(&self, tokens: &[Token]) -> Result<()>;
    /// Rewrites still-owned `tokens` to `new_owner`, stamped `now_ns`, keeping their fences
    /// (the adopt side of a hand-off); [`LockError::Lost`] if any is gone or replaced.
    fn transfer(&self, tokens: &[Token], new_owner: &str, now_ns: u64) -> Result<Vec<Token>>;
}

/// The next fencing token of a provider namespace whose last one was `last`, granted at
/// `now_ns`: `max(last + 1, now in microseconds)`. The wall-clock floor keeps tokens above
/// every earlier one even when a provider lost its counter (a memory provider after a
/// restart), as long as the clock does not go back.
pub fn next_fence(last: u64, now_ns: u64) -> FenceToken {
    FenceToken(last.saturating_add(1).max(now_ns / 1_000))
}

/// Invariant `LK1`: no two owners hold conflicting locks. Returns the first offending pair
/// among `held` (request, owner), or `None`.
pub fn lk1_violation(held: &[(LockRequest, String)]) -> Option<(usize, usize)> {
    for (i, (a, oa)) in held.iter().enumerate() {
        for (j, (b, ob)) in held.iter().enumerate().skip(i + 1) {
            if oa != ob && (conflicts(a, b) || conflicts(b, a)) {
                return Some((i, j));
            }
        }
    }
    None
}

/// Errors of the lock layer.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another owner holds a conflicting lock past the wait.
    #[error(
        "{path} is busy: locked by {holder} ({mode:?}); waited {waited_ms} ms: retry once the \
         holder is done (a lock whose process died goes stale after lock.lock_expire_secs)"
    )]
    Busy {
        /// The path that could not be locked.
        path: CtxUri,
        /// The conflicting lock's owner and path, as the provider knows them.
        holder: String,
        /// The conflicting lock's path.
        held: CtxUri,
        /// The conflicting lock's mode.
        mode: LockMode,
        /// How long the acquire waited.
        waited_ms: u64,
    },
    /// The lease is gone: expired and cleaned, or its token replaced by another owner's.
    #[error("lease on {path} lost: {reason}")]
    Lost {
        /// A path of the lease.
        path: CtxUri,
        /// What happened.
        reason: String,
    },
    /// A request the lock layer refuses (a batch across scopes, an empty batch, a bad
    /// hand-off reference).
    #[error("invalid lock request: {0}")]
    Invalid(String),
    /// The provider failed (I/O on lock files, Redis unreachable).
    #[error("lock provider {provider}: {message}")]
    Provider {
        /// `memory`, `filesystem` or `redis`.
        provider: &'static str,
        /// What failed.
        message: String,
    },
}

impl Classify for LockError {
    fn code(&self) -> ErrorCode {
        match self {
            LockError::Busy { .. } => ErrorCode::Busy,
            LockError::Lost { .. } => ErrorCode::LeaseLost,
            LockError::Invalid(_) => ErrorCode::InvalidField,
            LockError::Provider { .. } => ErrorCode::Unavailable,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            LockError::Busy { .. } | LockError::Lost { .. } | LockError::Provider { .. } => true,
            LockError::Invalid(_) => false,
        }
    }
}

/// Result of the lock layer.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

pub mod filesystem;
pub mod manager;
pub mod memory;
pub mod redis;

pub use manager::{Lease, LeaseRef, LockManager, LockSettings, normalize_batch};

#[cfg(test)]
mod tests {
    //! The spec's conflict tables, row by row ("锁类型" and "路径范围与目标类型").

    use super::*;

    fn e(p: &str) -> LockRequest {
        LockRequest::exact(CtxUri::parse(p).expect("uri"))
    }

    fn t(p: &str) -> LockRequest {
        LockRequest::tree(CtxUri::parse(p).expect("uri"))
    }

    /// Held `h`, wanted `w` by another owner: `conflicts` says `want`.
    fn assert_conflict(h: &LockRequest, w: &LockRequest, want: bool) {
        assert_eq!(conflicts(h, w), want, "held {h:?} wanted {w:?}");
    }

    // Matrix row EXACT: same-path EXACT, same-path TREE, descendant EXACT, ancestor TREE.
    #[test]
    fn exact_vs_same_path_exact_conflicts() {
        assert_conflict(&e("ctx://a/docs"), &e("ctx://a/docs"), true);
    }

    #[test]
    fn exact_vs_same_path_tree_conflicts() {
        assert_conflict(&t("ctx://a/docs"), &e("ctx://a/docs"), true);
    }

    #[test]
    fn exact_vs_descendant_exact_does_not_conflict() {
        assert_conflict(&e("ctx://a/docs/x"), &e("ctx://a/docs"), false);
    }

    #[test]
    fn exact_vs_ancestor_tree_conflicts() {
        assert_conflict(&t("ctx://a/docs"), &e("ctx://a/docs/x/y"), true);
    }

    // Matrix row TREE.
    #[test]
    fn tree_vs_same_path_exact_conflicts() {
        assert_conflict(&e("ctx://a/docs"), &t("ctx://a/docs"), true);
    }

    #[test]
    fn tree_vs_same_path_tree_conflicts() {
        assert_conflict(&t("ctx://a/docs"), &t("ctx://a/docs"), true);
    }

    #[test]
    fn tree_vs_descendant_exact_conflicts() {
        assert_conflict(&e("ctx://a/docs/x/y"), &t("ctx://a/docs"), true);
    }

    #[test]
    fn tree_vs_ancestor_tree_conflicts() {
        assert_conflict(&t("ctx://a"), &t("ctx://a/docs"), true);
    }

    // Cells the matrix leaves implicit: ancestor EXACT never, descendant TREE only for TREE.
    #[test]
    fn ancestor_exact_never_conflicts() {
        assert_conflict(&e("ctx://a/docs"), &e("ctx://a/docs/x"), false);
        assert_conflict(&e("ctx://a/docs"), &t("ctx://a/docs/x"), false);
    }

    #[test]
    fn descendant_tree_conflicts_with_tree_only() {
        assert_conflict(&t("ctx://a/docs/x"), &t("ctx://a/docs"), true);
        assert_conflict(&t("ctx://a/docs/x"), &e("ctx://a/docs"), false);
    }

    // The "已持有 / 新请求" table.
    #[test]
    fn held_exact_file_blocks_exact_and_tree_on_it() {
        assert_conflict(&e("ctx://a/docs/a.md"), &e("ctx://a/docs/a.md"), true);
        assert_conflict(&e("ctx://a/docs/a.md"), &t("ctx://a/docs/a.md"), true);
    }

    #[test]
    fn held_exact_dir_does_not_protect_its_children() {
        assert_conflict(&e("ctx://a/docs"), &e("ctx://a/docs/a.md"), false);
    }

    #[test]
    fn held_tree_dir_blocks_exact_and_tree_below() {
        assert_conflict(&t("ctx://a/docs"), &e("ctx://a/docs/a.md"), true);
        assert_conflict(&t("ctx://a/docs"), &t("ctx://a/docs/a.md"), true);
    }

    #[test]
    fn held_exact_file_blocks_tree_on_its_dir() {
        assert_conflict(&e("ctx://a/docs/a.md"), &t("ctx://a/docs"), true);
    }

    #[test]
    fn held_tree_file_does_not_widen_to_siblings() {
        assert_conflict(&t("ctx://a/docs/a.md"), &e("ctx://a/docs/b.md"), false);
    }

    // Scopes and names.
    #[test]
    fn different_accounts_never_conflict() {
        for (h, w) in [
            (t("ctx://a"), t("ctx://b")),
            (t("ctx://a/docs"), e("ctx://b/docs")),
            (e("ctx://a/docs"), t("ctx://b/docs")),
        ] {
            assert_conflict(&h, &w, false);
        }
    }

    #[test]
    fn the_root_is_its_own_scope() {
        let root = LockRequest::tree(CtxUri::root());
        assert_conflict(&root, &e("ctx://a/x"), false);
        assert_conflict(&e("ctx://a/x"), &root, false);
        assert_conflict(&root, &LockRequest::exact(CtxUri::root()), true);
    }

    #[test]
    fn a_name_prefix_is_not_an_ancestor() {
        assert_conflict(&t("ctx://a/doc"), &e("ctx://a/docs"), false);
        assert_conflict(&e("ctx://a/docs"), &t("ctx://a/doc"), false);
    }

    #[test]
    fn mv_locks_tree_for_dirs_and_exact_for_leaves() {
        let from = CtxUri::parse("ctx://a/x").expect("uri");
        let to = CtxUri::parse("ctx://a/y").expect("uri");
        assert_eq!(
            LockRequest::mv(from.clone(), to.clone(), true),
            [t("ctx://a/x"), t("ctx://a/y")]
        );
        assert_eq!(
            LockRequest::mv(from, to, false),
            [e("ctx://a/x"), e("ctx://a/y")]
        );
    }

    #[test]
    fn fences_grow_and_never_fall_below_the_clock() {
        assert_eq!(next_fence(5, 0), FenceToken(6));
        assert_eq!(next_fence(5, 9_000_000), FenceToken(9_000));
        assert_eq!(next_fence(9_000, 9_000_000), FenceToken(9_001));
    }

    #[test]
    fn lk1_finds_conflicting_owners_only() {
        let held = vec![
            (t("ctx://a/docs"), "o1".to_owned()),
            (e("ctx://a/docs/x"), "o1".to_owned()),
            (e("ctx://a/img"), "o2".to_owned()),
        ];
        assert_eq!(lk1_violation(&held), None);
        let mut bad = held;
        bad.push((e("ctx://a/docs/y"), "o3".to_owned()));
        assert_eq!(lk1_violation(&bad), Some((0, 3)));
    }
}
