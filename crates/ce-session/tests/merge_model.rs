//! The merge rule against a model (docs/sessions.md, "Merge"): random streams of commits,
//! each a batch of candidates drawn from a small universe of facts with planted duplicates
//! (the same fact again, under its key or another, reworded or not) and contradictions (a
//! key's fact replaced by another value). After every commit, the invariants hold over the
//! owner's memories: MM1 one current memory per slot, MM2 no two current memories saying the
//! same, MM3 every superseded memory linked from its successor; nothing is lost (every
//! candidate is held by a memory, current or kept as history); only `add` and `supersede`
//! create memories; and merging the same commit again changes nothing.
//!
//! "Says the same" is term overlap and, in most cases, an injected embedding similarity: an
//! arbitrary symmetric function of the two facts drawn per case (any pair may be close), so
//! the invariants are held for whatever the embedder answers, not for one model's numbers.
//!
//! `CE_PROPTEST_CASES` scales the number of cases; a failure prints its seed.

use std::collections::BTreeMap;

use ce_core::CtxUri;
use ce_session::merge::{
    DEFAULT_THRESHOLD, Sameness, Semantic, SemanticSimilarity, apply_plan, check_invariants,
};
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

/// An injected embedding similarity: 1 for the same text, else a value in 0.5..1 fixed per
/// pair of texts by `seed` (symmetric, deterministic).
#[derive(Debug, Clone, Copy)]
struct Injected {
    seed: u64,
}

impl SemanticSimilarity for Injected {
    fn cosine(&self, a: &str, b: &str) -> Option<f64> {
        if a == b {
            return Some(1.0);
        }
        let (x, y) = if a < b { (a, b) } else { (b, a) };
        let h = ce_core::sha256_hex(format!("{}|{x}|{y}", self.seed).as_bytes());
        let h = u64::from_str_radix(&h[..8], 16).expect("hex");
        Some(0.5 + (h % 500) as f64 / 1000.0)
    }
}

/// The signals of one case: term overlap, and the injected similarity at a threshold.
#[derive(Debug, Clone, Copy)]
struct Signals {
    semantic: Option<(Injected, f64)>,
}

fn signals() -> impl Strategy<Value = Signals> {
    prop::option::weighted(0.8, (any::<u64>(), 0.6..0.95f64)).prop_map(|s| Signals {
        semantic: s.map(|(seed, threshold)| (Injected { seed }, threshold)),
    })
}

impl Signals {
    fn sameness(&self) -> Sameness<'_> {
        Sameness {
            terms: DEFAULT_THRESHOLD,
            semantic: self.semantic.as_ref().map(|(s, threshold)| Semantic {
                similarity: s,
                threshold: *threshold,
            }),
        }
    }
}

fn run(commits: &[Vec<Stmt>], signals: Signals) -> Result<(), TestCaseError> {
    let sameness = signals.sameness();
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
            sameness,
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
        if let Err(e) = check_invariants(&store, &sameness, &links) {
            return Err(TestCaseError::fail(format!("after commit {}: {e}", n + 1)));
        }
        // Nothing is lost: every candidate is recorded in a memory afterwards (its evidence
        // merged there) — a current one, or one kept as history after a later candidate
        // superseded it. With term overlap alone that memory also says what the candidate
        // says, or has its slot; an arbitrary embedding similarity can chain updates that
        // reword a memory away from an early candidate (A close to B, B to C, not A to C),
        // so then only the record is held to.
        for (i, c) in candidates.iter().enumerate() {
            let id = format!("{archive}#c{i}");
            let holder = store.values().find(|m| m.merged_from.contains(&id));
            prop_assert!(
                holder.is_some(),
                "candidate {:?} is held by no memory",
                c.fact
            );
            if signals.semantic.is_none() {
                let held = store.values().any(|m| {
                    sameness.same(&m.fact, &c.fact) || (m.category == c.category && m.key == c.key)
                });
                prop_assert!(held, "no memory says {:?}", c.fact);
            }
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
        commits in prop::collection::vec(prop::collection::vec(stmt(), 1..8), 1..6),
        signals in signals(),
    ) {
        run(&commits, signals)?;
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
    run(&commits, Signals { semantic: None }).expect("invariants");
}
