//! The `KeywordIndex` contract: a model test of the embedded index against the exact
//! in-memory one, relevance on a small English and Chinese corpus with every filter kind,
//! persistence across reopen, and bad input.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ce_core::{Classify, CtxUri, ErrorCode, IndexRecord, Level};
use ce_index::keyword::embedded::{EmbeddedKeywordIndex, EmbeddedKeywordOptions};
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::keyword::tokenize::tokenize;
use ce_index::keyword::{
    KeywordHit, KeywordIndex, NodeRecord, NodeWrite, SearchFilter, SyncOutcome,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use serde_json::{Value, json};

use crate::common::{record, seed, uri};

/// Scores of the two implementations may differ by this much (they are computed by the same
/// formula in the same order, so in practice they are equal).
const SCORE_EPS: f32 = 1e-4;

/// A record of `uri_s` at `level` with `text` and extra flat filters.
pub(crate) fn doc(uri_s: &str, level: u8, text: &str, extra: &[(&str, Value)]) -> IndexRecord {
    IndexRecord {
        text: text.to_owned(),
        ..record(uri_s, level, extra)
    }
}

/// A keyword write of `records` (no vectors: the keyword index has none).
pub(crate) fn sync(uri_s: &str, version: u64, records: Vec<IndexRecord>) -> NodeWrite {
    NodeWrite::Sync {
        uri: uri(uri_s),
        version,
        records: records
            .into_iter()
            .map(|record| NodeRecord {
                record,
                vector: None,
            })
            .collect(),
    }
}

/// Applies `writes`, expecting the batch itself to succeed.
fn write(idx: &dyn KeywordIndex, writes: Vec<NodeWrite>) -> Vec<ce_index::Result<SyncOutcome>> {
    idx.write_nodes(&writes).expect("write batch")
}

/// Applies `writes`, expecting every write to be applied.
pub(crate) fn apply_all(idx: &dyn KeywordIndex, writes: Vec<NodeWrite>) {
    for (i, o) in write(idx, writes).into_iter().enumerate() {
        assert_eq!(o.expect("write"), SyncOutcome::Applied, "write {i}");
    }
}

pub(crate) fn search(
    idx: &dyn KeywordIndex,
    q: &str,
    f: &SearchFilter,
    k: usize,
) -> Vec<KeywordHit> {
    idx.search(q, f, k).expect("search")
}

fn hit_uris(hits: &[KeywordHit]) -> Vec<String> {
    hits.iter()
        .map(|h| format!("{}#{}", h.record.uri, h.record.level))
        .collect()
}

/// Runs `f` against the in-memory index and a fresh embedded one, then checks the embedded
/// index's postings.
fn both(mut f: impl FnMut(&str, &dyn KeywordIndex)) {
    f("memory", &MemoryKeywordIndex::new());
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    f("embedded", &e);
    e.check_consistency().expect("postings agree with records");
}

pub(crate) fn open(dir: &Path) -> EmbeddedKeywordIndex {
    EmbeddedKeywordIndex::open(dir).expect("open keyword index")
}

/// New index files use 8 KiB pages for the keyword index and 16 KiB for the vector index: a
/// record row (~0.8 KB here, ~1.43 KB in `vectors.db`) leaves a fifth or more of a 4 KiB page
/// unused, and the vector index's rows 1 KiB of an 8 KiB one (docs/indexing.md "Footprint",
/// "Pages"). An existing file keeps the size it has.
#[test]
fn new_index_files_use_large_pages() {
    let page_size = |path: &Path| -> i64 {
        rusqlite::Connection::open(path)
            .expect("open")
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    drop(open(dir.path()));
    let keywords = dir.path().join("keywords.db");
    assert_eq!(page_size(&keywords), 8192);
    let vectors = tempfile::tempdir().expect("tempdir");
    drop(ce_index::vector::embedded::EmbeddedVectorIndex::open(vectors.path()).expect("open"));
    assert_eq!(page_size(&vectors.path().join("vectors.db")), 16384);

    // A file made with 4 KiB pages keeps them.
    let old = tempfile::tempdir().expect("tempdir");
    let path = old.path().join("keywords.db");
    rusqlite::Connection::open(&path)
        .expect("create")
        .execute_batch("PRAGMA page_size = 4096; CREATE TABLE t (x); DROP TABLE t;")
        .expect("4 KiB pages");
    let index = open(old.path());
    let write = sync(
        "ctx://acc/resources/a",
        1,
        vec![record("ctx://acc/resources/a", 0, &[])],
    );
    assert_eq!(
        index.write_nodes(&[write]).expect("write")[0]
            .as_ref()
            .expect("applied"),
        &SyncOutcome::Applied
    );
    drop(index);
    assert_eq!(page_size(&path), 4096);
}

// ---------------------------------------------------------------------------------------------
// Relevance and filters.

const BOOK: &str = "ctx://acme/resources/docs/rust-book";
const SQLITE: &str = "ctx://acme/resources/docs/sqlite";
const ML_ZH: &str = "ctx://acme/resources/docs/ml-zh";
const DB_ZH: &str = "ctx://acme/resources/docs/db-zh";
const COFFEE: &str = "ctx://acme/users/alice/memories/prefs/coffee";
const BOT: &str = "ctx://acme/agents/bot/memories/notes/migration";
const OTHER_SQLITE: &str = "ctx://other/resources/docs/sqlite";

fn corpus() -> Vec<NodeWrite> {
    let en = [("lang", json!("en"))];
    let zh = [("lang", json!("zh"))];
    vec![
        sync(
            BOOK,
            1,
            vec![doc(
                BOOK,
                0,
                "Running Rust programs: the cargo run command runs your binary.",
                &en,
            )],
        ),
        sync(
            SQLITE,
            1,
            vec![doc(
                SQLITE,
                0,
                "SQLite databases keep each index in a B-tree; databases are single files.",
                &en,
            )],
        ),
        sync(
            ML_ZH,
            1,
            vec![doc(ML_ZH, 0, "我们在北京大学学习机器学习和深度学习。", &zh)],
        ),
        sync(
            DB_ZH,
            1,
            vec![doc(
                DB_ZH,
                0,
                "数据库索引可以加快搜索速度，也会占用磁盘。",
                &zh,
            )],
        ),
        sync(
            COFFEE,
            1,
            vec![doc(
                COFFEE,
                0,
                "Alice prefers black coffee in the morning; 她每天早上喝咖啡。",
                &[("lang", json!("mixed"))],
            )],
        ),
        sync(
            BOT,
            1,
            vec![
                doc(BOT, 0, "Database migration notes.", &en),
                doc(
                    BOT,
                    1,
                    "The bot ran a database migration; running it twice is safe.",
                    &en,
                ),
            ],
        ),
        sync(
            OTHER_SQLITE,
            1,
            vec![doc(
                OTHER_SQLITE,
                0,
                "SQLite databases keep each index in a B-tree; databases are single files.",
                &en,
            )],
        ),
    ]
}

#[test]
fn queries_find_the_expected_record_first() {
    both(|name, idx| {
        apply_all(idx, corpus());
        let all = SearchFilter::default();
        let first = |q: &str| {
            hit_uris(&search(idx, q, &all, 3))
                .into_iter()
                .next()
                .unwrap_or_default()
        };
        assert_eq!(first("run"), format!("{BOOK}#0"), "{name}: stemmed, tf 3");
        assert_eq!(first("机器学习"), format!("{ML_ZH}#0"), "{name}");
        assert_eq!(first("北京 大学"), format!("{ML_ZH}#0"), "{name}");
        assert_eq!(first("搜索 数据库"), format!("{DB_ZH}#0"), "{name}");
        assert_eq!(
            first("咖啡"),
            format!("{COFFEE}#0"),
            "{name}: Chinese in mixed text"
        );
        assert_eq!(
            first("COFFEE"),
            format!("{COFFEE}#0"),
            "{name}: case-folded"
        );
        let hits = search(idx, "databases indexes", &all, 2);
        let mut twins = vec![record(SQLITE, 0, &[]).id, record(OTHER_SQLITE, 0, &[]).id];
        twins.sort();
        assert_eq!(
            hits.iter().map(|h| h.record.id.clone()).collect::<Vec<_>>(),
            twins,
            "{name}: equal texts tie and order by id"
        );
        assert_eq!(hits[0].score, hits[1].score, "{name}");
        let hits = search(idx, "database", &all, 10);
        assert!(
            hits.windows(2).all(|w| w[0].score >= w[1].score),
            "{name}: best first"
        );
        assert!(hits.iter().all(|h| h.score > 0.0), "{name}");
        for q in ["", "  ", "，。！？", "---"] {
            assert!(
                search(idx, q, &all, 5).is_empty(),
                "{name}: {q:?} has no terms"
            );
        }
        assert!(
            search(idx, "zebra", &all, 5).is_empty(),
            "{name}: unknown term"
        );
        assert!(
            search(idx, "database", &all, 0).is_empty(),
            "{name}: top_k 0"
        );
        assert_eq!(
            search(idx, "database", &all, usize::MAX).len(),
            4,
            "{name}: every record holding the term"
        );
    });
}

#[test]
fn every_filter_kind_restricts_hits() {
    let f = |g: &dyn Fn(&mut SearchFilter)| {
        let mut f = SearchFilter::default();
        g(&mut f);
        f
    };
    let cases: Vec<(&str, SearchFilter, &str, Vec<String>)> = vec![
        (
            "subtree",
            f(&|f| f.subtree = Some(uri("ctx://acme/agents"))),
            "run",
            vec![format!("{BOT}#1")],
        ),
        (
            "parent_uri",
            f(&|f| f.parent_uri = Some(uri("ctx://acme/resources/docs"))),
            "databases",
            vec![format!("{SQLITE}#0")],
        ),
        (
            "context_type",
            f(&|f| f.context_type = Some("memory".into())),
            "run coffee",
            vec![format!("{COFFEE}#0"), format!("{BOT}#1")],
        ),
        (
            "category",
            f(&|f| f.category = Some("prefs".into())),
            "coffee database",
            vec![format!("{COFFEE}#0")],
        ),
        (
            "level",
            f(&|f| f.level = Some(Level::L1)),
            "database",
            vec![format!("{BOT}#1")],
        ),
        (
            "owner_spaces",
            f(&|f| f.owner_spaces = Some(vec!["agent:bot".into(), "user:alice".into()])),
            "database coffee",
            // coffee (in 1 record) outweighs database (in 4); the short L0 beats the L1.
            vec![
                format!("{COFFEE}#0"),
                format!("{BOT}#0"),
                format!("{BOT}#1"),
            ],
        ),
        (
            "account_id",
            f(&|f| f.account_id = Some("other".into())),
            "database",
            vec![format!("{OTHER_SQLITE}#0")],
        ),
        (
            "meta",
            f(&|f| {
                f.meta = BTreeMap::from([("lang".to_owned(), json!("zh"))]);
            }),
            "数据库 database",
            vec![format!("{DB_ZH}#0")],
        ),
        (
            "all at once",
            f(&|f| {
                f.subtree = Some(uri("ctx://acme"));
                f.context_type = Some("resource".into());
                f.level = Some(Level::L0);
                f.meta = BTreeMap::from([("lang".to_owned(), json!("en"))]);
            }),
            "database",
            vec![format!("{SQLITE}#0")],
        ),
    ];
    both(|name, idx| {
        apply_all(idx, corpus());
        for (kind, filter, q, want) in &cases {
            let hits = search(idx, q, filter, 10);
            assert_eq!(&hit_uris(&hits), want, "{name}: {kind} filter, query {q:?}");
            assert!(hits.iter().all(|h| filter.matches(&h.record)), "{name}");
        }
    });
}

#[test]
fn a_filter_dropping_the_best_candidates_still_fills_top_k() {
    both(|name, idx| {
        let mut writes = Vec::new();
        for i in 0..300 {
            let u = format!("ctx://acme/resources/noise/n{i:03}");
            writes.push(sync(&u, 1, vec![doc(&u, 0, "apple apple apple", &[])]));
        }
        for i in 0..7 {
            let u = format!("ctx://acme/resources/rare/r{i}");
            let text = format!("an apple pie with cream, sugar and {i} other things");
            writes.push(sync(&u, 1, vec![doc(&u, 0, &text, &[])]));
        }
        apply_all(idx, writes);
        let rare = SearchFilter {
            subtree: Some(uri("ctx://acme/resources/rare")),
            ..SearchFilter::default()
        };
        let hits = search(idx, "apple", &rare, 5);
        assert_eq!(
            hits.len(),
            5,
            "{name}: exactly top_k when enough records match"
        );
        assert!(hits.iter().all(|h| rare.matches(&h.record)), "{name}");
        assert_eq!(
            search(idx, "apple", &rare, 10).len(),
            7,
            "{name}: all there are"
        );
        // The 300 equal texts tie: the first three by id.
        let hits = search(idx, "apples", &SearchFilter::default(), 3);
        let mut noise: Vec<String> = (0..300)
            .map(|i| record(&format!("ctx://acme/resources/noise/n{i:03}"), 0, &[]).id)
            .collect();
        noise.sort();
        let got: Vec<String> = hits.iter().map(|h| h.record.id.clone()).collect();
        assert_eq!(got, noise[..3], "{name}: ties by id ascending");
        let all = search(idx, "apple", &SearchFilter::default(), 1000);
        assert_eq!(all.len(), 307, "{name}");
        assert!(
            all[..300]
                .iter()
                .all(|h| h.record.uri.as_str().contains("noise")),
            "{name}: short records with tf 3 rank above the long ones"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Versioned writes.

/// A skewed corpus — one term in every record, one in a quarter, one rare term per ten —
/// makes the embedded search prune (the common terms' bounds fall below the `k`-th score):
/// its hits must still equal the exhaustive reference's, with and without filters.
#[test]
fn pruned_searches_agree_with_the_exhaustive_reference() {
    let writes: Vec<NodeWrite> = (0..400)
        .map(|i| {
            let mut text = format!("common filler{} ", i % 7);
            if i % 4 == 0 {
                text.push_str("medium medium ");
            }
            if i % 10 == 0 {
                text.push_str(&format!("rare{} ", i % 30));
            }
            let u = format!("ctx://acc/docs/d{i}");
            sync(&u, 1, vec![doc(&u, 2, &text, &[("tag", json!(i % 3))])])
        })
        .collect();
    let memory = MemoryKeywordIndex::new();
    apply_all(&memory, writes.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let embedded = open(dir.path());
    apply_all(&embedded, writes);
    let tagged = SearchFilter {
        meta: [("tag".to_owned(), json!(1))].into_iter().collect(),
        ..SearchFilter::default()
    };
    for q in [
        "common rare10",
        "common medium rare0",
        "medium common",
        "filler3 common rare20",
    ] {
        for f in [SearchFilter::default(), tagged.clone()] {
            for k in [1, 3, 10, 50] {
                let (want, got) = (search(&memory, q, &f, k), search(&embedded, q, &f, k));
                assert_eq!(got, want, "{q:?} k={k} filter={f:?}");
            }
        }
    }
}

fn levels_of(idx: &dyn KeywordIndex, u: &str) -> Vec<(u8, String)> {
    idx.list_under(&uri(u))
        .expect("list")
        .into_iter()
        .map(|s| (s.record.level.as_u8(), s.record.text))
        .collect()
}

#[test]
fn versioned_writes_follow_vx1() {
    let n = "ctx://acme/resources/docs/n";
    both(|name, idx| {
        let outcome = |w: NodeWrite| write(idx, vec![w]).remove(0).expect("write");
        let two = vec![doc(n, 0, "alpha", &[]), doc(n, 1, "beta", &[])];
        assert_eq!(
            outcome(sync(n, 2, two.clone())),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(
            outcome(sync(n, 1, vec![doc(n, 0, "old", &[])])),
            SyncOutcome::Stale,
            "{name}: older version"
        );
        assert_eq!(
            outcome(sync(n, 2, two)),
            SyncOutcome::Applied,
            "{name}: replay"
        );
        // A sync replaces all levels: level 1 is gone, level 0 has the new text.
        assert_eq!(
            outcome(sync(n, 3, vec![doc(n, 0, "gamma", &[])])),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(levels_of(idx, n), [(0, "gamma".to_owned())], "{name}");
        assert!(
            search(idx, "beta", &SearchFilter::default(), 5).is_empty(),
            "{name}"
        );
        let remove = |v| NodeWrite::Remove {
            uri: uri(n),
            version: v,
        };
        assert_eq!(
            outcome(remove(2)),
            SyncOutcome::Stale,
            "{name}: older removal"
        );
        assert_eq!(outcome(remove(3)), SyncOutcome::Applied, "{name}");
        assert!(levels_of(idx, n).is_empty(), "{name}");
        assert_eq!(
            outcome(sync(n, 3, vec![doc(n, 0, "zombie", &[])])),
            SyncOutcome::Stale,
            "{name}: the removal at v3 supersedes the live v3"
        );
        assert_eq!(
            outcome(sync(n, 4, vec![doc(n, 0, "reborn", &[])])),
            SyncOutcome::Applied,
            "{name}"
        );
        // A purge removes records whatever their version and keeps the version.
        assert_eq!(
            outcome(NodeWrite::Purge { uri: uri(n) }),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        assert_eq!(
            outcome(sync(n, 3, vec![doc(n, 0, "late", &[])])),
            SyncOutcome::Stale,
            "{name}"
        );
        // delete_by_uri, node and subtree.
        let m = "ctx://acme/resources/docs/n/m";
        apply_all(
            idx,
            vec![
                sync(n, 5, vec![doc(n, 0, "a", &[]), doc(n, 2, "b", &[])]),
                sync(m, 1, vec![doc(m, 0, "c", &[])]),
            ],
        );
        assert_eq!(
            idx.delete_by_uri(&uri(m), false).expect("delete"),
            1,
            "{name}"
        );
        assert_eq!(
            idx.delete_by_uri(&uri(m), false).expect("delete"),
            0,
            "{name}"
        );
        apply_all(idx, vec![sync(m, 2, vec![doc(m, 0, "c", &[])])]);
        let root = uri("ctx://acme/resources/docs");
        assert_eq!(idx.delete_by_uri(&root, true).expect("delete"), 3, "{name}");
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        idx.clear().expect("clear");
        assert_eq!(
            outcome(sync(n, 1, vec![doc(n, 0, "fresh", &[])])),
            SyncOutcome::Applied,
            "{name}: clear forgets versions"
        );
        let got = idx
            .get(&[uri(n), uri("ctx://acme/resources/nope")])
            .expect("get");
        assert_eq!(got.len(), 1, "{name}: absent nodes add nothing");
        assert_eq!(got[0].node_version, 1, "{name}");
        assert_eq!(got[0].record.text, "fresh", "{name}");
    });
}

#[test]
fn a_record_of_another_node_is_a_non_retryable_error_that_changes_nothing() {
    let a = "ctx://acme/resources/docs/a";
    let b = "ctx://acme/resources/docs/b";
    let c = "ctx://acme/resources/docs/c";
    both(|name, idx| {
        apply_all(
            idx,
            vec![
                sync(a, 1, vec![doc(a, 0, "first a", &[])]),
                sync(b, 1, vec![doc(b, 0, "first b", &[])]),
            ],
        );
        let before = idx.list_under(&CtxUri::root()).expect("list");
        let out = write(
            idx,
            vec![
                sync(a, 2, vec![doc(a, 0, "second a", &[])]),
                sync(
                    b,
                    2,
                    vec![doc(b, 0, "second b", &[]), doc(c, 0, "stray", &[])],
                ),
                sync(c, 1, vec![doc(c, 0, "c itself", &[])]),
            ],
        );
        assert_eq!(out.len(), 3, "{name}");
        assert!(matches!(out[0], Ok(SyncOutcome::Applied)), "{name}");
        let err = out[1].as_ref().expect_err("a record of another node");
        assert_eq!(err.code(), ErrorCode::InvalidField, "{name}: {err}");
        assert!(!err.is_retryable(), "{name}");
        assert!(matches!(out[2], Ok(SyncOutcome::Applied)), "{name}");
        assert_eq!(levels_of(idx, a), [(0, "second a".to_owned())], "{name}");
        assert_eq!(
            levels_of(idx, b),
            [(0, "first b".to_owned())],
            "{name}: b untouched"
        );
        assert!(
            search(idx, "stray", &SearchFilter::default(), 5).is_empty(),
            "{name}"
        );
        // b's version did not move to 2: a sync at 1 still applies.
        let again = write(idx, vec![sync(b, 1, vec![doc(b, 0, "first b", &[])])]);
        assert!(matches!(again[0], Ok(SyncOutcome::Applied)), "{name}");
        // A batch of only a bad write leaves the whole index as it was.
        let now = idx.list_under(&CtxUri::root()).expect("list");
        let out = write(idx, vec![sync(a, 9, vec![doc(b, 0, "wrong", &[])])]);
        assert!(out[0].is_err(), "{name}");
        assert_eq!(
            idx.list_under(&CtxUri::root()).expect("list"),
            now,
            "{name}"
        );
        assert_ne!(before, now, "{name}: the good writes did apply");
    });
}

// ---------------------------------------------------------------------------------------------
// Persistence.

#[test]
fn reopened_index_has_the_same_records_versions_and_hits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queries = ["run", "databases", "机器学习", "咖啡 coffee", "搜索"];
    let (list, hits) = {
        let idx = open(dir.path());
        apply_all(&idx, corpus());
        apply_all(
            &idx,
            vec![NodeWrite::Remove {
                uri: uri(DB_ZH),
                version: 2,
            }],
        );
        let hits: Vec<Vec<KeywordHit>> = queries
            .iter()
            .map(|q| search(&idx, q, &SearchFilter::default(), 10))
            .collect();
        (idx.list_under(&CtxUri::root()).expect("list"), hits)
    };
    let idx = open(dir.path());
    idx.check_consistency().expect("consistent after reopen");
    assert_eq!(idx.list_under(&CtxUri::root()).expect("list"), list);
    assert_eq!(idx.count().expect("count"), list.len() as u64);
    for (q, want) in queries.iter().zip(&hits) {
        assert_eq!(&search(&idx, q, &SearchFilter::default(), 10), want, "{q}");
    }
    let out = write(
        &idx,
        vec![
            sync(BOOK, 1, vec![doc(BOOK, 0, "replayed", &[])]),
            sync(DB_ZH, 2, vec![doc(DB_ZH, 0, "数据库", &[])]),
        ],
    );
    assert!(
        matches!(out[0], Ok(SyncOutcome::Applied)),
        "live v1 replays"
    );
    assert!(
        matches!(out[1], Ok(SyncOutcome::Stale)),
        "the tombstone at v2 survived the reopen"
    );
}

// ---------------------------------------------------------------------------------------------
// Model test.

const NODES: [&str; 9] = [
    "ctx://p/a",
    "ctx://p/a/x",
    "ctx://p/a/x/y",
    "ctx://p/ab",
    "ctx://p/b",
    "ctx://q/users/u1/memories/prefs/m",
    "ctx://q/users/u1/memories/m2",
    "ctx://q/agents/bot/skills/s",
    "ctx://q/resources/docs/r",
];

/// The vocabulary texts and queries are drawn from: stems shared across forms, Chinese words
/// that combine into compounds, and a stop-word-like term in most texts.
const WORDS: [&str; 16] = [
    "apple",
    "apples",
    "running",
    "runs",
    "database",
    "Index",
    "search",
    "the",
    "北京",
    "大学",
    "机器学习",
    "数据库",
    "搜索",
    "学习",
    "zebra",
    "，。",
];

/// Words only queries use (no text holds them, or they have no terms at all).
const QUERY_ONLY: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Batch(Vec<W>),
    Delete {
        node: usize,
        subtree: bool,
    },
    Search {
        query: String,
        filter: FilterSpec,
        k: usize,
    },
    Reopen,
    Clear,
}

#[derive(Debug, Clone)]
enum W {
    Sync {
        node: usize,
        version: u64,
        levels: Vec<(u8, String)>,
        tag: u8,
    },
    /// A sync of `node` carrying a record of `other`.
    Bad {
        node: usize,
        other: usize,
        version: u64,
    },
    Remove {
        node: usize,
        version: u64,
    },
    Purge {
        node: usize,
    },
}

#[derive(Debug, Clone)]
struct FilterSpec {
    subtree: Option<usize>,
    parent: Option<usize>,
    level: Option<u8>,
    context_type: Option<&'static str>,
    category: Option<&'static str>,
    account: Option<&'static str>,
    owners: Option<Vec<&'static str>>,
    tag: Option<u8>,
}

impl FilterSpec {
    fn build(&self) -> SearchFilter {
        SearchFilter {
            subtree: self.subtree.map(|n| uri(NODES[n])),
            parent_uri: self
                .parent
                .map(|n| uri(NODES[n]).parent().unwrap_or_else(CtxUri::root)),
            level: self.level.map(|l| Level::try_from(l).expect("level")),
            context_type: self.context_type.map(str::to_owned),
            category: self.category.map(str::to_owned),
            account_id: self.account.map(str::to_owned),
            owner_spaces: self
                .owners
                .as_ref()
                .map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
            meta: self
                .tag
                .map(|t| BTreeMap::from([("tag".to_owned(), json!(t))]))
                .unwrap_or_default(),
        }
    }
}

/// Text of up to 8 words with random separators (an empty one glues two words together).
fn text() -> impl Strategy<Value = String> {
    let seps = prop::sample::select(vec![" ", "", "，", ". "]);
    prop::collection::vec((0..WORDS.len() - QUERY_ONLY, seps), 0..10).prop_map(|ws| {
        ws.into_iter()
            .map(|(w, sep)| format!("{}{sep}", WORDS[w]))
            .collect()
    })
}

fn query() -> impl Strategy<Value = String> {
    prop::collection::vec(0..WORDS.len(), 1..4).prop_map(|ws| {
        ws.into_iter()
            .map(|w| WORDS[w])
            .collect::<Vec<_>>()
            .join(" ")
    })
}

fn filter() -> impl Strategy<Value = FilterSpec> {
    (
        (
            prop::option::weighted(0.25, 0..NODES.len()),
            prop::option::weighted(0.08, 0..NODES.len()),
            prop::option::weighted(0.15, 0u8..3),
            prop::option::weighted(
                0.1,
                prop::sample::select(vec!["memory", "resource", "skill"]),
            ),
        ),
        (
            prop::option::weighted(0.08, prop::sample::select(vec!["", "prefs", "docs"])),
            prop::option::weighted(0.08, prop::sample::select(vec!["p", "q"])),
            prop::option::weighted(
                0.08,
                prop::sample::subsequence(vec!["shared", "user:u1", "agent:bot"], 0..=2),
            ),
            prop::option::weighted(0.15, 0u8..3),
        ),
    )
        .prop_map(
            |((subtree, parent, level, context_type), (category, account, owners, tag))| {
                FilterSpec {
                    subtree,
                    parent,
                    level,
                    context_type,
                    category,
                    account,
                    owners,
                    tag,
                }
            },
        )
}

fn node_write() -> impl Strategy<Value = W> {
    let n = 0..NODES.len();
    let levels = prop::collection::btree_map(0u8..3, text(), 0..=3)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>());
    prop_oneof![
        8 => (n.clone(), 1u64..8, levels, 0u8..3)
            .prop_map(|(node, version, levels, tag)| W::Sync { node, version, levels, tag }),
        2 => (n.clone(), 1u64..8).prop_map(|(node, version)| W::Remove { node, version }),
        1 => n.clone().prop_map(|node| W::Purge { node }),
        1 => (n.clone(), n, 1u64..8).prop_map(|(node, other, version)| W::Bad { node, other, version }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        16 => prop::collection::vec(node_write(), 1..6).prop_map(Op::Batch),
        2 => (0..NODES.len(), any::<bool>()).prop_map(|(node, subtree)| Op::Delete { node, subtree }),
        16 => (query(), filter(), 1usize..6).prop_map(|(query, filter, k)| Op::Search { query, filter, k }),
        2 => Just(Op::Reopen),
        1 => Just(Op::Clear),
    ]
}

fn to_write(w: &W) -> NodeWrite {
    let rec = |node: usize, level: u8, text: &str, tag: u8| {
        doc(NODES[node], level, text, &[("tag", json!(tag))])
    };
    match w {
        W::Sync {
            node,
            version,
            levels,
            tag,
        } => sync(
            NODES[*node],
            *version,
            levels
                .iter()
                .map(|(l, t)| rec(*node, *l, t, *tag))
                .collect(),
        ),
        W::Bad {
            node,
            other,
            version,
        } => {
            let other = if other == node {
                (other + 1) % NODES.len()
            } else {
                *other
            };
            sync(
                NODES[*node],
                *version,
                vec![rec(*node, 0, "apple", 0), rec(other, 1, "search", 0)],
            )
        }
        W::Remove { node, version } => NodeWrite::Remove {
            uri: uri(NODES[*node]),
            version: *version,
        },
        W::Purge { node } => NodeWrite::Purge {
            uri: uri(NODES[*node]),
        },
    }
}

/// A comparable outcome of `op` (searches compare their hits separately).
fn apply(idx: &dyn KeywordIndex, op: &Op) -> Result<String, String> {
    let cls =
        |e: ce_index::IndexError| format!("error {:?} retryable={}", e.code(), e.is_retryable());
    match op {
        Op::Batch(ws) => idx
            .write_nodes(&ws.iter().map(to_write).collect::<Vec<_>>())
            .map(|outs| {
                outs.into_iter()
                    .map(|o| o.map(|o| format!("{o:?}")).unwrap_or_else(cls))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .map_err(cls),
        Op::Delete { node, subtree } => idx
            .delete_by_uri(&uri(NODES[*node]), *subtree)
            .map(|n| n.to_string())
            .map_err(cls),
        Op::Clear => idx.clear().map(|()| "ok".into()).map_err(cls),
        Op::Search { .. } | Op::Reopen => Ok("ok".into()),
    }
}

/// How many stored records pass `f` and hold a term of `query`: the number of hits a search
/// for at most that many must return.
fn matching(state: &[ce_index::keyword::StoredRecord], query: &str, f: &SearchFilter) -> usize {
    let q: BTreeSet<String> = tokenize(query).into_iter().collect();
    state
        .iter()
        .filter(|s| f.matches(&s.record) && tokenize(&s.record.text).iter().any(|t| q.contains(t)))
        .count()
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// What the model test exercised, printed at its end (a test that stops finding anything
/// would otherwise pass silently).
#[derive(Debug, Default)]
struct Tally {
    cases: Cell<u64>,
    applied: Cell<u64>,
    searches: Cell<u64>,
    searches_with_hits: Cell<u64>,
    full_top_k: Cell<u64>,
    max_records: Cell<usize>,
}

fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}

/// One embedded index that can be closed and reopened.
struct Reopenable {
    dir: tempfile::TempDir,
    options: EmbeddedKeywordOptions,
    index: Option<EmbeddedKeywordIndex>,
}

impl Reopenable {
    fn new(options: EmbeddedKeywordOptions) -> Result<Self, TestCaseError> {
        let dir = tempfile::tempdir().map_err(fail)?;
        let index =
            Some(EmbeddedKeywordIndex::open_with(dir.path(), options.clone()).map_err(fail)?);
        Ok(Reopenable {
            dir,
            options,
            index,
        })
    }

    fn get(&self) -> Result<&EmbeddedKeywordIndex, TestCaseError> {
        self.index.as_ref().ok_or_else(|| fail("index closed"))
    }

    fn reopen(&mut self) -> Result<(), TestCaseError> {
        drop(self.index.take());
        let index = EmbeddedKeywordIndex::open_with(self.dir.path(), self.options.clone());
        self.index = Some(index.map_err(fail)?);
        Ok(())
    }
}

/// Runs `ops` on the oracle and on two embedded indexes — default options, and pages of one
/// candidate (so that paging through filtered candidates and ties at the `top_k` boundary are
/// exercised) — comparing after every step.
fn run_case(ops: &[Op], tally: &Tally) -> Result<(), TestCaseError> {
    bump(&tally.cases);
    let oracle = MemoryKeywordIndex::new();
    let mut embedded = [
        Reopenable::new(EmbeddedKeywordOptions::default())?,
        Reopenable::new(EmbeddedKeywordOptions {
            first_page: 1,
            max_page: 1,
        })?,
    ];
    let root = CtxUri::root();
    for (i, op) in ops.iter().enumerate() {
        let want = apply(&oracle, op);
        if let Ok(out) = &want {
            let n = out.matches("Applied").count() as u64;
            tally.applied.set(tally.applied.get() + n);
        }
        let state = oracle.list_under(&root).map_err(fail)?;
        tally
            .max_records
            .set(tally.max_records.get().max(state.len()));
        let hits = match op {
            Op::Search { query, filter, k } => {
                let f = filter.build();
                let hits = oracle.search(query, &f, *k).map_err(fail)?;
                prop_assert_eq!(
                    hits.len(),
                    matching(&state, query, &f).min(*k),
                    "step {}: exactly top_k hits when enough records match",
                    i
                );
                prop_assert!(hits.iter().all(|h| f.matches(&h.record)), "step {}", i);
                bump(&tally.searches);
                if !hits.is_empty() {
                    bump(&tally.searches_with_hits);
                }
                if hits.len() == *k {
                    bump(&tally.full_top_k);
                }
                hits
            }
            _ => Vec::new(),
        };
        for (name, e) in ["default", "paged"].into_iter().zip(&mut embedded) {
            if let Op::Reopen = op {
                e.reopen()?;
            }
            let e = e.get()?;
            prop_assert_eq!(&apply(e, op), &want, "step {}: {}: {:?}", i, name, op);
            prop_assert_eq!(
                &e.list_under(&root).map_err(fail)?,
                &state,
                "step {}: {}: state after {:?}",
                i,
                name,
                op
            );
            prop_assert_eq!(e.count().map_err(fail)?, state.len() as u64, "step {}", i);
            prop_assert_eq!(
                e.uris_under(&root).map_err(fail)?,
                oracle.uris_under(&root).map_err(fail)?,
                "step {}: {}: the URIs held",
                i,
                name
            );
            if let Op::Search { query, filter, k } = op {
                let got = e.search(query, &filter.build(), *k).map_err(fail)?;
                let ids =
                    |h: &[KeywordHit]| h.iter().map(|h| h.record.id.clone()).collect::<Vec<_>>();
                prop_assert_eq!(ids(&got), ids(&hits), "step {}: {}: {:?}", i, name, op);
                for (g, w) in got.iter().zip(&hits) {
                    prop_assert!(
                        (g.score - w.score).abs() <= SCORE_EPS,
                        "step {}: {}: score {} vs {}",
                        i,
                        name,
                        g.score,
                        w.score
                    );
                    prop_assert_eq!(&g.record, &w.record, "step {}: {}", i, name);
                }
            }
        }
    }
    for e in &embedded {
        e.get()?.check_consistency().map_err(fail)?;
    }
    Ok(())
}

#[test]
fn embedded_matches_the_exact_oracle() {
    let seed = seed("keyword::embedded_matches_the_exact_oracle");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(64), 2048);
    let tally = Tally::default();
    let started = std::time::Instant::now();
    match runner.run(&prop::collection::vec(op(), 1..=40), |ops| {
        run_case(&ops, &tally)
    }) {
        Ok(()) => {
            eprintln!("keyword model: {tally:?} in {:?}", started.elapsed());
            assert!(
                tally.searches_with_hits.get() * 4 > tally.searches.get(),
                "too few searches find anything: {tally:?}"
            );
        }
        Err(TestError::Fail(why, ops)) => panic!(
            "keyword model test failed (replay with CE_SEED={seed}): {why}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("keyword model test aborted (CE_SEED={seed}): {e}"),
    }
}
