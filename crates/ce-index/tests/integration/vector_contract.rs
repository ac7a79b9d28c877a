//! The `VectorIndex` contract (spec §6 and the versioned writes of `vector/mod.rs`). Every
//! test runs the same function against the exact in-memory index, the embedded index and the
//! pgvector index (each with its default planner, and with its planner forced onto the
//! graph). The pgvector runs use the test server of `scripts/pgvector-server.py` (see
//! `ce_testkit::pgvector`); the tests at the end are about the pgvector index alone:
//! persistence across opens, several openers, lost connections.

use std::collections::{BTreeMap, BTreeSet};

use ce_core::{Classify, CtxUri, ErrorCode, Level, stable_hash};
use ce_embed::ModelIdentity;
use ce_index::IndexError;
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{
    NodeWrite, PgVectorIndex, PgVectorOptions, SearchFilter, StoredVector, SyncOutcome,
    VectorIndex, VectorRecord,
};
use serde_json::json;

use crate::common::{
    DIM, each_index, hit_ids, kept, nr, pgvector, record, snapshot, unit, uri, vr,
};

fn ids(idx: &dyn VectorIndex, under: &str) -> Vec<String> {
    idx.list_under(&uri(under))
        .expect("list")
        .into_iter()
        .map(|s| s.record.uri.to_string() + "#" + &s.record.level.to_string())
        .collect()
}

#[test]
fn upsert_get_count_are_idempotent() {
    each_index(|name, idx| {
        let recs = vec![
            vr("ctx://a/docs/x", 0, unit(1, DIM)),
            vr("ctx://a/docs/x", 1, unit(2, DIM)),
            vr("ctx://a/docs/y", 0, unit(3, DIM)),
        ];
        idx.upsert(&recs).expect("upsert");
        let first = snapshot(idx);
        idx.upsert(&recs).expect("upsert again");
        assert_eq!(
            snapshot(idx),
            first,
            "{name}: a replayed upsert changes nothing"
        );
        assert_eq!(idx.count().expect("count"), 3, "{name}");
        let want = [
            uri("ctx://a/docs/y"),
            uri("ctx://a/docs/nope"),
            uri("ctx://a/docs/x"),
        ];
        let got = idx.get(&want).expect("get");
        assert_eq!(got.len(), 3, "{name}: absent nodes add nothing");
        assert_eq!(
            got[0].record, recs[2].record,
            "{name}: nodes in the order asked"
        );
        assert_eq!(got[1].record, recs[0].record, "{name}: levels ascending");
        assert_eq!(got[2].record, recs[1].record, "{name}");
        assert_eq!(
            got[0].node_version, 1,
            "{name}: version from metadata.node_version"
        );
        // Overwrite by id: new text and vector, same id.
        let mut changed = recs[0].clone();
        changed.record.text = "new text".into();
        changed
            .record
            .metadata
            .insert("content_hash".into(), json!("hash of the new text"));
        changed.vector = unit(9, DIM);
        idx.upsert(&[changed.clone()]).expect("overwrite");
        assert_eq!(idx.count().expect("count"), 3, "{name}");
        // Vectors come with their records' text hashes, in the order of `get`.
        let want = [
            uri("ctx://a/docs/nope"),
            uri("ctx://a/docs/x"),
            uri("ctx://a/docs/y"),
        ];
        assert_eq!(
            idx.vectors(&want).expect("vectors"),
            [
                StoredVector {
                    id: changed.record.id.clone(),
                    text_hash: Some("hash of the new text".into()),
                    vector: kept(&unit(9, DIM)),
                },
                StoredVector {
                    id: recs[1].record.id.clone(),
                    text_hash: None,
                    vector: kept(&unit(2, DIM)),
                },
                StoredVector {
                    id: recs[2].record.id.clone(),
                    text_hash: None,
                    vector: kept(&unit(3, DIM)),
                },
            ],
            "{name}"
        );
        let hits = idx
            .search(&unit(9, DIM), &SearchFilter::default(), 1)
            .expect("search");
        assert_eq!(
            hits[0].record, changed.record,
            "{name}: the new vector is searched"
        );
        assert!(hits[0].score > 0.999, "{name}: {}", hits[0].score);
        // An empty upsert is fine.
        idx.upsert(&[]).expect("empty upsert");
    });
}

