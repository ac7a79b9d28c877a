//! The redis provider against the suite, and what only Redis shows: the key layout and token
//! format, cleanup of stale fields, the fence counter's clock floor after a simulated restart,
//! scope isolation of the scripts, reconnects, several hosts, and a differential property test
//! against the memory provider.
//!
//! Runs against the Redis at `CE_REDIS_URL` (default `redis://127.0.0.1:6379`) and fails,
//! never skips, when it is unreachable. Every test works in its own service namespace (a
//! uuid) and deletes its keys at the end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ce_core::{Classify, CtxUri};
use ce_lock::memory::MemoryProvider;
use ce_lock::redis::{RedisProvider, client_name, key_prefix};
use ce_lock::{Attempt, LockError, LockProvider, LockRequest, Token, conflicts};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};

use crate::suite::{EXP, Fixture, T0, e, grant, t, uri};

fn redis_url() -> String {
    std::env::var("CE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A raw connection for looking at (and tampering with) the keys.
fn raw() -> redis::Connection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("redis at {} unreachable: {e}", redis_url()))
}

/// A fresh service namespace whose keys are deleted on drop.
struct Namespace {
    service: String,
}

impl Namespace {
    fn new() -> Self {
        Namespace {
            service: format!("ce-lock-test-{}", uuid::Uuid::now_v7().simple()),
        }
    }

    fn provider(&self) -> RedisProvider {
        RedisProvider::connect(&redis_url(), &self.service)
            .unwrap_or_else(|e| panic!("redis at {} unreachable: {e}", redis_url()))
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", key_prefix(&self.service))
    }

    fn account_key(&self, account: &str) -> String {
        self.key(&format!("scope:account:{account}:tokens"))
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", key_prefix(&self.service)))
            .query(&mut raw())
            .expect("KEYS");
        keys.sort();
        keys
    }

    fn hash(&self, key: &str) -> BTreeMap<String, String> {
        redis::cmd("HGETALL")
            .arg(key)
            .query(&mut raw())
            .expect("HGETALL")
    }
}

impl Drop for Namespace {
    /// Deletes the namespace's keys; never panics (it may run while a failed test unwinds).
    fn drop(&mut self) {
        let cleanup = || -> redis::RedisResult<()> {
            let mut con = redis::Client::open(redis_url())?
                .get_connection_with_timeout(Duration::from_secs(2))?;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*", key_prefix(&self.service)))
                .query(&mut con)?;
            if !keys.is_empty() {
                redis::cmd("DEL").arg(&keys).query::<i64>(&mut con)?;
            }
            Ok(())
        };
        if let Err(e) = cleanup() {
            eprintln!("keys of {} not deleted: {e}", self.service);
        }
    }
}

fn make() -> Option<Fixture> {
    let ns = Namespace::new();
    let provider: Arc<dyn LockProvider> = Arc::new(ns.provider());
    let second: Arc<dyn LockProvider> = Arc::new(ns.provider());
    Some(Fixture {
        provider,
        second,
        keep: Some(Box::new(ns)),
    })
}

conformance_tests!(make);

/// Whether the attempt was refused by a conflict (`None` when granted; tokens released).
fn attempt(
    p: &dyn LockProvider,
    owner: &str,
    reqs: &[LockRequest],
    now: u64,
) -> Option<(LockRequest, String)> {
    match p.try_acquire(owner, reqs, now, EXP) {
        Ok(tokens) => {
            p.release(&tokens).expect("release");
            None
        }
        Err(Attempt::Conflict { held, owner }) => Some((held, owner)),
        Err(Attempt::Failed(e)) => panic!("{owner} {reqs:?}: provider failed: {e}"),
    }
}

