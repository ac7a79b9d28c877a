//! The merge rule against a model (docs/sessions.md, "Merge"): random streams of commits,
//! each a batch of candidates drawn from a small universe of facts with planted duplicates
//! (the same fact again, under its key or another, reworded or not) and contradictions (a
//! key's fact replaced by another value). After every commit, the invariants hold over the
//! owner's memories: MM1 one current memory per slot, MM2 no two current memories saying the
//! same, MM3 every superseded memory linked from its successor; nothing is lost (every
//! candidate is held by a memory, current or kept as history); only `add` and `supersede`
//! create memories; and merging the same commit again changes nothing.
//!
//! `CE_PROPTEST_CASES` scales the number of cases; a failure prints its seed.

use std::collections::BTreeMap;

use ce_core::CtxUri;
use ce_session::merge::{DEFAULT_THRESHOLD, apply_plan, check_invariants};
use ce_session::{Candidate, Change, MemoryState, MergeContext, MergeOp, plan_merge};
use proptest::prelude::*;

/// The universe: per slot, a few values that contradict each other; each value has a
/// canonical sentence and a rewording that says the same.
const SLOTS: &[(&str, &str, &[&str])] = &[
    (
        "preferences",
        "editor",
        &["Helix", "Zed", "Emacs", "Neovim"],
    ),
    ("preferences", "theme", &["dark", "light", "solarized"]),
    ("profile", "home_city", &["Lyon", "Oslo", "Kyoto"]),
    ("entities", "employer", &["Acme", "Globex", "Initech"]),
    ("events", "vacation", &["August", "December"]),
];

fn sentence(slot: usize, value: usize, reworded: bool) -> String {
    let (_, key, values) = SLOTS[slot];
    let v = values[value];
    match (key, reworded) {
        ("editor", false) => format!("The user writes code in the {v} editor"),
        ("editor", true) => format!("The user writes code in the {v} editor daily"),
        ("theme", false) => format!("The user prefers a {v} colour theme"),
        ("theme", true) => format!("The user prefers a {v} colour theme everywhere"),
        ("home_city", false) => format!("The user lives in the city of {v}"),
        ("home_city", true) => format!("The user lives in the city of {v} now"),
        ("employer", false) => format!("The user works for the company {v}"),
        ("employer", true) => format!("The user works for the company {v} full time"),
        (_, false) => format!("The user takes a vacation every {v}"),
        (_, true) => format!("The user takes a vacation every {v} month"),
    }
}

/// One planted statement.
#[derive(Debug, Clone)]
struct Stmt {
    slot: usize,
    value: usize,
    reworded: bool,
    /// Stated under another slot's key of the same category (a duplicate under a wrong key)
    /// when that exists: the merge must still find it.
    alias_key: bool,
    /// The model says whether it changed (it sees the existing memories), or says nothing.
    hint: bool,
}

fn stmt() -> impl Strategy<Value = Stmt> {
    (
        0..SLOTS.len(),
        0..4usize,
        any::<bool>(),
        prop::bool::weighted(0.15),
        any::<bool>(),
    )
        .prop_map(|(slot, v, reworded, alias_key, hint)| Stmt {
            slot,
            value: v % SLOTS[slot].2.len(),
            reworded,
            alias_key,
            hint,
        })
}

fn candidate(s: &Stmt, truth: &BTreeMap<usize, usize>, msg: &str) -> Candidate {
    let (category, key, _) = SLOTS[s.slot];
    let key = if s.alias_key {
        format!("{key}_alias")
    } else {
        key.to_owned()
    };
    let change = match (s.hint, truth.get(&s.slot)) {
        (true, Some(&v)) if !s.alias_key => Some(if v == s.value {
            Change::Same
        } else {
            Change::Changed
        }),
        _ => None,
    };
    Candidate {
        category: category.into(),
        key,
        fact: sentence(s.slot, s.value, s.reworded),
        context: String::new(),
        evidence: vec![msg.into()],
        confidence: 0.9,
        change,
    }
}

