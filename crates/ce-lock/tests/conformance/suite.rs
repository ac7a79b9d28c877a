//! Every conformance case, generic over a provider fixture. Provider-level cases inject
//! `now_ns` and `expire_ns`; manager-level cases run on the real clock with short expiries
//! and wait with generous deadlines (never asserting speed).

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::CtxUri;
use ce_lock::manager::now_ns;
use ce_lock::{
    Attempt, FenceToken, LeaseRef, LockError, LockManager, LockMode, LockProvider, LockRequest,
    LockSettings, Token, conflicts, lk1_violation,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};

/// A provider under test.
pub struct Fixture {
    /// The provider.
    pub provider: Arc<dyn LockProvider>,
    /// A second handle on the same namespace: the same object for memory, the lock directory
    /// opened again for filesystem, another connection for redis.
    pub second: Arc<dyn LockProvider>,
    /// Whatever must outlive the providers (a temporary directory).
    #[expect(dead_code, reason = "held for its drop")]
    pub keep: Option<Box<dyn Any>>,
}

/// Makes a fresh, empty namespace; `None` skips the suite (provider unavailable).
pub type Make = fn() -> Option<Fixture>;

/// Instantiates every case of the suite for a fixture factory.
macro_rules! conformance_tests {
    ($make:path) => {
        conformance_tests!(@cases $make;
            fences_strictly_increase,
            batch_is_all_or_nothing,
            stale_tokens_are_cleaned_by_the_next_acquire,
            refresh_keeps_a_lock_alive,
            transfer_keeps_the_fence_and_moves_ownership,
            scopes_are_independent,
            own_tokens_never_conflict,
            acquire_waits_then_busy_and_drop_releases,
            acquire_gets_the_lock_released_during_the_wait,
            hand_off_then_adopt_moves_the_tokens,
            adopt_after_expiry_locks_again_with_new_fences,
            adopt_after_expiry_taken_by_another_is_busy,
            renewal_keeps_a_lease_alive,
            a_stolen_lease_reports_lost,
            matches_the_model,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::suite::$case($make)
            }
        )*
    };
}

/// A fixed "now" for provider-level cases (2023-11-14), in nanoseconds.
pub(crate) const T0: u64 = 1_700_000_000_000_000_000;
/// 30 s in nanoseconds.
pub(crate) const EXP: u64 = 30_000_000_000;

