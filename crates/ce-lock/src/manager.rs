//! The lock manager: waiting with jittered backoff, renewal every `expire / 3`, hand-off and
//! adopt.
//!
//! A waiter is woken as soon as a lease of this process releases the lock it waits for (any
//! lease of the managers sharing one state: [`LockManager::with_wait`] keeps it), so leases of
//! one process take turns without sleeping out a backoff step; a release of other paths does
//! not cost it an attempt (many jobs of one process waiting on different bases do not all
//! retry at every release). The backoff remains the fallback for a holder in another process,
//! whose release nobody here hears of.
//!
//! Every [`Lease`] has its own owner id (`{pid}-{16 hex}`), so two leases of one process
//! conflict like leases of two processes. One renewal thread per manager (started with the
//! first lease) re-stamps every live lease through [`LockProvider::refresh`]; it marks a
//! lease lost when a token is gone or replaced, and releases best-effort a lease whose
//! renewal kept failing for `2 × expire` (spec "进程内清理"). The thread holds the manager
//! weakly and ends when the manager and every lease of it are gone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::filesystem::FilesystemProvider;
use crate::memory::MemoryProvider;
use crate::{
    Attempt, Fence, LockError, LockMode, LockProvider, LockRequest, Result, Token, scope_of,
};

/// First backoff step of a waiting acquire.
const BACKOFF_START: Duration = Duration::from_millis(20);
/// Longest backoff step of a waiting acquire.
const BACKOFF_CAP: Duration = Duration::from_millis(250);

/// Timing of a [`LockManager`].
#[derive(Debug, Clone, PartialEq)]
pub struct LockSettings {
    /// A token not refreshed for this long is stale (`lock.lock_expire_secs`); leases are
    /// renewed every third of it.
    pub expire: Duration,
    /// How long [`LockManager::acquire`] waits before [`LockError::Busy`] (`lock.wait_ms`).
    pub wait: Duration,
}

impl LockSettings {
    /// The settings of the `[lock]` section.
    pub fn from_config(cfg: &ce_core::config::LockConfig) -> Self {
        LockSettings {
            expire: Duration::from_secs_f64(cfg.lock_expire_secs.max(0.001)),
            wait: Duration::from_millis(cfg.wait_ms),
        }
    }