fn run(commits: &[Vec<Stmt>]) -> Result<(), TestCaseError> {
    let memories = CtxUri::parse("ctx://acc/users/u/memories").expect("uri");
    let mut store: BTreeMap<CtxUri, MemoryState> = BTreeMap::new();
    // Successor → the memory it supersedes (the `supersedes` edges written).
    let mut links: BTreeMap<CtxUri, CtxUri> = BTreeMap::new();
    for (n, batch) in commits.iter().enumerate() {
        let archive = CtxUri::parse(&format!(
            "ctx://acc/users/u/sessions/s/archives/{:06}",
            n + 1
        ))
        .expect("uri");
        let messages: BTreeMap<String, String> = (0..batch.len())
            .map(|i| (format!("q{i}"), format!("message {i}")))
            .collect();
        let ctx = MergeContext {
            memories: &memories,
            archive: &archive,
            now_ms: n as i64,
            threshold: DEFAULT_THRESHOLD,
            messages: &messages,
        };
        let truth: BTreeMap<usize, usize> = current_values(&store);
        let candidates: Vec<Candidate> = batch
            .iter()
            .enumerate()
            .map(|(i, s)| candidate(s, &truth, &format!("q{i}")))
            .collect();
        let before = store.len();
        let plan = plan_merge(&ctx, store.values().cloned().collect(), &candidates);
        prop_assert_eq!(plan.entries.len(), candidates.len());
        let adds = plan
            .entries
            .iter()
            .filter(|e| matches!(e.op, MergeOp::Add | MergeOp::Supersede))
            .count();
        apply_plan(&mut store, &plan);
        prop_assert_eq!(
            store.len(),
            before + adds,
            "only add and supersede create memories"
        );
        for m in plan.writes.values() {
            if let Some(old) = &m.supersedes {
                links.insert(m.uri.clone(), old.clone());
            }
        }
        if let Err(e) = check_invariants(&store, DEFAULT_THRESHOLD, &links) {
            return Err(TestCaseError::fail(format!("after commit {}: {e}", n + 1)));
        }
        // Nothing is lost: every candidate is held by a memory afterwards — a current one,
        // or one kept as history after a later candidate superseded it.
        for c in &candidates {
            let held = store.values().any(|m| {
                ce_session::similarity(&m.fact, &c.fact) >= DEFAULT_THRESHOLD
                    || (m.category == c.category && m.key == c.key)
            });
            prop_assert!(held, "candidate {:?} is held by no memory", c.fact);
        }
        // A repeat of the same commit (a rerun with the same candidates) adds nothing.
        let again = plan_merge(&ctx, store.values().cloned().collect(), &candidates);
        prop_assert!(
            again.entries.iter().all(|e| e.op == MergeOp::Noop),
            "a repeated commit changed something: {:?}",
            again.entries.iter().map(|e| e.op).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// The value each slot's current memory states (by its canonical key).
fn current_values(store: &BTreeMap<CtxUri, MemoryState>) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for m in store.values().filter(|m| m.is_current()) {
        for (slot, (category, key, values)) in SLOTS.iter().enumerate() {
            if m.category != *category || m.key != *key {
                continue;
            }
            for (v, value) in values.iter().enumerate() {
                if m.fact.contains(&format!(" {value} ")) || m.fact.ends_with(value) {
                    out.insert(slot, v);
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: ce_core::test_cases(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn merged_memories_keep_the_invariants(
        commits in prop::collection::vec(prop::collection::vec(stmt(), 1..8), 1..6)
    ) {
        run(&commits)?;
    }
}

#[test]
fn planted_duplicates_and_contradictions_converge_to_one_memory_per_fact() {
    let s = |slot, value, reworded, hint| Stmt {
        slot,
        value,
        reworded,
        alias_key: false,
        hint,
    };
    // Helix twice (one reworded) in one commit, then again, then Zed (a contradiction),
    // then Zed restated under the wrong key.
    let commits = vec![
        vec![
            s(0, 0, false, false),
            s(0, 0, true, false),
            s(2, 0, false, false),
        ],
        vec![s(0, 0, false, true)],
        vec![s(0, 1, false, true)],
        vec![Stmt {
            alias_key: true,
            ..s(0, 1, true, false)
        }],
    ];
    run(&commits).expect("invariants");
}