fn uris(idx: &dyn VectorIndex, under: &str) -> Vec<String> {
    idx.uris_under(&uri(under))
        .expect("uris")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn list_under_is_ordered_by_uri_then_level_and_uris_under_lists_each_uri_once() {
    each_index(|name, idx| {
        idx.upsert(&[
            vr("ctx://a/z", 2, unit(1, DIM)),
            vr("ctx://a/b/c", 0, unit(2, DIM)),
            vr("ctx://a/z", 0, unit(3, DIM)),
            vr("ctx://a/b", 1, unit(4, DIM)),
            vr("ctx://a/b!", 0, unit(5, DIM)),
        ])
        .expect("upsert");
        assert_eq!(
            ids(idx, "ctx://"),
            [
                "ctx://a/b#1",
                "ctx://a/b!#0",
                "ctx://a/b/c#0",
                "ctx://a/z#0",
                "ctx://a/z#2"
            ],
            "{name}"
        );
        assert_eq!(
            ids(idx, "ctx://a/b"),
            ["ctx://a/b#1", "ctx://a/b/c#0"],
            "{name}"
        );
        assert_eq!(
            uris(idx, "ctx://"),
            ["ctx://a/b", "ctx://a/b!", "ctx://a/b/c", "ctx://a/z"],
            "{name}"
        );
        assert_eq!(
            uris(idx, "ctx://a/b"),
            ["ctx://a/b", "ctx://a/b/c"],
            "{name}: not the look-alike ctx://a/b!"
        );
        assert_eq!(uris(idx, "ctx://a/z"), ["ctx://a/z"], "{name}");
        assert!(uris(idx, "ctx://a/y").is_empty(), "{name}");
    });
}

#[test]
fn delete_by_uri_node_only_or_subtree() {
    each_index(|name, idx| {
        let all = [
            "ctx://a/b",
            "ctx://a/b/c",
            "ctx://a/b/c/d",
            "ctx://a/bc",
            "ctx://a/bc/d",
        ];
        let fill = || {
            idx.clear().expect("clear");
            let recs: Vec<VectorRecord> = all
                .iter()
                .enumerate()
                .flat_map(|(i, u)| {
                    [
                        vr(u, 0, unit(i as u64 * 2, DIM)),
                        vr(u, 2, unit(i as u64 * 2 + 1, DIM)),
                    ]
                })
                .collect();
            idx.upsert(&recs).expect("upsert");
        };
        fill();
        assert_eq!(
            idx.delete_by_uri(&uri("ctx://a/b"), false).expect("delete"),
            2,
            "{name}"
        );
        assert_eq!(
            ids(idx, "ctx://"),
            [
                "ctx://a/b/c#0",
                "ctx://a/b/c#2",
                "ctx://a/b/c/d#0",
                "ctx://a/b/c/d#2",
                "ctx://a/bc#0",
                "ctx://a/bc#2",
                "ctx://a/bc/d#0",
                "ctx://a/bc/d#2"
            ],
            "{name}: node only, all levels"
        );
        fill();
        assert_eq!(
            idx.delete_by_uri(&uri("ctx://a/b"), true).expect("delete"),
            6,
            "{name}"
        );
        assert_eq!(
            ids(idx, "ctx://"),
            [
                "ctx://a/bc#0",
                "ctx://a/bc#2",
                "ctx://a/bc/d#0",
                "ctx://a/bc/d#2"
            ],
            "{name}: a/bc shares the name prefix but is not in the subtree"
        );
        assert_eq!(
            idx.delete_by_uri(&uri("ctx://a/b"), true).expect("again"),
            0,
            "{name}"
        );
        assert_eq!(
            idx.delete_by_uri(&uri("ctx://nothing"), false)
                .expect("none"),
            0,
            "{name}"
        );
        // The graph forgot the deleted vectors too.
        let hits = idx
            .search(&unit(0, DIM), &SearchFilter::default(), 10)
            .expect("search");
        assert!(
            hits.iter()
                .all(|h| h.record.uri.as_str().starts_with("ctx://a/bc")),
            "{name}"
        );
        assert_eq!(
            idx.delete_by_uri(&CtxUri::root(), true).expect("all"),
            4,
            "{name}"
        );
        assert_eq!(idx.count().expect("count"), 0, "{name}");
    });
}

/// The records of the move fixture: a subtree with a root, a child and a grandchild, a
/// sibling sharing the name prefix, and metadata that must survive.
fn move_fixture(idx: &dyn VectorIndex) -> Vec<VectorRecord> {
    let mut recs = vec![
        vr("ctx://acc/users/u1/memories/prefs", 0, unit(1, DIM)),
        vr("ctx://acc/users/u1/memories/prefs", 1, unit(2, DIM)),
        vr("ctx://acc/users/u1/memories/prefs/theme", 0, unit(3, DIM)),
        vr(
            "ctx://acc/users/u1/memories/prefs/theme/dark",
            2,
            unit(4, DIM),
        ),
        vr("ctx://acc/users/u1/memories/prefsx", 0, unit(5, DIM)),
    ];
    recs[2].record.metadata.insert("tags".into(), json!(["ui"]));
    recs[2].record.filters.insert("lang".into(), json!("zh"));
    idx.upsert(&recs).expect("upsert");
    recs
}

#[test]
fn move_rewrites_uris_parents_and_ids_and_keeps_vectors() {
    each_index(|name, idx| {
        let recs = move_fixture(idx);
        let scores: Vec<f32> = recs
            .iter()
            .map(|r| {
                idx.search(&r.vector, &SearchFilter::default(), 1)
                    .expect("search")[0]
                    .score
            })
            .collect();
        let from = uri("ctx://acc/users/u1/memories/prefs");
        let to = uri("ctx://acc/users/u2/memories/settings/ui");
        assert_eq!(idx.move_uri(&from, &to).expect("move"), 4, "{name}");
        let after = snapshot(idx);
        let uris: Vec<String> = after
            .iter()
            .map(|s| format!("{}#{}", s.record.uri, s.record.level))
            .collect();
        assert_eq!(
            uris,
            [
                "ctx://acc/users/u1/memories/prefsx#0",
                "ctx://acc/users/u2/memories/settings/ui#0",
                "ctx://acc/users/u2/memories/settings/ui#1",
                "ctx://acc/users/u2/memories/settings/ui/theme#0",
                "ctx://acc/users/u2/memories/settings/ui/theme/dark#2",
            ],
            "{name}"
        );
        for s in &after[1..] {
            let r = &s.record;
            assert_eq!(
                r.id,
                stable_hash(r.uri.as_str(), r.level.as_u8()),
                "{name}: re-keyed"
            );
            assert_eq!(r.filters["uri"], json!(r.uri.as_str()), "{name}");
            assert_eq!(
                r.filters["parent_uri"],
                json!(r.parent_uri.as_str()),
                "{name}"
            );
            assert_eq!(
                r.filters["owner_space"],
                json!("user:u2"),
                "{name}: path default follows"
            );
            assert_eq!(r.category, "settings", "{name}: path default follows");
            assert_eq!(r.filters["category"], json!("settings"), "{name}");
        }
        assert_eq!(
            after[1].record.parent_uri,
            uri("ctx://acc/users/u2/memories/settings"),
            "{name}: the moved root's parent is parent(to)"
        );
        assert_eq!(
            after[3].record.parent_uri,
            uri("ctx://acc/users/u2/memories/settings/ui"),
            "{name}: a child's parent is rebased"
        );
        assert_eq!(
            after[3].record.metadata["tags"],
            json!(["ui"]),
            "{name}: metadata kept"
        );
        assert_eq!(
            after[3].record.filters["lang"],
            json!("zh"),
            "{name}: user filters kept"
        );
        assert_eq!(
            after[3].record.text, recs[2].record.text,
            "{name}: text kept"
        );
        // Vectors kept exactly: each vector finds its moved record with the same score.
        for (r, s) in recs.iter().zip(&scores) {
            let hit = &idx
                .search(&r.vector, &SearchFilter::default(), 1)
                .expect("search")[0];
            let want = r
                .record
                .uri
                .rebase(&from, &to)
                .unwrap_or_else(|_| r.record.uri.clone());
            assert_eq!(hit.record.uri, want, "{name}");
            assert_eq!(
                hit.score.to_bits(),
                s.to_bits(),
                "{name}: same vector, same score"
            );
        }
        // Nothing is left at the old URIs; the sibling with the shared prefix did not move.
        let old: Vec<CtxUri> = recs[..4].iter().map(|r| r.record.uri.clone()).collect();
        assert!(idx.get(&old).expect("get").is_empty(), "{name}");
        assert_eq!(idx.count().expect("count"), 5, "{name}");
        // Subtree filters see the new place.
        let f = SearchFilter {
            subtree: Some(to.clone()),
            ..SearchFilter::default()
        };
        assert_eq!(hit_ids(idx, &unit(1, DIM), &f, 10).len(), 4, "{name}");
        let f = SearchFilter {
            subtree: Some(from.clone()),
            ..SearchFilter::default()
        };
        assert!(hit_ids(idx, &unit(1, DIM), &f, 10).is_empty(), "{name}");
    });
}

#[test]
fn move_is_idempotent_and_reentrant() {
    let from = uri("ctx://acc/users/u1/memories/prefs");
    let to = uri("ctx://acc/shared/prefs");
    // The state after one clean move.
    let mut clean = None;
    each_index(|name, idx| {
        move_fixture(idx);
        idx.move_uri(&from, &to).expect("move");
        let once = snapshot(idx);
        assert_eq!(
            idx.move_uri(&from, &to).expect("again"),
            0,
            "{name}: nothing left to move"
        );
        assert_eq!(
            snapshot(idx),
            once,
            "{name}: a replayed move changes nothing"
        );
        assert_eq!(
            idx.move_uri(&to, &to).expect("noop"),
            0,
            "{name}: from == to"
        );
        match &clean {
            None => clean = Some(once),
            Some(c) => assert_eq!(&once, c, "{name}: same result as the oracle"),
        }
    });
    let clean = clean.expect("ran");
    // Half done: an earlier attempt moved some records (written at the target, not yet deleted
    // at the source, or deleted too) before it failed.
    each_index(|name, idx| {
        let recs = move_fixture(idx);
        let moved_copy = |r: &VectorRecord| {
            let to_uri = r.record.uri.rebase(&from, &to).expect("rebase");
            let mut rec = record(to_uri.as_str(), r.record.level.as_u8(), &[]);
            rec.text = r.record.text.clone();
            rec.metadata = r.record.metadata.clone();
            rec.filters.extend(
                r.record
                    .filters
                    .iter()
                    .filter(|(k, _)| k.as_str() == "lang")
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            VectorRecord {
                record: rec,
                vector: r.vector.clone(),
            }
        };
        idx.upsert(&[moved_copy(&recs[0]), moved_copy(&recs[2])])
            .expect("half");
        idx.delete_by_uri(&recs[0].record.uri, false)
            .expect("source partly gone");
        idx.upsert(&[recs[1].clone()])
            .expect("level 1 still at the source");
        idx.move_uri(&from, &to).expect("resume the move");
        assert_eq!(snapshot(idx), clean, "{name}: the resumed move converges");
    });
}

#[test]
fn move_rejects_the_root_and_moves_within_its_own_line() {
    each_index(|name, idx| {
        move_fixture(idx);
        let before = snapshot(idx);
        let a = uri("ctx://acc/users/u1/memories/prefs");
        for (from, to) in [
            (CtxUri::root(), uri("ctx://x")),
            (a.clone(), CtxUri::root()),
            (a.clone(), uri("ctx://acc/users/u1/memories/prefs/theme/x")),
            (uri("ctx://acc/users/u1/memories/prefs/theme"), a.clone()),
        ] {
            let err = idx.move_uri(&from, &to).expect_err("invalid move");
            assert!(!err.is_retryable(), "{name}: {err}");
        }
        assert_eq!(snapshot(idx), before, "{name}: nothing changed");
    });
}

#[test]
fn move_drops_records_whose_target_holds_a_newer_version() {
    each_index(|name, idx| {
        let src = "ctx://a/docs/old";
        let dst = "ctx://a/docs/new";
        assert_eq!(
            idx.sync_node(
                &uri(src),
                5,
                vec![
                    nr(src, 0, Some(unit(1, DIM))),
                    nr(src, 1, Some(unit(2, DIM)))
                ]
            )
            .expect("sync src"),
            SyncOutcome::Applied
        );
        assert_eq!(
            idx.sync_node(&uri(dst), 9, vec![nr(dst, 0, Some(unit(3, DIM)))])
                .expect("sync dst"),
            SyncOutcome::Applied
        );
        assert_eq!(
            idx.move_uri(&uri(src), &uri(dst)).expect("move"),
            0,
            "{name}"
        );
        let after = snapshot(idx);
        assert_eq!(
            after.len(),
            1,
            "{name}: the stale source records are dropped"
        );
        assert_eq!(after[0].record.uri, uri(dst), "{name}");
        assert_eq!(after[0].node_version, 9, "{name}: the newer target stays");
        // The move tombstoned the source: a late sync of the moved version is stale.
        assert_eq!(
            idx.sync_node(&uri(src), 5, vec![nr(src, 0, Some(unit(1, DIM)))])
                .expect("late"),
            SyncOutcome::Stale,
            "{name}"
        );
        assert_eq!(
            idx.sync_node(&uri(src), 6, vec![nr(src, 0, Some(unit(1, DIM)))])
                .expect("new node"),
            SyncOutcome::Applied,
            "{name}: a node recreated at a newer version applies"
        );
    });
}

#[test]
fn versioned_writes_follow_vx1() {
    each_index(|name, idx| {
        let u = "ctx://a/notes/n1";
        let node = uri(u);
        let v1 = unit(1, DIM);
        let sync = |version, levels: &[u8], vector: Option<Vec<f32>>| {
            idx.sync_node(
                &node,
                version,
                levels.iter().map(|l| nr(u, *l, vector.clone())).collect(),
            )
        };
        assert_eq!(
            sync(5, &[0, 1], Some(v1.clone())).expect("v5"),
            SyncOutcome::Applied
        );
        let at5 = snapshot(idx);
        assert!(at5.iter().all(|s| s.node_version == 5), "{name}");
        assert_eq!(
            sync(5, &[0, 1], Some(v1.clone())).expect("replay"),
            SyncOutcome::Applied
        );
        assert_eq!(snapshot(idx), at5, "{name}: a replay is idempotent");
        assert_eq!(
            sync(4, &[2], Some(unit(7, DIM))).expect("v4"),
            SyncOutcome::Stale,
            "{name}"
        );
        assert_eq!(
            idx.remove_node(&node, 4).expect("rm v4"),
            SyncOutcome::Stale,
            "{name}"
        );
        assert_eq!(snapshot(idx), at5, "{name}: stale writes change nothing");
        // Levels not given are removed.
        assert_eq!(
            sync(6, &[0], Some(v1.clone())).expect("v6"),
            SyncOutcome::Applied
        );
        assert_eq!(ids(idx, u), [format!("{u}#0")], "{name}");
        // A remove at v7, then a sync computed before it (v6, or v7 itself) is stale.
        assert_eq!(
            idx.remove_node(&node, 7).expect("rm v7"),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        assert_eq!(
            idx.remove_node(&node, 7).expect("rm replay"),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(
            sync(6, &[0], Some(v1.clone())).expect("v6"),
            SyncOutcome::Stale,
            "{name}"
        );
        assert_eq!(
            sync(7, &[0], Some(v1.clone())).expect("v7"),
            SyncOutcome::Stale,
            "{name}"
        );
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        assert_eq!(
            sync(8, &[0, 2], Some(v1.clone())).expect("v8"),
            SyncOutcome::Applied
        );
        assert_eq!(ids(idx, u), [format!("{u}#0"), format!("{u}#2")], "{name}");
        // Removing a node never touches its children or siblings.
        idx.upsert(&[
            vr("ctx://a/notes/n1/child", 0, unit(3, DIM)),
            vr("ctx://a/notes/n10", 0, unit(4, DIM)),
        ])
        .expect("upsert");
        assert_eq!(
            idx.remove_node(&node, 9).expect("rm v9"),
            SyncOutcome::Applied,
            "{name}"
        );
        assert_eq!(
            ids(idx, "ctx://a"),
            ["ctx://a/notes/n1/child#0", "ctx://a/notes/n10#0"],
            "{name}"
        );
        // Versions are per URI: another URI is unaffected by n1's versions.
        assert_eq!(
            idx.sync_node(
                &uri("ctx://a/notes/n2"),
                1,
                vec![nr("ctx://a/notes/n2", 0, Some(v1.clone()))]
            )
            .expect("n2"),
            SyncOutcome::Applied,
            "{name}"
        );
    });
}

#[test]
fn payload_only_sync_keeps_the_stored_vector() {
    each_index(|name, idx| {
        let u = "ctx://a/notes/n1";
        let node = uri(u);
        let v = unit(11, DIM);
        idx.sync_node(&node, 1, vec![nr(u, 0, Some(v.clone()))])
            .expect("v1");
        let score = idx.search(&v, &SearchFilter::default(), 1).expect("search")[0].score;
        let mut payload = nr(u, 0, None);
        payload.record.category = "renamed".into();
        payload
            .record
            .filters
            .insert("category".into(), json!("renamed"));
        assert_eq!(
            idx.sync_node(&node, 2, vec![payload]).expect("v2"),
            SyncOutcome::Applied
        );
        let hit = &idx.search(&v, &SearchFilter::default(), 1).expect("search")[0];
        assert_eq!(hit.record.category, "renamed", "{name}");
        assert_eq!(
            hit.score.to_bits(),
            score.to_bits(),
            "{name}: the vector is kept"
        );
        let f = SearchFilter {
            category: Some("renamed".into()),
            ..SearchFilter::default()
        };
        assert_eq!(
            hit_ids(idx, &v, &f, 5).len(),
            1,
            "{name}: filters see the new payload"
        );
        // No stored vector for level 1: an error, and nothing changes (not even level 0). It
        // is retryable: the writer planned from a state another worker has since changed (a
        // move took the vector away), and its retry plans again and embeds.
        let before = snapshot(idx);
        let err = idx
            .sync_node(
                &node,
                3,
                vec![nr(u, 0, Some(unit(12, DIM))), nr(u, 1, None)],
            )
            .expect_err("no vector to keep");
        assert!(err.is_retryable(), "{name}: {err}");
        assert_eq!(err.code(), ErrorCode::VersionConflict, "{name}: {err}");
        assert_eq!(
            snapshot(idx),
            before,
            "{name}: the failed sync wrote nothing"
        );
        assert_eq!(
            idx.sync_node(&node, 3, vec![nr(u, 0, Some(unit(12, DIM)))])
                .expect("v3"),
            SyncOutcome::Applied,
            "{name}: the failed sync did not record its version"
        );
        // A record of another node is refused.
        let err = idx
            .sync_node(
                &node,
                4,
                vec![nr("ctx://a/notes/other", 0, Some(v.clone()))],
            )
            .expect_err("foreign record");
        assert_eq!(err.code(), ErrorCode::InvalidField, "{name}: {err}");
    });
}

/// A payload-only write keeps the stored vector only while the stored record is of the same
/// text: the worker planned it from a read of the index, and an older write of the node that
/// landed since (admitted as newer than what was stored) holds another text's vector. Both
/// the per-node path (`sync_node`) and the batched one (`write_nodes`) refuse it, retryably,
/// and write nothing.
#[test]
fn a_payload_only_write_does_not_keep_the_vector_of_another_text() {
    each_index(|name, idx| {
        let u = "ctx://a/notes/k";
        let node = uri(u);
        let of_text = |text: &str, vector: Option<Vec<f32>>| {
            let mut r = nr(u, 0, vector);
            r.record.text = text.into();
            r.record
                .metadata
                .insert("content_hash".into(), json!(ce_core::sha256_tagged(text)));
            r
        };
        idx.sync_node(&node, 1, vec![of_text("first text", Some(unit(21, DIM)))])
            .expect("v1");
        // The older write of another text lands.
        idx.sync_node(&node, 2, vec![of_text("second text", Some(unit(22, DIM)))])
            .expect("v2");
        let before = snapshot(idx);
        // Planned when the stored text was "first text": refused, nothing written.
        let err = idx
            .sync_node(&node, 3, vec![of_text("first text", None)])
            .expect_err("another text's vector");
        assert!(err.is_retryable(), "{name}: {err}");
        assert_eq!(err.code(), ErrorCode::VersionConflict, "{name}: {err}");
        let batched = idx
            .write_nodes(&[NodeWrite::Sync {
                uri: node.clone(),
                version: 3,
                records: vec![of_text("first text", None)],
            }])
            .expect("batch");
        let err = batched[0]
            .as_ref()
            .expect_err("batched: another text's vector");
        assert!(err.is_retryable(), "{name}: {err}");
        assert_eq!(
            snapshot(idx),
            before,
            "{name}: the refused writes wrote nothing"
        );
        // The same text keeps its vector.
        assert_eq!(
            idx.sync_node(&node, 3, vec![of_text("second text", None)])
                .expect("v3"),
            SyncOutcome::Applied,
            "{name}"
        );
        let hit = &idx
            .search(&unit(22, DIM), &SearchFilter::default(), 1)
            .expect("search")[0];
        assert_eq!(hit.record.text, "second text", "{name}");
        assert!(
            hit.score > 0.999,
            "{name}: the vector is kept ({})",
            hit.score
        );
    });
}

/// A corpus exercising every filter field.
fn filter_corpus(idx: &dyn VectorIndex) -> Vec<VectorRecord> {
    let specs: [(&str, &[(&str, serde_json::Value)]); 8] = [
        (
            "ctx://acc1/users/u1/memories/prefs/a",
            &[("lang", json!("zh")), ("stars", json!(5))],
        ),
        (
            "ctx://acc1/users/u1/memories/prefs/b",
            &[("lang", json!("en")), ("stars", json!(5.0))],
        ),
        (
            "ctx://acc1/users/u2/memories/events/c",
            &[("lang", json!("zh")), ("pinned", json!(true))],
        ),
        (
            "ctx://acc1/agents/bot/skills/search",
            &[("lang", json!("en"))],
        ),
        ("ctx://acc1/resources/docs/guide", &[("stars", json!(3))]),
        ("ctx://acc1/resources/docs/guide/ch1", &[]),
        (
            "ctx://acc2/users/u1/memories/prefs/a",
            &[("lang", json!("zh"))],
        ),
        ("ctx://acc2/resources/docs/guidex", &[]),
    ];
    let mut recs = Vec::new();
    for (i, (u, extra)) in specs.iter().enumerate() {
        for level in [0u8, 1] {
            recs.push(VectorRecord {
                record: record(u, level, extra),
                vector: unit(i as u64 * 3 + u64::from(level), DIM),
            });
        }
    }
    idx.upsert(&recs).expect("upsert");
    recs
}

#[test]
fn every_filter_field_matches_the_reference() {
    let filters = vec![
        SearchFilter::default(),
        SearchFilter {
            subtree: Some(uri("ctx://acc1/resources/docs/guide")),
            ..Default::default()
        },
        SearchFilter {
            subtree: Some(uri("ctx://acc1/users")),
            ..Default::default()
        },
        SearchFilter {
            subtree: Some(CtxUri::root()),
            ..Default::default()
        },
        SearchFilter {
            parent_uri: Some(uri("ctx://acc1/users/u1/memories/prefs")),
            ..Default::default()
        },
        SearchFilter {
            context_type: Some("skill".into()),
            ..Default::default()
        },
        SearchFilter {
            context_type: Some("memory".into()),
            category: Some("prefs".into()),
            ..Default::default()
        },
        SearchFilter {
            category: Some("nonexistent".into()),
            ..Default::default()
        },
        SearchFilter {
            level: Some(Level::L1),
            ..Default::default()
        },
        SearchFilter {
            owner_spaces: Some(vec!["user:u1".into(), "agent:bot".into()]),
            ..Default::default()
        },
        SearchFilter {
            owner_spaces: Some(vec!["user:nobody".into()]),
            ..Default::default()
        },
        SearchFilter {
            owner_spaces: Some(vec![]),
            ..Default::default()
        },
        SearchFilter {
            account_id: Some("acc2".into()),
            ..Default::default()
        },
        SearchFilter {
            meta: BTreeMap::from([("lang".into(), json!("zh"))]),
            ..Default::default()
        },
        SearchFilter {
            meta: BTreeMap::from([("stars".into(), json!(5))]),
            ..Default::default()
        },
        SearchFilter {
            meta: BTreeMap::from([("stars".into(), json!(5.0))]),
            ..Default::default()
        },
        SearchFilter {
            meta: BTreeMap::from([("pinned".into(), json!(true))]),
            ..Default::default()
        },
        SearchFilter {
            meta: BTreeMap::from([("missing".into(), json!(1))]),
            ..Default::default()
        },
        SearchFilter {
            subtree: Some(uri("ctx://acc1")),
            level: Some(Level::L0),
            owner_spaces: Some(vec!["user:u1".into(), "user:u2".into()]),
            meta: BTreeMap::from([("lang".into(), json!("zh"))]),
            ..Default::default()
        },
    ];
    each_index(|name, idx| {
        let recs = filter_corpus(idx);
        for f in &filters {
            let want: BTreeSet<String> = recs
                .iter()
                .filter(|r| f.matches(&r.record))
                .map(|r| r.record.id.clone())
                .collect();
            for q in [unit(100, DIM), unit(101, DIM)] {
                let got = hit_ids(idx, &q, f, 100);
                assert_eq!(got.len(), want.len(), "{name}: {f:?}");
                assert_eq!(
                    got.into_iter().collect::<BTreeSet<_>>(),
                    want,
                    "{name}: {f:?}"
                );
            }
        }
    });
}

#[test]
fn search_returns_exactly_top_k_under_a_selective_filter() {
    each_index(|name, idx| {
        // 600 records, 30 of which pass (5 %), scattered through the collection.
        let recs: Vec<VectorRecord> = (0..600u64)
            .map(|i| {
                let tag = if i % 20 == 7 { "rare" } else { "common" };
                VectorRecord {
                    record: record(&format!("ctx://t/docs/d{i}"), 0, &[("tag", json!(tag))]),
                    vector: unit(i, DIM),
                }
            })
            .collect();
        idx.upsert(&recs).expect("upsert");
        let f = SearchFilter {
            meta: BTreeMap::from([("tag".into(), json!("rare"))]),
            ..SearchFilter::default()
        };
        for (k, want) in [(1, 1), (10, 10), (30, 30), (50, 30)] {
            for q in 0..5 {
                let hits = idx.search(&unit(1000 + q, DIM), &f, k).expect("search");
                assert_eq!(hits.len(), want, "{name}: top_k {k}");
                assert!(hits.iter().all(|h| f.matches(&h.record)), "{name}");
                assert!(
                    hits.windows(2).all(|w| w[0].score >= w[1].score),
                    "{name}: best first"
                );
            }
        }
        assert!(
            idx.search(&unit(1, DIM), &f, 0).expect("k=0").is_empty(),
            "{name}"
        );
        // The best hit is the exact best among the candidates.
        let q = unit(2000, DIM);
        let hits = idx.search(&q, &f, 5).expect("search");
        let exact = recs
            .iter()
            .filter(|r| f.matches(&r.record))
            .map(|r| {
                let dot: f32 = r.vector.iter().zip(&q).map(|(a, b)| a * b).sum();
                (dot, r.record.id.clone())
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .expect("candidates");
        assert_eq!(hits[0].record.id, exact.1, "{name}");
        assert!((hits[0].score - exact.0).abs() < 1e-4, "{name}");
    });
}

#[test]
fn model_binding_and_dimensions() {
    let m1 = ModelIdentity {
        provider: "local".into(),
        model: "all-MiniLM-L6-v2".into(),
        dimension: DIM,
    };
    let m2 = ModelIdentity {
        provider: "openai".into(),
        model: "text-embedding-3-small".into(),
        dimension: DIM,
    };
    each_index(|name, idx| {
        assert_eq!(idx.model().expect("model"), None, "{name}");
        idx.bind_model(&m1).expect("bind");
        idx.bind_model(&m1).expect("bind again is fine");
        assert_eq!(idx.model().expect("model"), Some(m1.clone()), "{name}");
        let err = idx.bind_model(&m2).expect_err("another model");
        assert!(
            matches!(err, IndexError::SchemaMismatch(_)),
            "{name}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&m1.key()) && msg.contains(&m2.key()),
            "{name}: names both: {msg}"
        );
        assert!(!err.is_retryable(), "{name}");
        assert_eq!(
            idx.model().expect("model"),
            Some(m1.clone()),
            "{name}: binding kept"
        );
        // Vectors of another dimension are refused; nothing is written.
        let err = idx
            .upsert(&[vr("ctx://a/x", 0, unit(1, DIM + 1))])
            .expect_err("dimension");
        assert!(
            matches!(err, IndexError::SchemaMismatch(_)),
            "{name}: {err}"
        );
        let err = idx
            .upsert(&[vr("ctx://a/y", 0, vec![f32::NAN; DIM])])
            .expect_err("NaN");
        assert!(!err.is_retryable(), "{name}: {err}");
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        idx.upsert(&[vr("ctx://a/x", 0, unit(1, DIM))])
            .expect("upsert");
        let err = idx
            .search(&unit(1, DIM - 1), &SearchFilter::default(), 3)
            .expect_err("query dimension");
        assert!(matches!(err, IndexError::InvalidQuery(_)), "{name}: {err}");
        let err = idx
            .search(&[], &SearchFilter::default(), 3)
            .expect_err("empty query");
        assert!(matches!(err, IndexError::InvalidQuery(_)), "{name}: {err}");
        // Clearing forgets records, versions and the binding.
        idx.sync_node(
            &uri("ctx://a/z"),
            3,
            vec![nr("ctx://a/z", 0, Some(unit(2, DIM)))],
        )
        .expect("sync");
        idx.clear().expect("clear");
        assert_eq!(idx.count().expect("count"), 0, "{name}");
        assert_eq!(idx.model().expect("model"), None, "{name}");
        assert!(
            idx.search(&unit(1, DIM), &SearchFilter::default(), 3)
                .expect("search")
                .is_empty()
        );
        assert_eq!(
            idx.sync_node(
                &uri("ctx://a/z"),
                1,
                vec![nr("ctx://a/z", 0, Some(unit(2, DIM)))]
            )
            .expect("sync"),
            SyncOutcome::Applied,
            "{name}: versions were cleared"
        );
        idx.clear().expect("clear");
        let m3 = ModelIdentity {
            dimension: DIM * 2,
            ..m2.clone()
        };
        idx.bind_model(&m3).expect("a new model after clear");
        idx.upsert(&[vr("ctx://a/x", 0, unit(1, DIM * 2))])
            .expect("new dimension");
        assert_eq!(
            idx.search(&unit(1, DIM * 2), &SearchFilter::default(), 1)
                .expect("search")
                .len(),
            1
        );
    });
}

#[test]
fn unbound_index_takes_the_first_dimension() {
    each_index(|name, idx| {
        assert!(
            idx.search(&unit(1, 5), &SearchFilter::default(), 3)
                .expect("empty index")
                .is_empty(),
            "{name}: an empty unbound index accepts any query"
        );
        idx.upsert(&[vr("ctx://a/x", 0, unit(1, DIM))])
            .expect("upsert");
        let err = idx
            .upsert(&[vr("ctx://a/y", 0, unit(1, DIM + 2))])
            .expect_err("dimension");
        assert!(
            matches!(err, IndexError::SchemaMismatch(_)),
            "{name}: {err}"
        );
        let bad = ModelIdentity {
            provider: "hash".into(),
            model: "h".into(),
            dimension: DIM + 2,
        };
        let err = idx
            .bind_model(&bad)
            .expect_err("model of another dimension");
        assert!(
            matches!(err, IndexError::SchemaMismatch(_)),
            "{name}: {err}"
        );
    });
}

// The pgvector index alone: one database shared by several openers.

fn pg_model(model: &str, dimension: usize) -> ModelIdentity {
    ModelIdentity {
        provider: "local".into(),
        model: model.into(),
        dimension,
    }
}

/// The HNSW index's definition and the embedding column's type, read from the catalog.
fn pg_schema(url: &str) -> (Option<String>, String) {
    let mut c = ce_testkit::pg::connect(url);
    let index = c
        .query_opt(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'ce_vector_records_hnsw'",
            &[],
        )
        .expect("pg_indexes")
        .map(|r| r.get(0));
    let column = c
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = 'ce_vector_records'::regclass AND attname = 'embedding'",
            &[],
        )
        .expect("pg_attribute")
        .get(0);
    (index, column)
}

#[test]
fn pgvector_state_survives_reopen_and_is_shared_by_every_opener() {
    let db = ce_testkit::pgvector::test_db("pgv_shared");
    let m1 = pg_model("m1", DIM);
    let a = PgVectorIndex::open(db.url()).expect("open a");
    assert_eq!(
        pg_schema(db.url()),
        (None, "vector".into()),
        "untyped until bound"
    );
    a.bind_model(&m1).expect("bind");
    let (hnsw, column) = pg_schema(db.url());
    assert_eq!(
        column,
        format!("vector({DIM})"),
        "bind_model fixes the dimension"
    );
    assert_eq!(hnsw, None, "the graph waits for the end of the bulk load");
    a.finish_bulk().expect("finish bulk");
    let (hnsw, _) = pg_schema(db.url());
    assert!(
        hnsw.as_deref()
            .is_some_and(|d| d.contains("hnsw") && d.contains("vector_cosine_ops")),
        "{hnsw:?}"
    );
    a.upsert(&[
        vr("ctx://a/docs/x", 0, unit(1, DIM)),
        vr("ctx://a/docs/y", 1, unit(2, DIM)),
    ])
    .expect("upsert");
    let n1 = uri("ctx://a/notes/n1");
    assert_eq!(
        a.sync_node(&n1, 5, vec![nr(n1.as_str(), 0, Some(unit(3, DIM)))])
            .expect("sync"),
        SyncOutcome::Applied
    );

    // Another process: a second index on the same database sees the binding and the records.
    let b = PgVectorIndex::open(db.url()).expect("open b");
    assert_eq!(b.model().expect("model"), Some(m1.clone()));
    let err = b
        .bind_model(&pg_model("m2", DIM))
        .expect_err("another model");
    assert!(matches!(err, IndexError::SchemaMismatch(_)), "{err}");
    assert_eq!(snapshot(&b), snapshot(&a));
    let q = unit(3, DIM);
    assert_eq!(
        hit_ids(&b, &q, &SearchFilter::default(), 3),
        hit_ids(&a, &q, &SearchFilter::default(), 3)
    );
    // The versions are shared too (VX1 across openers).
    assert_eq!(
        b.sync_node(&n1, 4, vec![nr(n1.as_str(), 2, Some(unit(4, DIM)))])
            .expect("older"),
        SyncOutcome::Stale
    );
    assert_eq!(
        b.sync_node(&n1, 6, vec![nr(n1.as_str(), 1, Some(unit(4, DIM)))])
            .expect("newer"),
        SyncOutcome::Applied
    );
    assert_eq!(ids(&a, n1.as_str()), [format!("{n1}#1")]);
    let before = snapshot(&a);
    drop((a, b));

    // Reopened: the binding, the records and the versions are still there.
    let c = PgVectorIndex::open(db.url()).expect("reopen");
    assert_eq!(c.model().expect("model"), Some(m1.clone()));
    c.bind_model(&m1).expect("the same model binds again");
    assert_eq!(snapshot(&c), before);
    assert_eq!(
        c.remove_node(&n1, 5).expect("older removal"),
        SyncOutcome::Stale
    );
    let x = [uri("ctx://a/docs/x")];
    let want = StoredVector {
        id: stable_hash("ctx://a/docs/x", 0),
        text_hash: None,
        vector: kept(&unit(1, DIM)),
    };
    assert_eq!(c.vectors(&x).expect("vectors"), [want]);

    // One opener clears and binds a model of another dimension: the other keeps working
    // (its prepared statements outlive the column's change of type).
    let d = PgVectorIndex::open(db.url()).expect("open d");
    d.clear().expect("clear");
    assert_eq!(c.model().expect("model"), None);
    let m3 = pg_model("m3", DIM * 2);
    d.bind_model(&m3).expect("bind m3");
    assert_eq!(pg_schema(db.url()).1, format!("vector({})", DIM * 2));
    c.upsert(&[vr("ctx://a/docs/z", 0, unit(5, DIM * 2))])
        .expect("upsert after rebind");
    let z = [uri("ctx://a/docs/z")];
    let want = StoredVector {
        id: stable_hash("ctx://a/docs/z", 0),
        text_hash: None,
        vector: kept(&unit(5, DIM * 2)),
    };
    assert_eq!(c.vectors(&z).expect("vectors"), [want]);
    let hits = c
        .search(&unit(5, DIM * 2), &SearchFilter::default(), 3)
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert!(hits[0].score > 0.999, "{}", hits[0].score);
    let err = c
        .upsert(&[vr("ctx://a/docs/w", 0, unit(5, DIM))])
        .expect_err("old dimension");
    assert!(matches!(err, IndexError::SchemaMismatch(_)), "{err}");
    drop((c, d));
}

#[test]
fn pgvector_concurrent_openers_and_writers_converge_on_the_newest_versions() {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let seed = ce_testkit::seed("pgvector_concurrent_writers");
    let db = ce_testkit::pgvector::test_db("pgv_concurrent");
    const NODES: u64 = 6;
    const VERSIONS: u64 = 10;
    let node = |n: u64| format!("ctx://a/notes/n{n}");
    // Version v of node n: levels 0..=v%3 (v % 4 == 0: a removal).
    let write = move |n: u64, v: u64| {
        let u = node(n);
        if v.is_multiple_of(4) {
            NodeWrite::Remove {
                uri: uri(&u),
                version: v,
            }
        } else {
            NodeWrite::Sync {
                uri: uri(&u),
                version: v,
                records: (0..=(v % 3) as u8)
                    .map(|l| nr(&u, l, Some(unit(n * 100 + v * 10 + u64::from(l), DIM))))
                    .collect(),
            }
        }
    };
    // Every thread opens the (new, unbound) index itself and applies every version of every
    // node in its own order, in batches: the schema setup, the first writes (which fix the
    // dimension) and the versioned writes all race.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let url = db.url().to_owned();
            std::thread::spawn(move || {
                let idx = PgVectorIndex::open(&url).expect("open");
                let mut all: Vec<(u64, u64)> = (0..NODES)
                    .flat_map(|n| (1..=VERSIONS).map(move |v| (n, v)))
                    .collect();
                all.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ t));
                for chunk in all.chunks(5) {
                    let out = idx
                        .write_nodes(&chunk.iter().map(|&(n, v)| write(n, v)).collect::<Vec<_>>())
                        .expect("write_nodes");
                    for r in out {
                        r.expect("each write");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    let oracle = MemoryVectorIndex::new();
    for n in 0..NODES {
        write(n, VERSIONS).apply_to(&oracle).expect("oracle");
    }
    let idx = PgVectorIndex::open(db.url()).expect("open");
    assert_eq!(
        snapshot(&idx),
        snapshot(&oracle),
        "the newest version of every node (seed {seed})"
    );
    drop(idx);
}

#[test]
fn pgvector_recovers_from_killed_connections() {
    let (db, idx) = pgvector("pgv_killed", PgVectorOptions::default());
    idx.upsert(&[
        vr("ctx://a/docs/x", 0, unit(1, DIM)),
        vr("ctx://a/docs/y", 0, unit(2, DIM)),
    ])
    .expect("upsert");
    let q = unit(1, DIM);
    let before = hit_ids(&idx, &q, &SearchFilter::default(), 2);
    assert!(
        db.terminate_connections() >= 1,
        "the pool holds a connection"
    );
    // The pooled connection is dead: the next call replaces it before sending anything.
    assert_eq!(hit_ids(&idx, &q, &SearchFilter::default(), 2), before);
    assert!(db.terminate_connections() >= 1);
    let n = uri("ctx://a/notes/n");
    assert_eq!(
        idx.sync_node(&n, 1, vec![nr(n.as_str(), 0, Some(unit(3, DIM)))])
            .expect("sync after a kill"),
        SyncOutcome::Applied
    );
    assert_eq!(idx.count().expect("count"), 3);
    // A server that cannot be reached is a retryable error.
    let err =
        PgVectorIndex::open("postgresql://postgres@%2Fnonexistent%2Fdir/x").expect_err("no server");
    assert!(err.is_retryable(), "{err}");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    let err = PgVectorIndex::open("postgresql://host:notaport/x").expect_err("bad url");
    assert_eq!(err.code(), ErrorCode::InvalidConfig, "{err}");
    drop((idx, db));
}

#[test]
fn pgvector_open_refuses_a_server_without_the_extension() {
    // The machine's PostgreSQL (of the scale backend's tests) has no pgvector.
    let db = ce_testkit::pg::TestDb::create("pgv_no_extension");
    let err = PgVectorIndex::open(db.url()).expect_err("no pgvector");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("install pgvector"), "{err}");
}

#[test]
fn pgvector_graph_searches_fall_back_to_an_exact_scan_when_short() {
    use ce_index::vector::embedded::{SearchPlan, SearchStrategy};
    // 600 records, 30 of which pass; a graph search visiting only 10 candidates finds few of
    // them, so the search completes with an exact scan.
    let options = PgVectorOptions {
        exact_max_candidates: 0,
        ef_search: 10,
        defer_graph: false,
        ..PgVectorOptions::default()
    };
    let (db, idx) = pgvector("pgv_fallback", options);
    let recs: Vec<VectorRecord> = (0..600u64)
        .map(|i| {
            let tag = if i % 20 == 7 { "rare" } else { "common" };
            VectorRecord {
                record: record(&format!("ctx://t/docs/d{i}"), 0, &[("tag", json!(tag))]),
                vector: unit(i, DIM),
            }
        })
        .collect();
    idx.upsert(&recs).expect("upsert");
    let rare = SearchFilter {
        meta: BTreeMap::from([("tag".into(), json!("rare"))]),
        ..SearchFilter::default()
    };
    let mut plans = BTreeSet::new();
    for q in 0..10 {
        let r = idx
            .search_with(&unit(1000 + q, DIM), &rare, 10, SearchStrategy::Auto)
            .expect("search");
        assert_eq!(r.hits.len(), 10);
        assert!(r.hits.iter().all(|h| rare.matches(&h.record)));
        plans.insert(format!("{:?}", r.plan));
        let exact = idx
            .search_with(&unit(1000 + q, DIM), &rare, 10, SearchStrategy::Exact)
            .expect("exact");
        assert_eq!(exact.plan, SearchPlan::Exact);
        if r.plan == SearchPlan::AnnThenExact {
            assert_eq!(r.hits, exact.hits, "the fallback is the exact scan");
        }
    }
    assert!(plans.contains("AnnThenExact"), "{plans:?}");
    // Unfiltered, the graph is enough.
    let r = unfiltered_top10(&idx);
    assert_eq!((r.plan, r.hits.len()), (SearchPlan::Ann, 10));
    assert_eq!(
        r.candidates, 11,
        "counted (up to top_k + 1): never analyzed"
    );
    // Once the statistics say the table is large, an unfiltered search skips the count…
    ce_testkit::pg::connect(db.url())
        .batch_execute("ANALYZE ce_vector_records")
        .expect("analyze");
    let r = unfiltered_top10(&idx);
    assert_eq!(
        (r.plan, r.hits.len(), r.candidates),
        (SearchPlan::Ann, 10, 10)
    );
    // …and counts when the graph comes up short (the statistics are stale: 5 records left,
    // among the graph's 600 dead entries, which also make it miss some of them).
    idx.delete_by_uri(&uri("ctx://t/docs"), true)
        .expect("delete");
    idx.upsert(&recs[..5]).expect("upsert");
    let r = unfiltered_top10(&idx);
    assert_eq!((r.hits.len(), r.candidates), (5, 5), "{:?}", r.plan);
    drop((idx, db));
}

/// The 10 nearest records to `unit(5, DIM)`, unfiltered, with the plan the index chose.
fn unfiltered_top10(idx: &PgVectorIndex) -> ce_index::vector::embedded::SearchReport {
    idx.search_with(
        &unit(5, DIM),
        &SearchFilter::default(),
        10,
        ce_index::vector::embedded::SearchStrategy::Auto,
    )
    .expect("search")
}

/// The state a versioned write leaves that a snapshot does not show: the seen versions.
fn pg_seen_versions(url: &str) -> Vec<(String, i64, bool)> {
    ce_testkit::pg::connect(url)
        .query(
            "SELECT uri, version, deleted FROM ce_vector_uri_versions ORDER BY uri",
            &[],
        )
        .expect("ce_vector_uri_versions")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Every stored record with its vector, in (uri, level) order.
fn with_vectors(idx: &dyn VectorIndex) -> Vec<(String, u64, Vec<f32>)> {
    snapshot(idx)
        .into_iter()
        .map(|s| {
            let v: Vec<StoredVector> = idx
                .vectors(std::slice::from_ref(&s.record.uri))
                .expect("vectors")
                .into_iter()
                .filter(|v| v.id == s.record.id)
                .collect();
            assert_eq!(v.len(), 1, "{} has a vector", s.record.id);
            (
                serde_json::to_string(&s.record).expect("record json"),
                s.node_version,
                v.into_iter().next().expect("one").vector,
            )
        })
        .collect()
}

fn outcomes(out: Vec<ce_index::Result<SyncOutcome>>) -> Vec<String> {
    out.into_iter()
        .map(|r| match r {
            Ok(o) => format!("{o:?}"),
            Err(e) => format!("error: {e}"),
        })
        .collect()
}

/// A random versioned write on a few nodes (so a batch repeats URIs and ids): syncs with new
/// or kept vectors (kept ones may have nothing to keep), a vector of the wrong dimension or a
/// record of another node now and then, removals and purges. (One id twice within one node's
/// records, which the worker never writes, is left out: there the in-memory oracle keeps the
/// vector stored before the write, the PostgreSQL index the one written just before.)
fn random_write(rng: &mut impl rand::Rng) -> NodeWrite {
    let node = |n: u64| format!("ctx://a/notes/n{n}");
    let u = node(rng.random_range(0..4));
    let version = rng.random_range(1..12);
    match rng.random_range(0..20) {
        0..12 => {
            let mut records = Vec::new();
            for level in 0..3u8 {
                if rng.random_bool(0.6) {
                    let vector = match rng.random_range(0..20) {
                        0 => Some(unit(rng.random(), DIM + 1)),
                        1..6 => None,
                        _ => Some(unit(rng.random_range(0..1000), DIM)),
                    };
                    records.push(nr(&u, level, vector));
                }
            }
            if rng.random_bool(0.05) {
                records.push(nr(&node(9), 0, Some(unit(1, DIM))));
            }
            NodeWrite::Sync {
                uri: uri(&u),
                version,
                records,
            }
        }
        12..17 => NodeWrite::Remove {
            uri: uri(&u),
            version,
        },
        _ => NodeWrite::Purge { uri: uri(&u) },
    }
}

#[test]
fn pgvector_batched_writes_leave_the_state_of_per_node_writes() {
    use rand::SeedableRng;
    let seed = ce_testkit::seed("pgvector_batched_writes");
    let batches: usize = std::env::var("CE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let (db_batched, batched) = pgvector("pgv_batched", PgVectorOptions::default());
    let (db_single, single) = pgvector("pgv_single", PgVectorOptions::default());
    let oracle = MemoryVectorIndex::new();
    let m = pg_model("m", DIM);
    for idx in [&batched as &dyn VectorIndex, &single, &oracle] {
        idx.bind_model(&m).expect("bind");
    }
    // Errors are compared by message with the per-node path, by kind with the oracle (whose
    // messages may differ).
    let kinds = |o: &[String]| -> Vec<String> {
        o.iter()
            .map(|s| {
                if s.starts_with("error") {
                    "error".to_owned()
                } else {
                    s.clone()
                }
            })
            .collect()
    };
    let check = |step: &str, writes: Vec<NodeWrite>| {
        let want = outcomes(writes.iter().map(|w| w.apply_to(&oracle)).collect());
        let per_node = outcomes(writes.iter().map(|w| w.apply_to(&single)).collect());
        let got = outcomes(batched.write_nodes(&writes).expect("write_nodes"));
        assert_eq!(
            got, per_node,
            "{step} (seed {seed}): outcomes of {writes:#?}"
        );
        assert_eq!(
            kinds(&got),
            kinds(&want),
            "{step} (seed {seed}): oracle outcomes"
        );
        let state = with_vectors(&batched);
        assert_eq!(
            state,
            with_vectors(&oracle),
            "{step} (seed {seed}): records"
        );
        assert_eq!(
            state,
            with_vectors(&single),
            "{step} (seed {seed}): records"
        );
        assert_eq!(
            pg_seen_versions(db_batched.url()),
            pg_seen_versions(db_single.url()),
            "{step} (seed {seed}): seen versions"
        );
    };
    // Fixed first: inserts, then in one batch updates of a node written earlier in the batch
    // (the same id written four times), payload-only rewrites of a stored vector and of
    // vectors written earlier in the batch,
    // a stale write, a removal and a recreation.
    let (a, b) = ("ctx://a/notes/n0", "ctx://a/notes/n1");
    check(
        "inserts",
        vec![
            NodeWrite::Sync {
                uri: uri(a),
                version: 1,
                records: vec![nr(a, 0, Some(unit(1, DIM))), nr(a, 1, Some(unit(2, DIM)))],
            },
            NodeWrite::Sync {
                uri: uri(b),
                version: 3,
                records: vec![nr(b, 0, Some(unit(3, DIM)))],
            },
        ],
    );
    check(
        "mixed",
        vec![
            NodeWrite::Sync {
                uri: uri(a),
                version: 2,
                records: vec![nr(a, 0, None), nr(a, 2, Some(unit(4, DIM)))],
            },
            NodeWrite::Sync {
                uri: uri(a),
                version: 3,
                records: vec![nr(a, 2, None)],
            },
            NodeWrite::Sync {
                uri: uri(a),
                version: 4,
                records: vec![nr(a, 2, Some(unit(5, DIM)))],
            },
            NodeWrite::Sync {
                uri: uri(a),
                version: 5,
                records: vec![nr(a, 2, None)],
            },
            NodeWrite::Sync {
                uri: uri(b),
                version: 2,
                records: vec![nr(b, 1, Some(unit(6, DIM)))],
            },
            NodeWrite::Remove {
                uri: uri(b),
                version: 3,
            },
            NodeWrite::Sync {
                uri: uri(b),
                version: 3,
                records: vec![nr(b, 0, Some(unit(7, DIM)))],
            },
            NodeWrite::Sync {
                uri: uri(b),
                version: 4,
                records: vec![nr(b, 1, Some(unit(8, DIM)))],
            },
            // Nothing to keep for level 0: this write fails alone.
            NodeWrite::Sync {
                uri: uri(b),
                version: 5,
                records: vec![nr(b, 0, None), nr(b, 1, None)],
            },
        ],
    );
    assert_eq!(ids(&batched, a), [format!("{a}#2")]);
    assert_eq!(ids(&batched, b), [format!("{b}#1")]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for i in 0..batches {
        let n = rand::Rng::random_range(&mut rng, 1..10);
        let writes = (0..n).map(|_| random_write(&mut rng)).collect();
        check(&format!("batch {i}"), writes);
    }
    drop((batched, single, db_batched, db_single));
}

#[test]
fn pgvector_bulk_load_scans_exactly_until_finish_bulk_builds_the_graph() {
    use ce_index::vector::embedded::{SearchPlan, SearchStrategy};
    // Every non-empty search would go to the graph if there were one.
    let options = PgVectorOptions {
        exact_max_candidates: 0,
        ..PgVectorOptions::default()
    };
    let (db, idx) = pgvector("pgv_bulk", options.clone());
    let m = pg_model("m", DIM);
    idx.bind_model(&m).expect("bind");
    let node = |i: u64| format!("ctx://a/docs/d{i}");
    let load = |idx: &PgVectorIndex, from: u64, to: u64| {
        let out = idx
            .write_nodes(
                &(from..to)
                    .map(|i| NodeWrite::Sync {
                        uri: uri(&node(i)),
                        version: 1,
                        records: vec![nr(&node(i), 0, Some(unit(i, DIM)))],
                    })
                    .collect::<Vec<_>>(),
            )
            .expect("write_nodes");
        assert!(out.iter().all(|o| matches!(o, Ok(SyncOutcome::Applied))));
    };
    load(&idx, 0, 300);
    assert_eq!(pg_schema(db.url()).0, None, "no graph during the load");
    for q in 0..5 {
        let exact = idx
            .search_with(
                &unit(1000 + q, DIM),
                &SearchFilter::default(),
                10,
                SearchStrategy::Exact,
            )
            .expect("exact");
        for strategy in [SearchStrategy::Auto, SearchStrategy::Ann] {
            let r = idx
                .search_with(&unit(1000 + q, DIM), &SearchFilter::default(), 10, strategy)
                .expect("search");
            assert_eq!(r.plan, SearchPlan::Exact, "{strategy:?} without a graph");
            assert_eq!(r.hits, exact.hits);
        }
    }
    idx.finish_bulk().expect("finish bulk");
    let (hnsw, _) = pg_schema(db.url());
    assert!(
        hnsw.as_deref().is_some_and(|d| d.contains("hnsw")),
        "{hnsw:?}"
    );
    let r = unfiltered_top10(&idx);
    assert_eq!((r.plan, r.hits.len()), (SearchPlan::Ann, 10));
    idx.finish_bulk().expect("nothing left to build");
    // Writes after the load go through the graph as they come.
    load(&idx, 300, 310);
    assert_eq!(idx.count().expect("count"), 310);

    // A rebuild by another opener drops the graph; the writer that loads the index again
    // builds it at the end of its load.
    let other = PgVectorIndex::open_with(db.url(), options).expect("open other");
    other.clear().expect("clear");
    other.bind_model(&m).expect("bind");
    assert_eq!(pg_schema(db.url()).0, None, "no graph after clear");
    load(&idx, 0, 50);
    let r = unfiltered_top10(&idx);
    assert_eq!((r.plan, r.hits.len()), (SearchPlan::Exact, 10));
    idx.finish_bulk().expect("finish bulk");
    assert!(pg_schema(db.url()).0.is_some(), "rebuilt");
    drop((idx, other, db));
}