    fn expire_ns(&self) -> u64 {
        u64::try_from(self.expire.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Hands out [`Lease`]s over one provider. Cheap to clone (one shared state).
#[derive(Clone)]
pub struct LockManager {
    inner: Arc<Inner>,
}

struct Inner {
    provider: Arc<dyn LockProvider>,
    settings: LockSettings,
    /// Leases to renew, by lease id.
    live: Mutex<HashMap<u64, Arc<LeaseState>>>,
    next_id: AtomicU64,
    /// Dropping this sender (with the last `Inner`) wakes and ends the renewal thread.
    renewer: Mutex<Option<mpsc::Sender<()>>>,
    /// Releases of this process, which wake its waiters.
    releases: Arc<Releases>,
}

/// The releases of this process's leases, which wake the waiters they concern.
#[derive(Debug, Default)]
struct Releases {
    state: Mutex<Released>,
    changed: Condvar,
}

/// How many releases there were, and the paths of the most recent ones.
#[derive(Debug, Default)]
struct Released {
    count: u64,
    /// `(release number, path)` of the last [`RECENT_RELEASES`] released tokens.
    recent: std::collections::VecDeque<(u64, String)>,
    /// The newest release some of whose paths were dropped from `recent`.
    forgotten: u64,
}

/// Released paths remembered for the waiters (older ones wake every waiter, see
/// [`Released::freed`]).
const RECENT_RELEASES: usize = 1024;

impl Released {
    /// Whether `path` may have been freed by a release after `seen`: a release of that path,
    /// or one too old to tell (the record has moved past `seen`).
    fn freed(&self, seen: u64, path: &str) -> bool {
        if self.count == seen {
            return false;
        }
        self.forgotten > seen
            || self
                .recent
                .iter()
                .any(|(n, p)| *n > seen && p.as_str() == path)
    }
}

impl Releases {
    /// The releases so far.
    fn seen(&self) -> u64 {
        lock(&self.state).count
    }

    /// Records a release of `tokens` and wakes the waiters; each goes back to sleep unless a
    /// path it waits for is among them (a release of another path never costs a waiter an
    /// attempt at the provider).
    fn notify(&self, tokens: &[Token]) {
        let mut state = lock(&self.state);
        state.count += 1;
        let n = state.count;
        for t in tokens {
            if state.recent.len() == RECENT_RELEASES
                && let Some((dropped, _)) = state.recent.pop_front()
            {
                state.forgotten = dropped;
            }
            state.recent.push_back((n, t.request.path.to_string()));
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Sleeps until `path` is released after `seen`, or for `timeout`; whether a release
    /// woke it.
    fn wait(&self, seen: u64, path: &str, timeout: Duration) -> bool {
        let state = lock(&self.state);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| !s.freed(seen, path))
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.freed(seen, path)
    }
}

impl Inner {
    /// Releases `tokens` and wakes this process's waiters.
    fn release(&self, tokens: &[Token]) -> Result<()> {
        let out = self.provider.release(tokens);
        self.releases.notify(tokens);
        out
    }
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("provider", &self.inner.provider.name())
            .field("settings", &self.inner.settings)
            .finish()
    }
}

/// What one lease holds, shared with the renewal thread.
#[derive(Debug)]
struct LeaseState {
    owner: String,
    covered: Vec<LockRequest>,
    inner: Mutex<LeaseInner>,
}

#[derive(Debug)]
struct LeaseInner {
    tokens: Vec<Token>,
    /// Last successful grant, refresh or transfer.
    renewed: Instant,
    /// Why the lease is lost, once it is.
    lost: Option<String>,
}

/// A held set of locks. Dropping it releases them (that is what cancellation means); hand it
/// off to keep them for background work.
#[derive(Debug)]
pub struct Lease {
    manager: LockManager,
    id: u64,
    state: Arc<LeaseState>,
    /// Set by `hand_off` and `release`: drop then does nothing.
    done: bool,
}

/// A serialisable reference to a handed-off lease: what [`LockManager::adopt`] takes over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRef {
    /// The owner id the tokens were written with.
    pub owner: String,
    /// The logical paths the lease covers (spec `covered_paths`).
    pub covered: Vec<LockRequest>,
    /// The provider tokens (spec `lock_paths`), with their fences.
    pub tokens: Vec<Token>,
}

/// Checks a batch and returns it without duplicates: empty or spanning scopes is
/// [`LockError::Invalid`]; a path asked twice keeps one request, TREE when either asks for it
/// (TREE protects everything EXACT does). Order of first appearance is kept.
pub fn normalize_batch(reqs: &[LockRequest]) -> Result<Vec<LockRequest>> {
    let Some(first) = reqs.first() else {
        return Err(LockError::Invalid("empty lock batch".into()));
    };
    let scope = scope_of(&first.path);
    let mut out: Vec<LockRequest> = Vec::with_capacity(reqs.len());
    for req in reqs {
        if scope_of(&req.path) != scope {
            return Err(LockError::Invalid(format!(
                "lock batch spans scopes: {} and {}",
                first.path, req.path
            )));
        }
        match out.iter_mut().find(|r| r.path == req.path) {
            Some(r) => {
                if req.mode == LockMode::Tree {
                    r.mode = LockMode::Tree;
                }
            }
            None => out.push(req.clone()),
        }
    }
    Ok(out)
}

/// Nanoseconds since the Unix epoch (the provider tokens' time).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A fresh lease owner id: `{pid}-{16 hex of a uuid v7}` (never `:`).
fn new_owner() -> String {
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{}-{}", std::process::id(), &id[16..])
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LockManager {
    /// A manager over `provider`.
    pub fn new(provider: Arc<dyn LockProvider>, settings: LockSettings) -> Self {
        LockManager::sharing(provider, settings, Arc::default())
    }

    fn sharing(
        provider: Arc<dyn LockProvider>,
        settings: LockSettings,
        releases: Arc<Releases>,
    ) -> Self {
        LockManager {
            inner: Arc::new(Inner {
                provider,
                settings,
                live: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                renewer: Mutex::new(None),
                releases,
            }),
        }
    }

    /// The manager the `[lock]` section describes: `filesystem` (lock files in `cfg.dir`, or
    /// `<data_dir>/locks` when empty), `memory` or `redis`.
    pub fn from_config(cfg: &ce_core::config::LockConfig, data_dir: &Path) -> Result<Self> {
        let settings = LockSettings::from_config(cfg);
        let provider: Arc<dyn LockProvider> = match cfg.provider.as_str() {
            "filesystem" => {
                let dir = if cfg.dir.is_empty() {
                    data_dir.join("locks")
                } else {
                    Path::new(&cfg.dir).to_path_buf()
                };
                Arc::new(FilesystemProvider::open(&dir)?)
            }
            "memory" => Arc::new(MemoryProvider::new()),
            "redis" => Arc::new(crate::redis::RedisProvider::connect(
                &cfg.redis_url,
                &cfg.service_name,
            )?),
            other => {
                return Err(LockError::Invalid(format!(
                    "unknown lock provider {other:?} (filesystem, memory or redis)"
                )));
            }
        };
        Ok(LockManager::new(provider, settings))
    }

    /// A manager over the same provider that waits `wait` instead (e.g. none for background
    /// work that simply tries again on its next round); the two wake each other's waiters.
    pub fn with_wait(&self, wait: Duration) -> LockManager {
        LockManager::sharing(
            Arc::clone(&self.inner.provider),
            LockSettings {
                wait,
                ..self.inner.settings.clone()
            },
            Arc::clone(&self.inner.releases),
        )
    }

    /// `memory`, `filesystem` or `redis`.
    pub fn provider_name(&self) -> &'static str {
        self.inner.provider.name()
    }

    /// The timing this manager uses.
    pub fn settings(&self) -> &LockSettings {
        &self.inner.settings
    }

    /// Locks `reqs` (one scope), waiting up to `settings.wait` while another owner holds a
    /// conflicting lock — woken by a release in this process, else retrying after a
    /// jittered exponential backoff (a holder in another process) —; then
    /// [`LockError::Busy`].
    pub fn acquire(&self, reqs: &[LockRequest]) -> Result<Lease> {
        let reqs = normalize_batch(reqs)?;
        let tokens = self.grant(&new_owner(), &reqs, self.inner.settings.wait)?;
        Ok(self.register(reqs, tokens))
    }

    /// Locks `reqs` in one attempt: [`LockError::Busy`] (`waited_ms` 0) on a conflict.
    pub fn try_acquire(&self, reqs: &[LockRequest]) -> Result<Lease> {
        let reqs = normalize_batch(reqs)?;
        let tokens = self.grant(&new_owner(), &reqs, Duration::ZERO)?;
        Ok(self.register(reqs, tokens))
    }

    /// Takes over a handed-off lease under a fresh owner id, keeping its fences. When its
    /// tokens are stale (older than `expire`, removed or not) or gone, the covered paths are
    /// locked again with new fences (the spec's recoverable expired hand-off), waiting like
    /// [`LockManager::acquire`]; another owner holding them is [`LockError::Busy`].
    pub fn adopt(&self, r: &LeaseRef) -> Result<Lease> {
        let covered = normalize_batch(&r.covered)?;
        if covered.len() != r.covered.len()
            || r.tokens.is_empty()
            || r.tokens.iter().any(|t| t.owner != r.owner)
            || r.tokens.iter().any(|t| !covered.contains(&t.request))
        {
            return Err(LockError::Invalid(format!(
                "lease reference of {} does not match its covered paths",
                r.owner
            )));
        }
        let owner = new_owner();
        let provider = &self.inner.provider;
        let now = now_ns();
        let expire_ns = self.inner.settings.expire_ns();
        let expired = r
            .tokens
            .iter()
            .find(|t| now.saturating_sub(t.time_ns) > expire_ns);
        let why = match expired {
            // Stale (even if nobody removed it yet): new fences, so that writes of the
            // original holder, should it still be running, are rejected after ours.
            Some(t) => LockError::Lost {
                path: t.request.path.clone(),
                reason: "hand-off expired".into(),
            },
            None => match provider.transfer(&r.tokens, &owner, now) {
                Ok(tokens) => return Ok(self.register(covered, tokens)),
                Err(e @ LockError::Lost { .. }) => e,
                Err(e) => return Err(e),
            },
        };
        tracing::info!(old_owner = %r.owner, reason = %why, "locking the paths of a handed-off lease again");
        // Tokens the old owner still has would conflict with the new owner.
        self.inner.release(&r.tokens)?;
        let tokens = self.grant(&owner, &covered, self.inner.settings.wait)?;
        Ok(self.register(covered, tokens))
    }

    /// Attempts until granted or `wait` passed.
    fn grant(&self, owner: &str, reqs: &[LockRequest], wait: Duration) -> Result<Vec<Token>> {
        self.grant_backing_off(owner, reqs, wait, (BACKOFF_START, BACKOFF_CAP))
    }

    /// [`LockManager::grant`] with the backoff's first and longest steps.
    fn grant_backing_off(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        wait: Duration,
        (first, cap): (Duration, Duration),
    ) -> Result<Vec<Token>> {
        let provider = &self.inner.provider;
        let releases = &self.inner.releases;
        let expire_ns = self.inner.settings.expire_ns();
        let start = Instant::now();
        let mut step = first;
        loop {
            // Read before the attempt: a release between the attempt and the wait still wakes it.
            let seen = releases.seen();
            let (held, holder) = match provider.try_acquire(owner, reqs, now_ns(), expire_ns) {
                Ok(tokens) => return Ok(tokens),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Conflict { held, owner }) => (held, owner),
            };
            let waited = start.elapsed();
            if waited >= wait {
                let path = reqs
                    .iter()
                    .find(|r| crate::conflicts(&held, r))
                    .unwrap_or(&reqs[0])
                    .path
                    .clone();
                let process = holder.split('-').next().unwrap_or("?");
                return Err(LockError::Busy {
                    path,
                    holder: format!("lease {holder} of process {process} on {}", held.path),
                    held: held.path.clone(),
                    mode: held.mode,
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                });
            }
            let jittered = step.mul_f64(rand::rng().random_range(0.5..1.5));
            if !releases.wait(seen, &held.path.to_string(), jittered.min(wait - waited)) {
                step = (step * 2).min(cap);
            }
        }
    }

    fn register(&self, covered: Vec<LockRequest>, tokens: Vec<Token>) -> Lease {
        let owner = tokens.first().map(|t| t.owner.clone()).unwrap_or_default();
        let state = Arc::new(LeaseState {
            owner,
            covered,
            inner: Mutex::new(LeaseInner {
                tokens,
                renewed: Instant::now(),
                lost: None,
            }),
        });
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.live).insert(id, Arc::clone(&state));
        self.ensure_renewer();
        Lease {
            manager: self.clone(),
            id,
            state,
            done: false,
        }
    }