/// Every row of the spec's two conflict tables, decided by the provider, equals both the
/// table and `conflicts()`.
#[test]
fn every_row_of_the_conflict_tables() {
    let ns = Namespace::new();
    let p = ns.provider();
    // (held, wanted, conflict), spec "锁类型" then "路径范围与目标类型", then the cells the
    // tables leave implicit and the scope rules.
    let rows = [
        (e("ctx://a/d"), e("ctx://a/d"), true),
        (t("ctx://a/d"), e("ctx://a/d"), true),
        (e("ctx://a/d/x"), e("ctx://a/d"), false),
        (t("ctx://a/d"), e("ctx://a/d/x/y"), true),
        (e("ctx://a/d"), t("ctx://a/d"), true),
        (t("ctx://a/d"), t("ctx://a/d"), true),
        (e("ctx://a/d/x/y"), t("ctx://a/d"), true),
        (t("ctx://a"), t("ctx://a/d"), true),
        (e("ctx://a/docs/a.md"), e("ctx://a/docs/a.md"), true),
        (e("ctx://a/docs/a.md"), t("ctx://a/docs/a.md"), true),
        (e("ctx://a/docs"), e("ctx://a/docs/a.md"), false),
        (t("ctx://a/docs"), e("ctx://a/docs/a.md"), true),
        (t("ctx://a/docs"), t("ctx://a/docs/a.md"), true),
        (e("ctx://a/docs/a.md"), t("ctx://a/docs"), true),
        (t("ctx://a/docs/a.md"), e("ctx://a/docs/b.md"), false),
        (e("ctx://a/d"), t("ctx://a/d/x"), false),
        (t("ctx://a/d/x"), t("ctx://a/d"), true),
        (t("ctx://a/d/x"), e("ctx://a/d"), false),
        (t("ctx://a/doc"), e("ctx://a/docs"), false),
        (e("ctx://a/docs"), t("ctx://a/doc"), false),
        (t("ctx://a"), e("ctx://b/x"), false),
        (LockRequest::tree(CtxUri::root()), e("ctx://a/x"), false),
        (e("ctx://a/x"), LockRequest::tree(CtxUri::root()), false),
        (
            LockRequest::tree(CtxUri::root()),
            LockRequest::exact(CtxUri::root()),
            true,
        ),
    ];
    for (held, wanted, want) in rows {
        assert_eq!(
            conflicts(&held, &wanted),
            want,
            "table vs conflicts(): {held:?} {wanted:?}"
        );
        let h = grant(&p, "o1", std::slice::from_ref(&held), T0);
        let got = attempt(&p, "o2", std::slice::from_ref(&wanted), T0);
        assert_eq!(
            got.is_some(),
            want,
            "held {held:?} wanted {wanted:?}: {got:?}"
        );
        if let Some((by, owner)) = got {
            assert_eq!((by, owner.as_str()), (held.clone(), "o1"));
        }
        p.release(&h).expect("release");
    }
    assert_eq!(ns.keys(), vec![ns.key("fence")], "every token released");
}

/// Every (held, wanted) pair over a small tree, both modes, decided as `conflicts()` says.
#[test]
fn every_pair_on_a_small_tree_matches_conflicts() {
    let ns = Namespace::new();
    let p = ns.provider();
    let paths = [
        "ctx://",
        "ctx://a",
        "ctx://a/d",
        "ctx://a/d/x",
        "ctx://a/d/x/y",
        "ctx://a/dx",
        "ctx://b/d",
    ];
    let reqs: Vec<LockRequest> = paths
        .iter()
        .flat_map(|s| {
            let u = uri(s);
            [LockRequest::exact(u.clone()), LockRequest::tree(u)]
        })
        .collect();
    for held in &reqs {
        let h = grant(&p, "o1", std::slice::from_ref(held), T0);
        for wanted in &reqs {
            let got = attempt(&p, "o2", std::slice::from_ref(wanted), T0);
            assert_eq!(
                got.is_some(),
                conflicts(held, wanted),
                "held {held:?} wanted {wanted:?}"
            );
        }
        p.release(&h).expect("release");
    }
}

