//! The embedded keyword index's block postings against the exact in-memory index: document
//! frequencies under random writes, removals, moves and subtree deletes (a property test);
//! bulk removals of thousands of records in one batch and one subtree delete, leaving exactly
//! the oracle's state and hits; and the migration of a layout-1 file (one row per posting).

use std::collections::BTreeSet;

use ce_core::CtxUri;
use ce_index::keyword::embedded::{DB_FILE, EmbeddedKeywordIndex};
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::keyword::tokenize::tokenize;
use ce_index::keyword::{KeywordIndex, NodeWrite, SearchFilter, SyncOutcome};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::keyword::{apply_all, doc, open, search, sync};
use crate::common::{seed, uri};

/// Words of the generated texts: a few in most records (their postings span several blocks
/// of 128), the rest rarer.
const WORDS: [&str; 12] = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "数据库",
];

/// The distinct terms of [`WORDS`] as the tokenizer makes them.
fn vocabulary() -> Vec<String> {
    let all: BTreeSet<String> = WORDS.iter().flat_map(|w| tokenize(w)).collect();
    all.into_iter().collect()
}

/// Node `n` of group `g`: `ctx://d/g{g}/n{n}` (groups are the subtrees deleted at once).
fn node(g: usize, n: usize) -> String {
    format!("ctx://d/g{g}/n{n}")
}