    fn unregister(&self, id: u64) {
        lock(&self.inner.live).remove(&id);
    }

    fn ensure_renewer(&self) {
        let mut slot = lock(&self.inner.renewer);
        if slot.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<()>();
        let weak = Arc::downgrade(&self.inner);
        let period = (self.inner.settings.expire / 3).max(Duration::from_millis(1));
        let spawned = std::thread::Builder::new()
            .name("ce-lock-renew".into())
            .spawn(move || renew_loop(&weak, &rx, period));
        match spawned {
            Ok(_) => *slot = Some(tx),
            Err(e) => tracing::warn!(error = %e, "cannot start the lock renewal thread"),
        }
    }
}

/// Renews every live lease each `period` until the manager is gone.
fn renew_loop(weak: &Weak<Inner>, rx: &mpsc::Receiver<()>, period: Duration) {
    loop {
        match rx.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let leases: Vec<(u64, Arc<LeaseState>)> = lock(&inner.live)
            .iter()
            .map(|(id, s)| (*id, Arc::clone(s)))
            .collect();
        for (id, state) in leases {
            if !renew_one(&inner, &state) {
                lock(&inner.live).remove(&id);
            }
        }
    }
}

/// Refreshes one lease; false when it should no longer be renewed.
fn renew_one(inner: &Inner, state: &LeaseState) -> bool {
    let tokens = lock(&state.inner).tokens.clone();
    match inner.provider.refresh(&tokens, now_ns()) {
        Ok(fresh) => {
            let mut s = lock(&state.inner);
            s.tokens = fresh;
            s.renewed = Instant::now();
            true
        }
        Err(LockError::Lost { path, reason }) => {
            tracing::warn!(owner = %state.owner, %path, %reason, "lease lost");
            // Whatever is still ours goes; the lease is no protection any more.
            if let Err(e) = inner.release(&tokens) {
                tracing::warn!(owner = %state.owner, error = %e, "release of a lost lease failed");
            }
            lock(&state.inner).lost = Some(format!("{path}: {reason}"));
            false
        }
        Err(e) => {
            let mut s = lock(&state.inner);
            let since = s.renewed.elapsed();
            tracing::warn!(owner = %state.owner, error = %e, since_ms = since.as_millis() as u64, "lease renewal failed");
            if since >= inner.settings.expire * 2 {
                s.lost = Some(format!("not renewed for {} ms: {e}", since.as_millis()));
                drop(s);
                if let Err(e) = inner.release(&tokens) {
                    tracing::warn!(owner = %state.owner, error = %e, "release of an unrenewable lease failed");
                }
                return false;
            }
            true
        }
    }
}