/// Layout: hash per scope under the service's hash tag, field = URI, value =
/// `{owner}:{time_ns}:{E|T}:{fence}`; the root goes to the global hash.
#[test]
fn tokens_are_stored_in_the_spec_layout() {
    let ns = Namespace::new();
    let p = ns.provider();
    let g = grant(&p, "o1", &[e("ctx://acc/x"), t("ctx://acc/d")], T0);
    let fence = g[0].fence;
    assert_eq!(g[1].fence, fence, "one fence per grant");
    let r = grant(&p, "o2", &[LockRequest::tree(CtxUri::root())], T0 + 1);
    assert_eq!(
        ns.keys(),
        vec![
            ns.key("fence"),
            ns.key("global:tokens"),
            ns.account_key("acc")
        ]
    );
    assert!(ns.key("fence").starts_with(&format!("{{{}}}:", ns.service)));
    let acc = ns.hash(&ns.account_key("acc"));
    assert_eq!(acc["ctx://acc/x"], format!("o1:{T0}:E:{fence}"));
    assert_eq!(acc["ctx://acc/d"], format!("o1:{T0}:T:{fence}"));
    assert_eq!(acc.len(), 2);
    let global = ns.hash(&ns.key("global:tokens"));
    assert_eq!(global["ctx://"], format!("o2:{}:T:{}", T0 + 1, r[0].fence));
    let counter: u64 = redis::cmd("GET")
        .arg(ns.key("fence"))
        .query(&mut raw())
        .expect("GET");
    assert_eq!(counter, r[0].fence.0);
}

/// A refused batch writes no token (the hash is as before, byte for byte), whichever request
/// meets the conflict and however (same path, ancestor TREE, descendant under a TREE).
#[test]
fn a_refused_batch_writes_nothing() {
    let ns = Namespace::new();
    let p = ns.provider();
    grant(&p, "o1", &[t("ctx://a/lib"), e("ctx://a/docs/x/deep")], T0);
    let before = ns.hash(&ns.account_key("a"));
    let fence_before: u64 = redis::cmd("GET")
        .arg(ns.key("fence"))
        .query(&mut raw())
        .expect("GET");
    for batch in [
        vec![e("ctx://a/new1"), e("ctx://a/lib")],
        vec![e("ctx://a/new1"), e("ctx://a/new2"), e("ctx://a/lib/f")],
        vec![e("ctx://a/new1"), t("ctx://a/docs")],
        vec![t("ctx://a/new1"), t("ctx://a")],
    ] {
        assert!(attempt(&p, "o2", &batch, T0).is_some(), "{batch:?}");
        assert_eq!(ns.hash(&ns.account_key("a")), before, "{batch:?}");
    }
    let fence_after: u64 = redis::cmd("GET")
        .arg(ns.key("fence"))
        .query(&mut raw())
        .expect("GET");
    assert_eq!(fence_after, fence_before, "no fence spent on refusals");
}

/// Stale fields met by an acquire are deleted in Redis: EXACT on the ancestors it reads,
/// TREE over the whole scope hash; stale fields it does not read stay.
#[test]
fn stale_fields_are_deleted_by_the_next_acquire() {
    let ns = Namespace::new();
    let p = ns.provider();
    let key = ns.account_key("a");
    grant(&p, "o1", &[t("ctx://a/d")], T0);
    grant(&p, "o1", &[e("ctx://a/other")], T0);
    let live = grant(&p, "o3", &[e("ctx://a/fresh")], T0 + EXP);
    // EXACT below a stale TREE: the ancestor field goes, the unrelated stale one stays.
    grant(&p, "o2", &[e("ctx://a/d/x")], T0 + EXP + 1);
    let h = ns.hash(&key);
    assert!(!h.contains_key("ctx://a/d"), "{h:?}");
    assert!(h.contains_key("ctx://a/other"), "{h:?}");
    // TREE scans the hash: every stale field goes, live ones stay.
    grant(&p, "o2", &[t("ctx://a/zz")], T0 + EXP + 2);
    let h = ns.hash(&key);
    assert!(!h.contains_key("ctx://a/other"), "{h:?}");
    assert_eq!(
        h["ctx://a/fresh"],
        format!("o3:{}:E:{}", T0 + EXP, live[0].fence)
    );
    assert_eq!(h.len(), 3, "{h:?}");
}