/// A text of `len` words drawn with a skew towards the first ones.
fn skewed_text(rng: &mut impl Rng, len: usize) -> String {
    (0..len)
        .map(|_| {
            let r: f64 = rng.random();
            WORDS[((r * r) * WORDS.len() as f64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Document frequencies under random writes.

const GROUPS: usize = 4;
const PER_GROUP: usize = 40;

#[derive(Debug, Clone)]
enum DfOp {
    /// Syncs of several nodes in one batch: (group, node, version, texts per level).
    Batch(Vec<(usize, usize, u64, Vec<String>)>),
    /// Removals of several nodes in one batch (at their version + 1).
    Remove(Vec<(usize, usize)>),
    /// A move: node `from` removed, node `to` given its records (as the worker applies a
    /// move to a record index: a removal and a sync, in one batch).
    Move {
        from: (usize, usize),
        to: (usize, usize),
    },
    /// `delete_by_uri` of a group's subtree.
    DeleteGroup(usize),
}

fn df_op() -> impl Strategy<Value = DfOp> {
    let at = (0..GROUPS, 0..PER_GROUP);
    let texts = prop::collection::vec(
        prop::collection::vec(0..WORDS.len(), 0..12).prop_map(|ws| {
            ws.into_iter()
                .map(|w| WORDS[w])
                .collect::<Vec<_>>()
                .join(" ")
        }),
        0..=3,
    );
    prop_oneof![
        8 => prop::collection::vec((0..GROUPS, 0..PER_GROUP, 1u64..6, texts), 1..40)
            .prop_map(DfOp::Batch),
        3 => prop::collection::vec(at.clone(), 1..60).prop_map(DfOp::Remove),
        2 => (at.clone(), at).prop_map(|(from, to)| DfOp::Move { from, to }),
        1 => (0..GROUPS).prop_map(DfOp::DeleteGroup),
    ]
}

/// The writes of `op` given the versions seen so far (bumped as the writes are made).
fn df_writes(
    op: &DfOp,
    versions: &mut [[u64; PER_GROUP]; GROUPS],
    oracle: &MemoryKeywordIndex,
) -> Vec<NodeWrite> {
    let mut out = Vec::new();
    match op {
        DfOp::Batch(ws) => {
            for (g, n, bump, texts) in ws {
                versions[*g][*n] += bump;
                let u = node(*g, *n);
                let records = texts
                    .iter()
                    .enumerate()
                    .map(|(l, t)| doc(&u, l as u8, t, &[("tag", json!(g))]))
                    .collect();
                out.push(sync(&u, versions[*g][*n], records));
            }
        }
        DfOp::Remove(nodes) => {
            for (g, n) in nodes {
                versions[*g][*n] += 1;
                out.push(NodeWrite::Remove {
                    uri: uri(&node(*g, *n)),
                    version: versions[*g][*n],
                });
            }
        }
        DfOp::Move { from, to } => {
            let from_uri = uri(&node(from.0, from.1));
            let moved = oracle.list_under(&from_uri).expect("list");
            versions[from.0][from.1] += 1;
            out.push(NodeWrite::Remove {
                uri: from_uri.clone(),
                version: versions[from.0][from.1],
            });
            versions[to.0][to.1] += 1;
            let to_s = node(to.0, to.1);
            let records = moved
                .iter()
                .filter(|s| s.record.uri == from_uri)
                .map(|s| {
                    doc(
                        &to_s,
                        s.record.level.as_u8(),
                        &s.record.text,
                        &[("tag", json!(to.0))],
                    )
                })
                .collect();
            out.push(sync(&to_s, versions[to.0][to.1], records));
        }
        DfOp::DeleteGroup(_) => {}
    }
    out
}

fn run_df_case(ops: &[DfOp]) -> Result<(), TestCaseError> {
    let oracle = MemoryKeywordIndex::new();
    let dir = tempfile::tempdir().map_err(fail)?;
    let embedded = EmbeddedKeywordIndex::open(dir.path()).map_err(fail)?;
    let vocabulary = vocabulary();
    let mut versions = [[0u64; PER_GROUP]; GROUPS];
    for (i, op) in ops.iter().enumerate() {
        if let DfOp::DeleteGroup(g) = op {
            let root = uri(&format!("ctx://d/g{g}"));
            let want = oracle.delete_by_uri(&root, true).map_err(fail)?;
            prop_assert_eq!(
                embedded.delete_by_uri(&root, true).map_err(fail)?,
                want,
                "step {}",
                i
            );
        } else {
            let writes = df_writes(op, &mut versions, &oracle);
            let want: Vec<String> = oracle
                .write_nodes(&writes)
                .map_err(fail)?
                .into_iter()
                .map(|o| format!("{o:?}"))
                .collect();
            let got: Vec<String> = embedded
                .write_nodes(&writes)
                .map_err(fail)?
                .into_iter()
                .map(|o| format!("{o:?}"))
                .collect();
            prop_assert_eq!(got, want, "step {}: outcomes of {:?}", i, op);
        }
        for t in &vocabulary {
            prop_assert_eq!(
                embedded.document_frequency(t).map_err(fail)?,
                oracle.document_frequency(t),
                "step {}: df of {:?} after {:?}",
                i,
                t,
                op
            );
        }
        prop_assert_eq!(
            embedded.count().map_err(fail)?,
            oracle.count().map_err(fail)?
        );
    }
    embedded.check_consistency().map_err(fail)?;
    let root = CtxUri::root();
    prop_assert_eq!(
        embedded.list_under(&root).map_err(fail)?,
        oracle.list_under(&root).map_err(fail)?
    );
    Ok(())
}

#[test]
fn document_frequencies_follow_the_oracle_under_random_writes() {
    let seed = seed("keyword_bulk::document_frequencies_follow_the_oracle_under_random_writes");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(24), 512);
    match runner.run(&prop::collection::vec(df_op(), 1..30), |ops| {
        run_df_case(&ops)
    }) {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!(
            "df model test failed (replay with CE_SEED={seed}): {why}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("df model test aborted (CE_SEED={seed}): {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Bulk removal.

/// Writes `groups` × `per_group` nodes of three levels to both indexes (in batches of 200).
fn fill(rng: &mut impl Rng, groups: usize, per_group: usize, idx: &[&dyn KeywordIndex]) {
    let mut writes = Vec::new();
    for g in 0..groups {
        for n in 0..per_group {
            let u = node(g, n);
            let records = (0..3u8)
                .map(|l| {
                    let len = [4, 12, 30][l as usize];
                    let len = rng.random_range(1..=len);
                    let words = skewed_text(rng, len);
                    doc(&u, l, &words, &[("tag", json!(n % 3))])
                })
                .collect();
            writes.push(sync(&u, 1, records));
        }
    }
    for chunk in writes.chunks(200) {
        for i in idx {
            apply_all(*i, chunk.to_vec());
        }
    }
}

/// Asserts that `e` holds exactly `oracle`'s records, document frequencies and hits.
fn assert_same(oracle: &MemoryKeywordIndex, e: &EmbeddedKeywordIndex, when: &str) {
    e.check_consistency().expect("consistent");
    let root = CtxUri::root();
    assert_eq!(
        e.list_under(&root).expect("list"),
        oracle.list_under(&root).expect("list"),
        "{when}: records"
    );
    for t in vocabulary() {
        assert_eq!(
            e.document_frequency(&t).expect("df"),
            oracle.document_frequency(&t),
            "{when}: df of {t:?}"
        );
    }
    let tagged = SearchFilter {
        meta: [("tag".to_owned(), json!(1))].into_iter().collect(),
        ..SearchFilter::default()
    };
    let subtree = SearchFilter {
        subtree: Some(uri("ctx://d/g3")),
        ..SearchFilter::default()
    };
    for q in [
        "alpha",
        "alpha beta gamma",
        "kappa lambda",
        "数据库 iota",
        "theta alpha eta",
    ] {
        for f in [SearchFilter::default(), tagged.clone(), subtree.clone()] {
            for k in [1, 10, 100] {
                assert_eq!(
                    search(e, q, &f, k),
                    search(oracle, q, &f, k),
                    "{when}: {q:?} k={k} filter={f:?}"
                );
            }
        }
    }
}

#[test]
fn bulk_removals_leave_exactly_the_oracles_state() {
    let seed = seed("keyword_bulk::bulk_removals_leave_exactly_the_oracles_state");
    let mut rng = StdRng::seed_from_u64(seed);
    let oracle = MemoryKeywordIndex::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    fill(&mut rng, 5, 400, &[&oracle, &e]);
    assert_same(&oracle, &e, "filled");

    // One batch removing most of groups 0 and 1 (1,200 records), re-syncing some nodes of
    // group 2 with new texts, and a bad write in the middle that fails alone.
    let mut writes = Vec::new();
    for g in 0..2 {
        for n in (0..400).filter(|n| n % 5 != 0) {
            writes.push(NodeWrite::Remove {
                uri: uri(&node(g, n)),
                version: 2,
            });
        }
    }
    for n in 0..50 {
        let u = node(2, n);
        let text = skewed_text(&mut rng, 9);
        writes.push(sync(&u, 2, vec![doc(&u, 0, &text, &[("tag", json!(1))])]));
        if n == 25 {
            writes.push(sync(
                &node(2, 399),
                2,
                vec![
                    doc(&node(2, 399), 0, "alpha", &[]),
                    doc(&node(3, 0), 0, "beta", &[]),
                ],
            ));
        }
    }
    let want: Vec<String> = oracle
        .write_nodes(&writes)
        .expect("batch")
        .into_iter()
        .map(|o| format!("{o:?}"))
        .collect();
    let got: Vec<String> = e
        .write_nodes(&writes)
        .expect("batch")
        .into_iter()
        .map(|o| format!("{o:?}"))
        .collect();
    assert_eq!(got, want, "outcomes");
    assert_eq!(
        got.iter().filter(|o| o.starts_with("Err")).count(),
        1,
        "the bad write failed alone"
    );
    assert_same(&oracle, &e, "after the batch of removals");

    // A subtree delete of a whole group, then one of what is left of group 0.
    for root in ["ctx://d/g4", "ctx://d/g0"] {
        let root = uri(root);
        let n = oracle.delete_by_uri(&root, true).expect("delete");
        assert!(n > 0, "{root} held records");
        assert_eq!(e.delete_by_uri(&root, true).expect("delete"), n, "{root}");
        assert_same(&oracle, &e, &format!("after deleting {root}"));
    }
    // The index keeps working afterwards: new records join the rewritten blocks.
    let mut more = Vec::new();
    for n in 0..300 {
        let u = node(4, n);
        more.push(sync(
            &u,
            1,
            vec![doc(&u, 2, &skewed_text(&mut rng, 20), &[])],
        ));
    }
    apply_all(&oracle, more.clone());
    apply_all(&e, more);
    assert_same(&oracle, &e, "after refilling");
}

// ---------------------------------------------------------------------------------------------
// Migration of a layout-1 file.

/// Rewrites the keyword index in `dir` into layout 2: records keyed by a unique `id`, a plain
/// index on `(uri, level)` (what files written before 2026-12-06 hold).
fn downgrade_to_layout_2(dir: &std::path::Path) {
    crate::common::key_records_by_id(
        &dir.join(DB_FILE),
        "CREATE TABLE records (
             doc INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, uri TEXT NOT NULL,
             level INTEGER NOT NULL, node_version INTEGER NOT NULL, len INTEGER NOT NULL,
             terms TEXT NOT NULL, head TEXT NOT NULL, text TEXT NOT NULL
         )",
        "doc, id, uri, level, node_version, len, terms, head, text",
        2,
    );
}

/// The layout version of the keyword index in `dir`, and whether its records' `id` still
/// has a unique index.
fn layout(dir: &std::path::Path) -> (String, bool) {
    let c = rusqlite::Connection::open(dir.join(DB_FILE)).expect("open");
    c.query_row(
        "SELECT (SELECT value FROM meta WHERE key = 'schema_version'),
                (SELECT COUNT(*) FROM pragma_index_list('records')
                 WHERE name LIKE 'sqlite_autoindex%') > 0",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .expect("layout")
}

/// Rewrites the keyword index in `dir` into layout 1: the records of layout 2, one
/// `postings (term, doc, tf, len)` row per posting (from the records' stored terms), no blocks
/// and no stored frequencies.
fn downgrade_to_layout_1(dir: &std::path::Path) {
    downgrade_to_layout_2(dir);
    let c = rusqlite::Connection::open(dir.join(DB_FILE)).expect("open");
    c.execute_batch(
        "CREATE TABLE postings (
             term TEXT NOT NULL, doc INTEGER NOT NULL, tf INTEGER NOT NULL,
             len INTEGER NOT NULL, PRIMARY KEY (term, doc)
         ) WITHOUT ROWID;",
    )
    .expect("create postings");
    let rows: Vec<(i64, i64, String)> = c
        .prepare("SELECT doc, len, terms FROM records")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .expect("records");
    for (doc, len, terms) in rows {
        for line in terms.lines() {
            let (term, tf) = line.split_once('\t').expect("term line");
            c.execute(
                "INSERT INTO postings (term, doc, tf, len) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![term, doc, tf.parse::<i64>().expect("tf"), len],
            )
            .expect("insert posting");
        }
    }
    c.execute_batch(
        "DROP TABLE blocks; DROP TABLE terms;
         UPDATE meta SET value = '1' WHERE key = 'schema_version';",
    )
    .expect("downgrade");
}

#[test]
fn a_layout_1_file_is_migrated_on_open() {
    let seed = seed("keyword_bulk::a_layout_1_file_is_migrated_on_open");
    let mut rng = StdRng::seed_from_u64(seed);
    let oracle = MemoryKeywordIndex::new();
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        fill(&mut rng, 4, 100, &[&oracle, &e]);
        apply_all(
            &e,
            vec![NodeWrite::Remove {
                uri: uri(&node(0, 0)),
                version: 2,
            }],
        );
    }
    apply_all(
        &oracle,
        vec![NodeWrite::Remove {
            uri: uri(&node(0, 0)),
            version: 2,
        }],
    );
    downgrade_to_layout_1(dir.path());
    let e = open(dir.path());
    assert_same(&oracle, &e, "migrated");
    let c = rusqlite::Connection::open(dir.path().join(DB_FILE)).expect("open");
    let (postings, version): (i64, String) = c
        .query_row(
            "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE name = 'postings'),
                    (SELECT value FROM meta WHERE key = 'schema_version')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("layout");
    assert_eq!(
        (postings, version.as_str()),
        (0, "3"),
        "the old table is gone, and the records were rekeyed too"
    );
    // Versions survived: the removal at 2 still makes a sync at 2 stale.
    let out = e
        .write_nodes(&[sync(
            &node(0, 0),
            2,
            vec![doc(&node(0, 0), 0, "alpha", &[])],
        )])
        .expect("write");
    assert!(matches!(out[0], Ok(SyncOutcome::Stale)), "{out:?}");
}

#[test]
fn a_layout_2_file_is_rekeyed_by_node_on_open() {
    let seed = seed("keyword_bulk::a_layout_2_file_is_rekeyed_by_node_on_open");
    let mut rng = StdRng::seed_from_u64(seed);
    let oracle = MemoryKeywordIndex::new();
    let dir = tempfile::tempdir().expect("tempdir");
    drop(open(dir.path()));
    assert_eq!(layout(dir.path()), ("3".into(), false), "a new file");
    {
        let e = open(dir.path());
        fill(&mut rng, 4, 100, &[&oracle, &e]);
    }
    downgrade_to_layout_2(dir.path());
    assert_eq!(layout(dir.path()), ("2".into(), true), "downgraded");
    let e = open(dir.path());
    assert_eq!(layout(dir.path()), ("3".into(), false), "rekeyed");
    assert_same(&oracle, &e, "rekeyed");
    e.check_consistency().expect("consistent");
    // Writes land where reads look: overwrites, removals and new records.
    fill(&mut rng, 4, 100, &[&oracle, &e]);
    assert_same(&oracle, &e, "after more writes");
    e.check_consistency().expect("consistent after more writes");
}