impl Lease {
    /// The fencing token of every covered path (one per path, in `covered` order). Every token
    /// of one grant carries the same fence; a lease re-acquired by adopt carries newer ones.
    pub fn fences(&self) -> Vec<Fence> {
        let s = lock(&self.state.inner);
        self.state
            .covered
            .iter()
            .filter_map(|c| {
                s.tokens.iter().find(|t| t.request == *c).map(|t| Fence {
                    path: c.path.clone(),
                    token: t.fence,
                })
            })
            .collect()
    }

    /// The locked paths and modes.
    pub fn covered(&self) -> &[LockRequest] {
        &self.state.covered
    }

    /// This lease's owner id, as the provider tokens carry it.
    pub fn owner(&self) -> &str {
        &self.state.owner
    }

    /// [`LockError::Lost`] once renewal found a token gone or replaced, or when the last
    /// successful renewal is older than `expire` (a paused process must not believe it
    /// still holds the lock).
    pub fn check(&self) -> Result<()> {
        let s = lock(&self.state.inner);
        let path = || {
            self.state
                .covered
                .first()
                .map(|r| r.path.clone())
                .unwrap_or_else(ce_core::CtxUri::root)
        };
        if let Some(reason) = &s.lost {
            return Err(LockError::Lost {
                path: path(),
                reason: reason.clone(),
            });
        }
        let since = s.renewed.elapsed();
        if since > self.manager.inner.settings.expire {
            return Err(LockError::Lost {
                path: path(),
                reason: format!("not renewed for {} ms", since.as_millis()),
            });
        }
        Ok(())
    }