/// Fences strictly increase, also when the counter is lost (the key deleted: a Redis that
/// restarted without persistence) thanks to the wall-clock floor, and keep increasing when
/// the counter runs ahead of the clock.
#[test]
fn fences_survive_a_lost_counter() {
    let ns = Namespace::new();
    let p = ns.provider();
    let now = ce_lock::manager::now_ns;
    let mut last = grant(&p, "o1", &[e("ctx://a/x")], now())[0].fence;
    let mut con = raw();
    for round in 0..5 {
        let _: i64 = redis::cmd("DEL")
            .arg(ns.key("fence"))
            .query(&mut con)
            .expect("DEL");
        // A microsecond at least passes on the clock before the next grant.
        std::thread::sleep(Duration::from_millis(1));
        let f = grant(&p, "o1", &[e("ctx://a/x")], now())[0].fence;
        assert!(f > last, "round {round}: {f} after {last}");
        last = f;
    }
    // A counter far ahead of the clock keeps counting.
    let ahead = last.0 + 1_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(ns.key("fence"))
        .arg(ahead)
        .query(&mut con)
        .expect("SET");
    let f = grant(&p, "o1", &[e("ctx://a/x")], now())[0].fence;
    assert_eq!(f.0, ahead + 1);
    // An injected clock in the future raises the floor.
    let future = now() + 3_600_000_000_000_000;
    let f = grant(&p, "o1", &[e("ctx://a/x")], future)[0].fence;
    assert_eq!(f.0, future / 1_000);
}

/// Refresh, transfer and release act only on tokens still stored as written; release of a
/// replaced token leaves the new holder's alone.
#[test]
fn only_still_owned_tokens_are_refreshed_moved_or_released() {
    let ns = Namespace::new();
    let p = ns.provider();
    let key = ns.account_key("a");
    let old = grant(&p, "o1", &[e("ctx://a/x")], T0);
    let new = grant(&p, "o2", &[e("ctx://a/x")], T0 + EXP + 1);
    let lost = |r: ce_lock::Result<Vec<Token>>| match r {
        Err(err @ LockError::Lost { .. }) => {
            assert!(err.is_retryable());
            true
        }
        other => panic!("expected Lost, got {other:?}"),
    };
    assert!(lost(p.refresh(&old, T0 + EXP + 2)));
    assert!(lost(p.transfer(&old, "o9", T0 + EXP + 2)));
    p.release(&old).expect("release");
    let stored = format!("o2:{}:E:{}", T0 + EXP + 1, new[0].fence);
    assert_eq!(ns.hash(&key)["ctx://a/x"], stored);
    // Same owner, other fence (an older grant of the same owner) is not the token either.
    let mut forged = new.clone();
    forged[0].fence = old[0].fence;
    assert!(lost(p.refresh(&forged, T0 + EXP + 3)));
    p.release(&forged).expect("release");
    assert_eq!(ns.hash(&key)["ctx://a/x"], stored);
    // A refresh of a batch with one lost token writes nothing.
    let other = grant(&p, "o2", &[e("ctx://a/y")], T0 + EXP + 1);
    let mixed = [other[0].clone(), old[0].clone()];
    assert!(lost(p.refresh(&mixed, T0 + EXP + 4)));
    assert_eq!(
        ns.hash(&key)["ctx://a/y"],
        format!("o2:{}:E:{}", T0 + EXP + 1, other[0].fence)
    );
    // The real holder refreshes, transfers, and the new owner releases.
    let r = p.refresh(&new, T0 + EXP + 5).expect("refresh");
    assert_eq!(
        ns.hash(&key)["ctx://a/x"],
        format!("o2:{}:E:{}", T0 + EXP + 5, new[0].fence)
    );
    let moved = p.transfer(&r, "o3", T0 + EXP + 6).expect("transfer");
    assert_eq!(
        ns.hash(&key)["ctx://a/x"],
        format!("o3:{}:E:{}", T0 + EXP + 6, new[0].fence)
    );
    assert!(lost(p.refresh(&r, T0 + EXP + 7)));
    p.release(&moved).expect("release");
    p.release(&other).expect("release");
    assert!(ns.hash(&key).is_empty());
}