pub fn uri(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

/// An EXACT request on `p`.
pub(crate) fn e(p: &str) -> LockRequest {
    LockRequest::exact(uri(p))
}

/// A TREE request on `p`.
pub(crate) fn t(p: &str) -> LockRequest {
    LockRequest::tree(uri(p))
}

/// The tokens of an attempt that must be granted (one per request, stamped `now`).
pub(crate) fn grant(
    p: &dyn LockProvider,
    owner: &str,
    reqs: &[LockRequest],
    now: u64,
) -> Vec<Token> {
    match p.try_acquire(owner, reqs, now, EXP) {
        Ok(tokens) => {
            assert_eq!(tokens.len(), reqs.len(), "one token per request");
            for (tok, req) in tokens.iter().zip(reqs) {
                assert_eq!(&tok.request, req);
                assert_eq!(tok.owner, owner);
                assert_eq!(tok.time_ns, now);
            }
            tokens
        }
        Err(Attempt::Conflict { held, owner: o }) => {
            panic!("{owner} {reqs:?}: unexpected conflict with {held:?} of {o}")
        }
        Err(Attempt::Failed(e)) => panic!("{owner} {reqs:?}: provider failed: {e}"),
    }
}

/// The conflicting lock and owner of a refused attempt.
fn refused(
    p: &dyn LockProvider,
    owner: &str,
    reqs: &[LockRequest],
    now: u64,
) -> (LockRequest, String) {
    match p.try_acquire(owner, reqs, now, EXP) {
        Ok(tokens) => panic!("{owner} {reqs:?}: granted {tokens:?}, expected a conflict"),
        Err(Attempt::Conflict { held, owner }) => (held, owner),
        Err(Attempt::Failed(e)) => panic!("{owner} {reqs:?}: provider failed: {e}"),
    }
}

fn is_lost<T: std::fmt::Debug>(r: ce_lock::Result<T>) -> bool {
    match r {
        Err(LockError::Lost { .. }) => true,
        other => panic!("expected Lost, got {other:?}"),
    }
}

fn max_fence(tokens: &[Token]) -> FenceToken {
    tokens.iter().map(|t| t.fence).max().expect("tokens")
}

fn min_fence(tokens: &[Token]) -> FenceToken {
    tokens.iter().map(|t| t.fence).min().expect("tokens")
}

/// A fixture, or `None` (with a note) when the provider is unavailable.
fn start(make: Make) -> Option<Fixture> {
    let fx = make();
    if fx.is_none() {
        eprintln!("provider unavailable: skipped");
    }
    fx
}

// ---- provider level ----

pub fn fences_strictly_increase(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    let g1 = grant(p, "o1", &[e("ctx://a/x")], T0);
    assert!(g1[0].fence.0 >= T0 / 1_000, "fence below the clock in µs");
    let g2 = grant(p, "o2", &[e("ctx://a/y"), t("ctx://a/z")], T0);
    assert!(min_fence(&g2) > max_fence(&g1));
    p.release(&g1).expect("release");
    let g3 = grant(p, "o1", &[e("ctx://a/x")], T0);
    assert!(
        min_fence(&g3) > max_fence(&g2),
        "a re-grant of a released path is newer"
    );
    // The clock going back does not make tokens go back.
    let g4 = grant(p, "o3", &[e("ctx://b/x")], T0 - 1_000_000_000);
    assert!(min_fence(&g4) > max_fence(&g3));
    // The second handle shares the counter.
    let g5 = grant(&*fx.second, "o4", &[e("ctx://b/y")], T0);
    assert!(min_fence(&g5) > max_fence(&g4));
    // A fresh namespace (the memory provider after a restart) a millisecond later still
    // issues newer tokens: the clock floor.
    let fresh = make().expect("a second fixture");
    let g6 = grant(&*fresh.provider, "o5", &[e("ctx://a/x")], T0 + 1_000_000);
    assert!(
        min_fence(&g6) > max_fence(&g5),
        "a restarted provider went back"
    );
}

pub fn batch_is_all_or_nothing(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    grant(p, "o2", &[e("ctx://a/docs/y")], T0);
    let (held, owner) = refused(p, "o1", &[e("ctx://a/docs/x"), e("ctx://a/docs/y")], T0);
    assert_eq!(held, e("ctx://a/docs/y"));
    assert_eq!(owner, "o2");
    // The first request of the refused batch left nothing behind.
    grant(p, "o3", &[e("ctx://a/docs/x")], T0);
    // Same with the conflict found through an ancestor TREE lock, first request new.
    grant(p, "o4", &[t("ctx://a/img")], T0);
    let (held, owner) = refused(p, "o1", &[e("ctx://a/new"), e("ctx://a/img/deep/f")], T0);
    assert_eq!((held, owner.as_str()), (t("ctx://a/img"), "o4"));
    grant(p, "o5", &[e("ctx://a/new")], T0);
}

pub fn stale_tokens_are_cleaned_by_the_next_acquire(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    let old = grant(p, "o1", &[t("ctx://a/docs")], T0);
    // At exactly `expire` the token is still live.
    let (held, owner) = refused(p, "o2", &[e("ctx://a/docs/x")], T0 + EXP);
    assert_eq!((held, owner.as_str()), (t("ctx://a/docs"), "o1"));
    let new = grant(p, "o2", &[e("ctx://a/docs/x")], T0 + EXP + 1);
    assert!(min_fence(&new) > max_fence(&old));
    // The stale token is gone: a TREE lock on the same path is now free for others.
    let tree = grant(p, "o3", &[t("ctx://a/docs/other")], T0 + EXP + 1);
    // The old holder acts on nothing it no longer owns.
    assert!(is_lost(p.refresh(&old, T0 + EXP + 2)));
    assert!(is_lost(p.transfer(&old, "o9", T0 + EXP + 2)));
    p.release(&old).expect("release of a lost token is a no-op");
    let (_, owner) = refused(p, "o4", &[t("ctx://a/docs")], T0 + EXP + 2);
    assert!(owner == "o2" || owner == "o3", "{owner}");
    p.release(&new).expect("release");
    p.release(&tree).expect("release");
    grant(p, "o4", &[t("ctx://a/docs")], T0 + EXP + 3);
}

pub fn refresh_keeps_a_lock_alive(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    let g = grant(p, "o1", &[e("ctx://a/x"), t("ctx://a/d")], T0);
    let r = p.refresh(&g, T0 + EXP / 2).expect("refresh");
    for (a, b) in g.iter().zip(&r) {
        assert_eq!(
            (&a.request, &a.owner, a.fence),
            (&b.request, &b.owner, b.fence)
        );
        assert_eq!(b.time_ns, T0 + EXP / 2);
    }
    // Stale by the first stamp, live by the refreshed one.
    refused(p, "o2", &[e("ctx://a/x")], T0 + EXP + 1);
    refused(p, "o2", &[e("ctx://a/d/f")], T0 + EXP + 1);
    // Stale by the refreshed stamp too.
    grant(
        p,
        "o2",
        &[e("ctx://a/x"), e("ctx://a/d/f")],
        T0 + EXP / 2 + EXP + 1,
    );
    assert!(is_lost(p.refresh(&r, T0 + 2 * EXP)));
}

pub fn transfer_keeps_the_fence_and_moves_ownership(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    let g = grant(p, "o1", &[t("ctx://a/docs"), e("ctx://a/img")], T0);
    let moved = p.transfer(&g, "o2", T0 + 5).expect("transfer");
    for (a, b) in g.iter().zip(&moved) {
        assert_eq!((&a.request, a.fence), (&b.request, b.fence));
        assert_eq!((b.owner.as_str(), b.time_ns), ("o2", T0 + 5));
    }
    let (_, owner) = refused(p, "o3", &[e("ctx://a/docs/x")], T0 + 6);
    assert_eq!(owner, "o2");
    assert!(is_lost(p.refresh(&g, T0 + 6)), "the old owner refreshed");
    assert!(
        is_lost(p.transfer(&g, "o5", T0 + 6)),
        "the old owner transferred"
    );
    p.release(&g).expect("release by the old owner is a no-op");
    let (_, owner) = refused(p, "o3", &[e("ctx://a/img")], T0 + 6);
    assert_eq!(owner, "o2");
    let moved = fx
        .second
        .refresh(&moved, T0 + 7)
        .expect("the new owner refreshes");
    fx.second.release(&moved).expect("release");
    grant(p, "o3", &[e("ctx://a/docs/x"), e("ctx://a/img")], T0 + 8);
}

pub fn scopes_are_independent(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    grant(p, "o1", &[t("ctx://a")], T0);
    grant(p, "o2", &[t("ctx://b")], T0);
    grant(p, "o3", &[LockRequest::tree(CtxUri::root())], T0);
    let (held, owner) = refused(p, "o4", &[LockRequest::exact(CtxUri::root())], T0);
    assert_eq!((held.path, owner.as_str()), (CtxUri::root(), "o3"));
    let (held, owner) = refused(p, "o5", &[e("ctx://a/x")], T0);
    assert_eq!((held, owner.as_str()), (t("ctx://a"), "o1"));
    // Sibling whose name extends another's is not below it.
    grant(p, "o6", &[t("ctx://c/doc")], T0);
    grant(p, "o7", &[e("ctx://c/docs/x")], T0);
}

pub fn own_tokens_never_conflict(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let p = &*fx.provider;
    grant(p, "o1", &[t("ctx://a/docs")], T0);
    grant(p, "o1", &[e("ctx://a/docs/x")], T0);
    grant(p, "o1", &[e("ctx://a/docs")], T0);
    let (_, owner) = refused(p, "o2", &[e("ctx://a/docs/y")], T0);
    assert_eq!(owner, "o1");
}

// ---- manager level ----

fn manager(p: &Arc<dyn LockProvider>, expire: Duration, wait: Duration) -> LockManager {
    LockManager::new(Arc::clone(p), LockSettings { expire, wait })
}

const LONG: Duration = Duration::from_secs(30);

pub fn acquire_waits_then_busy_and_drop_releases(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let m1 = manager(&fx.provider, LONG, Duration::ZERO);
    let m2 = manager(&fx.second, LONG, Duration::from_millis(300));
    let lease = m1.acquire(&[t("ctx://a/docs")]).expect("acquire");
    match m2.acquire(&[e("ctx://a/img"), e("ctx://a/docs/x")]) {
        Err(LockError::Busy {
            path,
            holder,
            held,
            mode,
            waited_ms,
        }) => {
            assert_eq!(path, uri("ctx://a/docs/x"));
            assert_eq!(held, uri("ctx://a/docs"));
            assert!(holder.contains(lease.owner()), "{holder}");
            assert_eq!(mode, LockMode::Tree);
            assert!(waited_ms >= 300, "waited only {waited_ms} ms");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(matches!(
        m2.try_acquire(&[e("ctx://a/docs")]),
        Err(LockError::Busy { .. })
    ));
    drop(lease);
    let l2 = m2
        .try_acquire(&[e("ctx://a/img"), e("ctx://a/docs/x")])
        .expect("released on drop");
    l2.release().expect("release");
    m1.try_acquire(&[t("ctx://a")]).expect("all released");
}

pub fn acquire_gets_the_lock_released_during_the_wait(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let m1 = manager(&fx.provider, LONG, Duration::ZERO);
    let m2 = manager(&fx.second, LONG, Duration::from_secs(60));
    let lease = m1.acquire(&[e("ctx://a/x")]).expect("acquire");
    let first = lease.fences();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        lease.release().expect("release");
    });
    let l2 = m2
        .acquire(&[e("ctx://a/x")])
        .expect("granted once released");
    releaser.join().expect("releaser");
    assert!(l2.fences()[0].token > first[0].token);
}

pub fn hand_off_then_adopt_moves_the_tokens(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let m1 = manager(&fx.provider, LONG, Duration::ZERO);
    let m2 = manager(&fx.second, LONG, Duration::ZERO);
    let lease = m1
        .acquire(&[t("ctx://a/docs"), e("ctx://a/img")])
        .expect("acquire");
    let fences = lease.fences();
    assert_eq!(fences.len(), 2);
    let old_owner = lease.owner().to_owned();
    let r = lease.hand_off();
    assert_eq!(r.owner, old_owner);
    let json = serde_json::to_string(&r).expect("serialize");
    let back: LeaseRef = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, r);
    // Handed off, the tokens stay although the lease value is gone.
    assert!(matches!(
        m2.try_acquire(&[e("ctx://a/docs/x")]),
        Err(LockError::Busy { .. })
    ));
    let adopted = m2.adopt(&back).expect("adopt");
    assert_ne!(adopted.owner(), old_owner);
    assert_eq!(adopted.fences(), fences, "adopt keeps the fences");
    assert_eq!(adopted.covered(), r.covered.as_slice());
    match m1.try_acquire(&[e("ctx://a/img")]) {
        Err(LockError::Busy { holder, .. }) => {
            assert!(holder.contains(adopted.owner()), "{holder}")
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(is_lost(fx.provider.refresh(&r.tokens, now_ns())));
    adopted.check().expect("adopted lease holds");
    drop(adopted);
    m1.try_acquire(&[t("ctx://a")])
        .expect("released by the adopter's drop");
}

/// Sleeps until `d` of wall-clock time has passed (the tokens' clock).
fn pass(d: Duration) {
    let until = now_ns() + u64::try_from(d.as_nanos()).expect("ns");
    while now_ns() <= until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn adopt_after_expiry_locks_again_with_new_fences(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let expire = Duration::from_millis(300);
    let m1 = manager(&fx.provider, expire, Duration::ZERO);
    let m2 = manager(&fx.second, expire, Duration::ZERO);
    let r = m1
        .acquire(&[t("ctx://a/docs")])
        .expect("acquire")
        .hand_off();
    pass(expire * 2);
    let adopted = m2.adopt(&r).expect("recoverable expired hand-off");
    assert!(
        adopted.fences()[0].token > r.tokens[0].fence,
        "re-acquired with a newer fence"
    );
    assert_eq!(adopted.covered(), r.covered.as_slice());
    assert!(matches!(
        m1.try_acquire(&[e("ctx://a/docs/x")]),
        Err(LockError::Busy { .. })
    ));
}

pub fn adopt_after_expiry_taken_by_another_is_busy(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let expire = Duration::from_millis(300);
    let m1 = manager(&fx.provider, expire, Duration::ZERO);
    let m2 = manager(&fx.second, expire, Duration::from_millis(100));
    let r = m1.acquire(&[e("ctx://a/x")]).expect("acquire").hand_off();
    pass(expire * 2);
    let thief = m1
        .acquire(&[e("ctx://a/x")])
        .expect("stale hand-off taken over");
    match m2.adopt(&r) {
        Err(LockError::Busy { holder, .. }) => assert!(holder.contains(thief.owner()), "{holder}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    thief.check().expect("the thief still holds it");
}

pub fn renewal_keeps_a_lease_alive(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let expire = Duration::from_secs(2);
    let m1 = manager(&fx.provider, expire, Duration::ZERO);
    let m2 = manager(&fx.second, expire, Duration::ZERO);
    let lease = m1.acquire(&[t("ctx://a/docs")]).expect("acquire");
    pass(expire + Duration::from_secs(1));
    lease.check().expect("renewed");
    assert!(matches!(
        m2.try_acquire(&[e("ctx://a/docs/x")]),
        Err(LockError::Busy { .. })
    ));
}

pub fn a_stolen_lease_reports_lost(make: Make) {
    let Some(fx) = start(make) else {
        return;
    };
    let expire = Duration::from_secs(1);
    let m1 = manager(&fx.provider, expire, Duration::ZERO);
    let lease = m1.acquire(&[e("ctx://a/x")]).expect("acquire");
    // Another owner whose clock is far ahead sees the token stale and takes the path.
    let far = now_ns() + 100 * 1_000_000_000;
    fx.second
        .try_acquire("thief", &[e("ctx://a/x")], far, 1_000_000_000)
        .map_err(|_| "thief refused")
        .expect("thief");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match lease.check() {
            Err(LockError::Lost { .. }) => break,
            Err(other) => panic!("expected Lost, got {other}"),
            Ok(()) => {
                assert!(Instant::now() < deadline, "renewal never noticed the theft");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // Dropping the lost lease leaves the thief's token alone.
    drop(lease);
    let (_, owner) = refused(&*fx.provider, "o2", &[e("ctx://a/x")], far);
    assert_eq!(owner, "thief");
}

// ---- the model ----

/// The paths of the property tests: a small tree over two accounts.
pub(crate) const PATHS: [&str; 6] = [
    "ctx://a",
    "ctx://a/docs",
    "ctx://a/docs/x",
    "ctx://a/docs/y",
    "ctx://a/img",
    "ctx://b/docs",
];

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        owner: usize,
        reqs: Vec<(usize, bool)>,
    },
    Release {
        owner: usize,
        pick: usize,
    },
    /// Moves the clock on: past `expire` (every token stale) or by a microsecond.
    Advance {
        stale: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop::collection::vec((0..PATHS.len(), any::<bool>()), 1..=3))
            .prop_map(|(owner, reqs)| Op::Acquire { owner, reqs }),
        3 => (0..3usize, any::<usize>()).prop_map(|(owner, pick)| Op::Release { owner, pick }),
        1 => any::<bool>().prop_map(|stale| Op::Advance { stale }),
    ]
}

/// The reference: live tokens by (path, mode), with owner, grant number and stamp.
#[derive(Default)]
struct Model {
    tokens: std::collections::BTreeMap<(usize, bool), (usize, usize, u64)>,
}

fn request(path: usize, tree: bool) -> LockRequest {
    if tree { t(PATHS[path]) } else { e(PATHS[path]) }
}

fn run_case(make: Make, ops: &[Op]) -> Result<(), TestCaseError> {
    let fx = make().ok_or_else(|| TestCaseError::fail("fixture vanished"))?;
    let p = &*fx.provider;
    let mut model = Model::default();
    let mut grants: Vec<(usize, Vec<Token>)> = Vec::new();
    let mut now = T0;
    let mut last_fence = FenceToken(0);
    for (step, op) in ops.iter().enumerate() {
        now += 1_000;
        match op {
            Op::Advance { stale } => {
                if *stale {
                    now += EXP;
                }
            }
            Op::Release { owner, pick } => {
                let mine: Vec<usize> = (0..grants.len())
                    .filter(|&g| grants[g].0 == *owner)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let g = mine[pick % mine.len()];
                p.release(&grants[g].1)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: release: {e}")))?;
                model.tokens.retain(|_, (_, grant, _)| *grant != g);
            }
            Op::Acquire { owner, reqs } => {
                // One scope per batch, no duplicate (path, mode).
                let scope = |i: usize| PATHS[i].split('/').nth(2);
                let mut batch: Vec<(usize, bool)> = Vec::new();
                for r in reqs {
                    if scope(r.0) == scope(reqs[0].0) && !batch.contains(r) {
                        batch.push(*r);
                    }
                }
                let wanted: Vec<LockRequest> =
                    batch.iter().map(|&(i, tr)| request(i, tr)).collect();
                let blocking: Vec<(LockRequest, usize)> = model
                    .tokens
                    .iter()
                    .filter(|(_, (o, _, time))| o != owner && now - time <= EXP)
                    .map(|(&(i, tr), (o, _, _))| (request(i, tr), *o))
                    .filter(|(held, _)| wanted.iter().any(|w| conflicts(held, w)))
                    .collect();
                let name = format!("o{owner}");
                match p.try_acquire(&name, &wanted, now, EXP) {
                    Ok(tokens) => {
                        if let Some((held, o)) = blocking.first() {
                            return Err(TestCaseError::fail(format!(
                                "step {step}: {name} granted {wanted:?} over o{o}'s {held:?}"
                            )));
                        }
                        let fence = min_fence(&tokens);
                        prop_assert!(fence > last_fence, "step {step}: fence went back");
                        last_fence = max_fence(&tokens);
                        let g = grants.len();
                        for &(i, tr) in &batch {
                            model.tokens.insert((i, tr), (*owner, g, now));
                        }
                        grants.push((*owner, tokens));
                    }
                    Err(Attempt::Conflict { held, owner: o }) => {
                        let listed = blocking
                            .iter()
                            .any(|(h, bo)| *h == held && format!("o{bo}") == o);
                        if !listed {
                            return Err(TestCaseError::fail(format!(
                                "step {step}: {name} refused {wanted:?} because of {o}'s {held:?}; model blockers {blocking:?}"
                            )));
                        }
                    }
                    Err(Attempt::Failed(e)) => {
                        return Err(TestCaseError::fail(format!(
                            "step {step}: provider failed: {e}"
                        )));
                    }
                }
            }
        }
        // LK1 over the live tokens the provider granted.
        let live: Vec<(LockRequest, String)> = model
            .tokens
            .iter()
            .filter(|(_, (_, _, time))| now - time <= EXP)
            .map(|(&(i, tr), (o, _, _))| (request(i, tr), format!("o{o}")))
            .collect();
        if let Some((a, b)) = lk1_violation(&live) {
            return Err(TestCaseError::fail(format!(
                "step {step}: LK1 broken by {:?} and {:?}",
                live[a], live[b]
            )));
        }
    }
    Ok(())
}

pub fn matches_the_model(make: Make) {
    if start(make).is_none() {
        return;
    }
    let seed = ce_testkit::seed("matches_the_model");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(128), 2048);
    match runner.run(&prop::collection::vec(op(), 1..=40), |ops| {
        run_case(make, &ops)
    }) {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!(
            "lock model test failed (replay with CE_SEED={seed}): {why}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("lock model test aborted (CE_SEED={seed}): {e}"),
    }
}

// ---- critical sections shared by the thread and process exclusion tests ----

/// Writes the shared state file: whether someone is inside, and the newest fence seen.
pub fn write_state(path: &Path, inside: bool, fence: u64) {
    std::fs::write(path, format!("{} {fence}", u8::from(inside)))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

pub fn read_state(path: &Path) -> (bool, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (inside, fence) = text.trim().split_once(' ').expect("state `inside fence`");
    (inside == "1", fence.parse().expect("fence"))
}

/// `n` critical sections on `ctx://mx/counter`: inside, the state must say nobody is inside
/// and the newest fence must be older than ours.
pub fn critical_sections(provider: Arc<dyn LockProvider>, state: &Path, n: usize) {
    let m = manager(&provider, LONG, Duration::from_secs(120));
    for i in 0..n {
        let lease = m.acquire(&[e("ctx://mx/counter")]).expect("acquire");
        let fence = lease.fences()[0].token.0;
        let (inside, last) = read_state(state);
        assert!(!inside, "iteration {i}: someone else is inside");
        assert!(
            last < fence,
            "iteration {i}: fence {fence} not newer than {last}"
        );
        write_state(state, true, fence);
        std::thread::sleep(Duration::from_millis(1));
        write_state(state, false, fence);
        lease.check().expect("still held");
        lease.release().expect("release");
    }
}