    /// Stops renewing and returns the reference a background job adopts; the tokens stay
    /// until adopted or stale.
    pub fn hand_off(mut self) -> LeaseRef {
        self.done = true;
        self.manager.unregister(self.id);
        let s = lock(&self.state.inner);
        LeaseRef {
            owner: self.state.owner.clone(),
            covered: self.state.covered.clone(),
            tokens: s.tokens.clone(),
        }
    }

    /// Releases the tokens still stored as this lease wrote them.
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        self.release_tokens()
    }

    fn release_tokens(&self) -> Result<()> {
        self.manager.unregister(self.id);
        let tokens = lock(&self.state.inner).tokens.clone();
        self.manager.inner.release(&tokens)
    }

    #[cfg(test)]
    fn backdate_renewal(&self, by: Duration) {
        let mut s = lock(&self.state.inner);
        s.renewed = s
            .renewed
            .checked_sub(by)
            .expect("monotonic clock older than `by`");
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.release_tokens() {
            tracing::warn!(owner = %self.state.owner, error = %e, "lease release on drop failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ce_core::CtxUri;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn manager() -> LockManager {
        LockManager::new(
            Arc::new(MemoryProvider::new()),
            LockSettings {
                // Long enough that the renewal thread never runs during a test.
                expire: Duration::from_secs(30),
                wait: Duration::ZERO,
            },
        )
    }

    #[test]
    fn empty_and_cross_scope_batches_are_invalid() {
        let m = manager();
        assert!(matches!(m.acquire(&[]), Err(LockError::Invalid(_))));
        let cross = [
            LockRequest::exact(uri("ctx://a/x")),
            LockRequest::exact(uri("ctx://b/x")),
        ];
        assert!(matches!(m.acquire(&cross), Err(LockError::Invalid(_))));
        let root_and_account = [
            LockRequest::tree(uri("ctx://")),
            LockRequest::exact(uri("ctx://a")),
        ];
        assert!(matches!(
            m.try_acquire(&root_and_account),
            Err(LockError::Invalid(_))
        ));
    }

    #[test]
    fn duplicate_paths_keep_the_tree_request() {
        let batch = [
            LockRequest::exact(uri("ctx://a/x")),
            LockRequest::exact(uri("ctx://a/y")),
            LockRequest::tree(uri("ctx://a/x")),
            LockRequest::exact(uri("ctx://a/y")),
        ];
        assert_eq!(
            normalize_batch(&batch).expect("one scope"),
            vec![
                LockRequest::tree(uri("ctx://a/x")),
                LockRequest::exact(uri("ctx://a/y"))
            ]
        );
        let lease = manager().acquire(&batch).expect("granted");
        assert_eq!(lease.fences().len(), 2);
    }

    #[test]
    fn a_lease_not_renewed_for_expire_reports_lost() {
        let m = manager();
        let lease = m
            .acquire(&[LockRequest::exact(uri("ctx://a/x"))])
            .expect("granted");
        lease.check().expect("fresh lease holds");
        lease.backdate_renewal(Duration::from_secs(31));
        assert!(matches!(lease.check(), Err(LockError::Lost { .. })));
    }

    #[test]
    fn owner_ids_are_unique_and_colon_free() {
        let a = new_owner();
        let b = new_owner();
        assert_ne!(a, b);
        assert!(!a.contains(':'));
        assert!(a.starts_with(&format!("{}-", std::process::id())));
    }

    #[test]
    fn a_waiter_is_woken_by_a_release_in_this_process_not_by_its_backoff() {
        let m = manager();
        let path = [LockRequest::tree(uri("ctx://a/base"))];
        let held = m.acquire(&path).expect("granted");
        // Through a manager of `with_wait`: the two share their releases.
        let other = m.with_wait(Duration::from_secs(120));
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            tx.send(()).expect("send");
            // A backoff of a minute: only a release can grant it in time.
            let minute = Duration::from_secs(60);
            let tokens = other
                .grant_backing_off(
                    &new_owner(),
                    &path,
                    Duration::from_secs(120),
                    (minute, minute),
                )
                .expect("granted after the release");
            (Instant::now(), tokens)
        });
        rx.recv().expect("waiter started");
        // Let it find the lock held and start waiting.
        std::thread::sleep(Duration::from_millis(200));
        let released = Instant::now();
        held.release().expect("release");
        let (granted, tokens) = waiter.join().expect("waiter");
        assert!(!tokens.is_empty());
        let after = granted.duration_since(released);
        assert!(
            after < Duration::from_secs(20),
            "granted {after:?} after the release: it slept out its backoff"
        );
    }

    #[test]
    fn a_release_wakes_only_the_waiters_of_its_paths() {
        let releases = Arc::new(Releases::default());
        let token = |path: &str| Token {
            request: LockRequest::exact(uri(path)),
            owner: "1-a".into(),
            time_ns: 0,
            fence: crate::FenceToken(0),
            location: String::new(),
        };
        let seen = releases.seen();
        let waiter = {
            let releases = Arc::clone(&releases);
            std::thread::spawn(move || {
                let woken = releases.wait(seen, "ctx://a/x", Duration::from_secs(60));
                (woken, Instant::now())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        releases.notify(&[token("ctx://a/other")]);
        // The unrelated release must not end the wait: it is still asleep a while later.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !waiter.is_finished(),
            "woken by the release of another path"
        );
        let released = Instant::now();
        releases.notify(&[token("ctx://a/y"), token("ctx://a/x")]);
        let (woken, at) = waiter.join().expect("waiter");
        assert!(woken && at >= released);
        // Released before the wait began (after `seen`): no sleep at all.
        assert!(releases.wait(seen, "ctx://a/x", Duration::from_secs(60)));
        assert!(!releases.wait(releases.seen(), "ctx://a/x", Duration::from_millis(10)));
    }

    #[test]
    fn a_waiter_older_than_the_remembered_releases_is_woken() {
        let releases = Releases::default();
        let seen = releases.seen();
        let token = Token {
            request: LockRequest::exact(uri("ctx://a/other")),
            owner: "1-a".into(),
            time_ns: 0,
            fence: crate::FenceToken(0),
            location: String::new(),
        };
        for _ in 0..=RECENT_RELEASES {
            releases.notify(std::slice::from_ref(&token));
        }
        // Its path may have been released among the forgotten ones: it must try again.
        assert!(releases.wait(seen, "ctx://a/x", Duration::from_millis(10)));
        assert!(!releases.wait(seen + 1, "ctx://a/x", Duration::from_millis(10)));
    }

    #[test]
    fn settings_from_config() {
        let s = LockSettings::from_config(&ce_core::config::LockConfig::default());
        assert_eq!(s.expire, Duration::from_secs(30));
        assert_eq!(s.wait, Duration::from_millis(3_000));
    }
}