/// One owner holding both modes on a path (two grants) keeps both tokens in the field, and
/// each is released on its own.
#[test]
fn one_owner_two_modes_share_a_field() {
    let ns = Namespace::new();
    let p = ns.provider();
    let key = ns.account_key("a");
    let tree = grant(&p, "o1", &[t("ctx://a/d")], T0);
    let exact = grant(&p, "o1", &[e("ctx://a/d")], T0 + 1);
    assert_eq!(
        ns.hash(&key)["ctx://a/d"],
        format!(
            "o1:{T0}:T:{},o1:{}:E:{}",
            tree[0].fence,
            T0 + 1,
            exact[0].fence
        )
    );
    assert!(attempt(&p, "o2", &[e("ctx://a/d/x")], T0 + 2).is_some());
    p.release(&tree).expect("release");
    assert!(attempt(&p, "o2", &[e("ctx://a/d/x")], T0 + 2).is_none());
    assert!(attempt(&p, "o2", &[e("ctx://a/d")], T0 + 2).is_some());
    p.release(&exact).expect("release");
    assert!(ns.hash(&key).is_empty());
}

/// A batch across scopes (two accounts, or an account and the root) is refused as invalid
/// and writes nothing.
#[test]
fn a_batch_across_scopes_is_refused() {
    let ns = Namespace::new();
    let p = ns.provider();
    for batch in [
        vec![e("ctx://a/x"), e("ctx://b/x")],
        vec![LockRequest::tree(CtxUri::root()), e("ctx://a/x")],
    ] {
        match p.try_acquire("o1", &batch, T0, EXP) {
            Err(Attempt::Failed(err @ LockError::Invalid(_))) => assert!(!err.is_retryable()),
            other => panic!("{batch:?}: expected Invalid, got {other:?}"),
        }
    }
    assert!(matches!(
        p.try_acquire("o1", &[], T0, EXP),
        Err(Attempt::Failed(LockError::Invalid(_)))
    ));
    assert!(ns.keys().is_empty(), "{:?}", ns.keys());
}

/// Scripts touch only their scope's hash: with an account's hash replaced by a string (any
/// hash command on it fails WRONGTYPE), the root and other accounts still lock, and that
/// account's own locks fail as a provider error.
#[test]
fn a_lock_reads_only_its_own_scope() {
    let ns = Namespace::new();
    let p = ns.provider();
    let _: () = redis::cmd("SET")
        .arg(ns.account_key("trap"))
        .arg("not a hash")
        .query(&mut raw())
        .expect("SET");
    let root = grant(&p, "o1", &[LockRequest::tree(CtxUri::root())], T0);
    let other = grant(&p, "o1", &[t("ctx://b")], T0);
    match p.try_acquire("o1", &[t("ctx://trap/x")], T0, EXP) {
        Err(Attempt::Failed(
            err @ LockError::Provider {
                provider: "redis", ..
            },
        )) => {
            assert!(err.is_retryable());
        }
        other => panic!("expected the trap to fire, got {other:?}"),
    }
    p.release(&root).expect("release");
    p.release(&other).expect("release");
    // The failed call dropped the connection; the next call reconnects.
    grant(&p, "o1", &[t("ctx://b")], T0);
}

/// Redis unreachable is a retryable provider error; a bad URL or service name is invalid.
#[test]
fn unreachable_redis_and_bad_settings() {
    match RedisProvider::connect("redis://127.0.0.1:1", "svc") {
        Err(
            err @ LockError::Provider {
                provider: "redis", ..
            },
        ) => assert!(err.is_retryable()),
        other => panic!("expected a provider error, got {other:?}"),
    }
    let good = redis_url();
    for (url, service) in [("not a url", "svc"), (&good, ""), (&good, "a{b}")] {
        assert!(
            matches!(
                RedisProvider::connect(url, service),
                Err(LockError::Invalid(_))
            ),
            "{url} {service}"
        );
    }
    let ns = Namespace::new();
    assert!(matches!(
        ns.provider().try_acquire("o:1", &[e("ctx://a/x")], T0, EXP),
        Err(Attempt::Failed(LockError::Invalid(_)))
    ));
}

/// A connection killed by the server (failover, restart, idle kill) costs at most one failed
/// call, retryable; the provider reconnects.
#[test]
fn a_killed_connection_is_replaced() {
    let ns = Namespace::new();
    let p = ns.provider();
    grant(&p, "o1", &[e("ctx://a/x")], T0);
    let mut con = raw();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut con)
        .expect("CLIENT LIST");
    let name = client_name(&ns.service);
    let id = list
        .lines()
        .find(|l| l.split(' ').any(|kv| kv == format!("name={name}")))
        .and_then(|l| l.split(' ').find_map(|kv| kv.strip_prefix("id=")))
        .unwrap_or_else(|| panic!("no connection named {name} in {list}"))
        .to_owned();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&id)
        .query(&mut con)
        .expect("CLIENT KILL");
    let first = p.try_acquire("o1", &[e("ctx://a/y")], T0, EXP);
    match first {
        Ok(_) => {}
        Err(Attempt::Failed(err @ LockError::Provider { .. })) => {
            assert!(err.is_retryable());
            grant(&p, "o1", &[e("ctx://a/y")], T0);
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
    grant(&p, "o1", &[e("ctx://a/z")], T0);
}

/// "Several hosts": two providers (separate connections, as two hosts would have), two
/// threads each, each thread with its own manager, 50 critical sections per thread on one
/// path: nobody ever finds another inside, and fences only grow.
#[test]
fn several_hosts_exclude_each_other() {
    let ns = Namespace::new();
    let hosts: Vec<Arc<dyn LockProvider>> = vec![Arc::new(ns.provider()), Arc::new(ns.provider())];
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    crate::suite::write_state(&state, false, 0);
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let provider = Arc::clone(&hosts[i % 2]);
            let state = state.clone();
            std::thread::spawn(move || crate::suite::critical_sections(provider, &state, 50))
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    assert!(!crate::suite::read_state(&state).0);
    assert!(
        ns.hash(&ns.account_key("mx")).is_empty(),
        "every lease released"
    );
}

// ---- differential property test against the memory provider ----

use crate::suite::PATHS;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        owner: usize,
        reqs: Vec<(usize, bool)>,
    },
    Release {
        pick: usize,
    },
    Refresh {
        pick: usize,
    },
    Transfer {
        pick: usize,
        to: usize,
    },
    Advance {
        stale: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop::collection::vec((0..PATHS.len(), any::<bool>()), 1..=3))
            .prop_map(|(owner, reqs)| Op::Acquire { owner, reqs }),
        2 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Refresh { pick }),
        1 => (any::<usize>(), 0..3usize).prop_map(|(pick, to)| Op::Transfer { pick, to }),
        1 => any::<bool>().prop_map(|stale| Op::Advance { stale }),
    ]
}

/// What an operation did, comparable across providers.
#[derive(Debug, PartialEq)]
enum Outcome {
    Granted,
    Refused,
    Done,
    Lost,
}

fn outcome<T>(r: ce_lock::Result<T>) -> Result<Outcome, TestCaseError> {
    match r {
        Ok(_) => Ok(Outcome::Done),
        Err(LockError::Lost { .. }) => Ok(Outcome::Lost),
        Err(e) => Err(TestCaseError::fail(format!("provider failed: {e}"))),
    }
}

/// Runs `ops` on a fresh redis namespace and a memory provider side by side: every step must
/// have the same outcome, and a refusal must name a live conflicting lock of another owner.
fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let ns = Namespace::new();
    let redis = ns.provider();
    let memory = MemoryProvider::new();
    let providers: [&dyn LockProvider; 2] = [&redis, &memory];
    // Grants per provider, same index for the same grant.
    let mut grants: [Vec<Vec<Token>>; 2] = [Vec::new(), Vec::new()];
    let mut now = T0;
    for (step, op) in ops.iter().enumerate() {
        now += 1_000;
        if let Op::Advance { stale } = op {
            if *stale {
                now += EXP;
            }
            continue;
        }
        let mut seen = Vec::new();
        for (k, p) in providers.iter().enumerate() {
            let got = match op {
                Op::Advance { .. } => continue,
                Op::Acquire { owner, reqs } => {
                    let scope = |i: usize| PATHS[i].split('/').nth(2);
                    let wanted: Vec<LockRequest> = reqs
                        .iter()
                        .filter(|r| scope(r.0) == scope(reqs[0].0))
                        .map(|&(i, tr)| {
                            let u = uri(PATHS[i]);
                            if tr {
                                LockRequest::tree(u)
                            } else {
                                LockRequest::exact(u)
                            }
                        })
                        .collect();
                    match p.try_acquire(&format!("o{owner}"), &wanted, now, EXP) {
                        Ok(tokens) => {
                            grants[k].push(tokens);
                            Outcome::Granted
                        }
                        Err(Attempt::Conflict { held, owner: o }) => {
                            prop_assert_ne!(&o, &format!("o{owner}"), "step {}: own lock", step);
                            prop_assert!(
                                wanted.iter().any(|w| conflicts(&held, w)),
                                "step {}: {:?} does not conflict with {:?}",
                                step,
                                held,
                                wanted
                            );
                            Outcome::Refused
                        }
                        Err(Attempt::Failed(e)) => {
                            return Err(TestCaseError::fail(format!("step {step}: {e}")));
                        }
                    }
                }
                Op::Release { pick } | Op::Refresh { pick } | Op::Transfer { pick, .. } => {
                    if grants[k].is_empty() {
                        continue;
                    }
                    let g = pick % grants[k].len();
                    let tokens = grants[k][g].clone();
                    // A stale token may or may not have been cleaned yet (redis removes every
                    // stale token an acquire meets, memory only conflicting ones): renewing it
                    // is provider-defined, so the comparison stays with live leases.
                    let stale = tokens.iter().any(|t| now - t.time_ns > EXP);
                    if stale && !matches!(op, Op::Release { .. }) {
                        continue;
                    }
                    match op {
                        Op::Release { .. } => outcome(p.release(&tokens))?,
                        Op::Refresh { .. } => match p.refresh(&tokens, now) {
                            Ok(t) => {
                                grants[k][g] = t;
                                Outcome::Done
                            }
                            r => outcome(r)?,
                        },
                        Op::Transfer { to, .. } => {
                            match p.transfer(&tokens, &format!("o{to}"), now) {
                                Ok(t) => {
                                    grants[k][g] = t;
                                    Outcome::Done
                                }
                                r => outcome(r)?,
                            }
                        }
                        _ => unreachable!("matched above"),
                    }
                }
            };
            seen.push(got);
        }
        if let [r, m] = seen.as_slice() {
            prop_assert_eq!(r, m, "step {}: redis vs memory on {:?}", step, op);
        }
    }
    Ok(())
}

#[test]
fn agrees_with_the_memory_provider() {
    let seed = ce_testkit::seed("agrees_with_the_memory_provider");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(32), 1024);
    match runner.run(&prop::collection::vec(op(), 1..=40), |ops| run_case(&ops)) {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!(
            "redis vs memory failed (replay with CE_SEED={seed}): {why}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("redis vs memory aborted (CE_SEED={seed}): {e}"),
    }
}
