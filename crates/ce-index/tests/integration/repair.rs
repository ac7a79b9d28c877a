//! Reconcile (spec §8.3.2 `repair_reconcile_index`): three indexes brought out of step with
//! the source by writing to them directly (and by acknowledging a move without applying it)
//! report exactly their missing, orphan and stale records; once the repair events drain,
//! each index equals the projection of the source (the convergence suite's oracle) and a
//! second reconcile finds nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use ce_core::{CtxUri, IndexProjector, RelationIndexRecord};
use ce_embed::Embedder as _;
use ce_embed::hash::HashEmbedder;
use ce_index::keyword::KeywordIndex;
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::relation::memory::MemoryRelationIndex;
use ce_index::relation::{RelationIndex, RelationRecord};
use ce_index::repair::{Finding, IndexView, Reconciler, Reconciliation};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeRecord, VectorIndex};
use ce_index::worker::IndexWorker;
use ce_index::worker::target::{KeywordTarget, VectorTarget};
use ce_store::{LinkRequest, PutRequest};

use crate::common::{Env, record, unit, uri, worker_config};
use crate::convergence::{diff, expected_records, records_of};
use crate::relation::expected_edges;

const DIM: usize = 16;

struct Fixture {
    env: Env,
    vector: Arc<MemoryVectorIndex>,
    keyword: Arc<MemoryKeywordIndex>,
    relations: Arc<MemoryRelationIndex>,
    workers: Vec<IndexWorker>,
    embedder: HashEmbedder,
}

impl Fixture {
    fn new() -> Self {
        let env = Env::new(&["vector", "keyword", "relation"], |_| {});
        let vector = Arc::new(MemoryVectorIndex::new());
        let keyword = Arc::new(MemoryKeywordIndex::new());
        let relations = Arc::new(MemoryRelationIndex::new());
        let p = IndexProjector::default;
        let workers = vec![
            IndexWorker::for_target(
                worker_config("v", "vector"),
                env.store.clone(),
                Arc::new(VectorTarget(vector.clone())),
                Some(Arc::new(HashEmbedder::new(DIM))),
                p(),
            )
            .expect("vector worker"),
            IndexWorker::for_target(
                worker_config("k", "keyword"),
                env.store.clone(),
                Arc::new(KeywordTarget(keyword.clone())),
                None,
                p(),
            )
            .expect("keyword worker"),
            IndexWorker::for_relations(
                worker_config("r", "relation"),
                env.store.clone(),
                relations.clone(),
            )
            .expect("relation worker"),
        ];
        Fixture {
            env,
            vector,
            keyword,
            relations,
            workers,
            embedder: HashEmbedder::new(DIM),
        }
    }

    /// Runs every worker until no delivery is open.
    fn drain(&self) {
        for _ in 0..1_000 {
            let claimed: usize = self
                .workers
                .iter()
                .map(|w| w.run_once(64).expect("run_once").claimed)
                .sum();
            if claimed == 0 {
                if self.env.open_deliveries(None) == 0 {
                    return;
                }
                self.env.clock.advance(31_000);
            }
        }
        panic!("outbox did not drain: {:?}", self.env.store.stats());
    }

    fn put(&self, u: &str, text: &str) {
        let req = PutRequest {
            abstract_text: Some(format!("{text} abstract")),
            content: Some(format!("{text} content")),
            ..PutRequest::default()
        };
        self.env.store.put(&uri(u), req).expect("put");
    }

    fn link(&self, from: &str, to: &str, t: &str) {
        self.env
            .store
            .link(LinkRequest {
                from: uri(from),
                to: uri(to),
                relation_type: t.into(),
                weight: 1.0,
                reason: String::new(),
                trace_id: None,
            })
            .expect("link");
    }

    fn reconcile(&self, scope: &str) -> BTreeMap<&'static str, Reconciliation> {
        let projector = IndexProjector::default();
        let mut r = Reconciler::new(self.env.store.as_ref(), &projector, &uri(scope), "t-repair")
            .expect("read source");
        let model = self.embedder.identity().clone();
        let views = [
            (
                "vector",
                IndexView::Vector {
                    index: self.vector.as_ref(),
                    model: Some(&model),
                },
            ),
            ("keyword", IndexView::Keyword(self.keyword.as_ref())),
            ("relation", IndexView::Relations(self.relations.as_ref())),
        ];
        views
            .into_iter()
            .map(|(c, v)| (c, r.reconcile(c, v).expect("reconcile")))
            .collect()
    }

    /// Every index equals the projection of the source.
    fn assert_converged(&self, phase: &str) {
        let want = expected_records(&self.env);
        for (name, got) in [
            ("vector", records_of(&VectorTarget(self.vector.clone()))),
            ("keyword", records_of(&KeywordTarget(self.keyword.clone()))),
        ] {
            let (missing, extra, stale) = diff(&want, &got);
            assert!(
                missing.is_empty() && extra.is_empty() && stale.is_empty(),
                "{phase}, {name}: missing {missing:?} extra {extra:?} stale {stale:?}"
            );
        }
        assert_eq!(
            self.relations.list_under(&CtxUri::root()).expect("edges"),
            expected_edges(&self.env.store),
            "{phase}: relation"
        );
    }
}

fn finding(records: u64, samples: &[&str]) -> Finding {
    Finding {
        records,
        uris: samples.len() as u64,
        samples: samples.iter().map(|s| uri(s)).collect(),
    }
}

/// `(event type, uri)` of each event.
fn events(r: &Reconciliation) -> Vec<(String, String)> {
    r.events
        .iter()
        .map(|e| {
            (
                e.payload.event_type().as_str().to_owned(),
                e.payload.uri().to_string(),
            )
        })
        .collect()
}

fn ev(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(t, u)| ((*t).to_owned(), (*u).to_owned()))
        .collect()
}

const A: &str = "ctx://acc/docs/a";
const B: &str = "ctx://acc/docs/b";
const C: &str = "ctx://acc/docs/c";
const D: &str = "ctx://acc/docs/d";
const E: &str = "ctx://acc/docs/e";
const E2: &str = "ctx://acc/docs/e2";
const GHOST: &str = "ctx://acc/docs/ghost";
const OUTSIDE: &str = "ctx://acc/other/x";

#[test]
fn reconcile_reports_missing_orphan_and_stale_exactly_and_its_events_converge() {
    let f = Fixture::new();
    for (u, t) in [
        (A, "alpha"),
        (B, "bravo"),
        (C, "charlie"),
        (D, "delta"),
        (E, "echo"),
    ] {
        f.put(u, t);
    }
    f.link(A, B, "cites");
    f.link(A, C, "rel");
    f.link(C, D, "rel");
    f.drain();
    let clean = f.reconcile("ctx://");
    for (c, r) in &clean {
        assert!(r.findings.is_clean(), "{c}: {:?}", r.findings);
        assert!(r.events.is_empty(), "{c}");
    }
    assert_eq!(clean["vector"].findings.index_records, 15);
    assert_eq!(clean["relation"].findings.index_records, 3);

    // A move the vector consumer acknowledges without applying (as a forced done would):
    // the vector index keeps e's records (orphans at their old URI) and lacks e2's.
    f.env.store.mv(&uri(E), &uri(E2), None).expect("mv");
    let claimed = f
        .env
        .store
        .claim_batch("vector", "lost", 64)
        .expect("claim");
    assert!(!claimed.is_empty());
    for c in &claimed {
        f.env
            .store
            .mark_done(&c.claim)
            .expect("ack without applying");
    }
    f.drain();

    // Vector: a's records lost; a ghost record; b's L0 text changed behind the worker's back.
    f.vector.delete_by_uri(&uri(A), false).expect("lose a");
    let ghost = NodeRecord {
        record: record(GHOST, 0, &[]),
        vector: Some(unit(7, DIM)),
    };
    f.vector
        .sync_node(&uri(GHOST), 1, vec![ghost])
        .expect("ghost");
    let b_node = f.env.store.read_node(&uri(B)).expect("read").expect("b");
    let mut b_records = IndexProjector::default()
        .build_context_records(&b_node)
        .records;
    b_records[0].text.push_str(" tampered");
    let b_records = b_records
        .into_iter()
        .map(|record| NodeRecord {
            record,
            vector: None,
        })
        .collect();
    f.vector
        .sync_node(&uri(B), b_node.version, b_records)
        .expect("tamper b");

    // Keyword: d's records lost; an orphan outside ctx://acc/docs; c's L2 text changed.
    f.keyword.delete_by_uri(&uri(D), false).expect("lose d");
    let c_node = f.env.store.read_node(&uri(C)).expect("read").expect("c");
    let mut c_records = IndexProjector::default()
        .build_context_records(&c_node)
        .records;
    let last = c_records.len() - 1;
    c_records[last].text = "something else".into();
    let outside = record(OUTSIDE, 2, &[]);
    let writes = vec![
        crate::keyword::sync(C, c_node.version, c_records),
        crate::keyword::sync(OUTSIDE, 1, vec![outside]),
    ];
    for r in f.keyword.write_nodes(&writes).expect("write") {
        r.expect("applied");
    }

    // Relations: c's edge lost; an edge d → a the source never had; a → b reweighted.
    f.relations
        .delete_relations_by_uri(&uri(C), false)
        .expect("lose c's edges");
    let edge = |from: &str, to: &str, t: &str, weight: f64| RelationRecord {
        record: RelationIndexRecord {
            id: ce_core::projector::relation_id(&uri(from), &uri(to), t),
            from_uri: uri(from),
            to_uri: uri(to),
            relation_type: t.into(),
            weight,
            reason: String::new(),
            account_id: "acc".into(),
            owner_space: "shared".into(),
        },
        relation_version: 1,
    };
    let a_rel = f.env.store.read_node(&uri(A)).expect("read").expect("a");
    let mut reweighted = edge(A, B, "cites", 0.5);
    reweighted.relation_version = a_rel.relation_version;
    f.relations
        .upsert_relations(&[edge(D, A, "rel", 1.0), reweighted])
        .expect("tamper relations");

    // The whole store.
    let found = f.reconcile("ctx://");
    let v = &found["vector"].findings;
    assert_eq!(v.missing, finding(6, &[A, E2]), "{v:?}");
    assert_eq!(v.orphan, finding(4, &[E, GHOST]), "{v:?}");
    assert_eq!(v.stale, finding(1, &[B]), "{v:?}");
    assert_eq!((v.source_records, v.index_records), (15, 13));
    assert_eq!(v.model_mismatch, None);
    assert_eq!(
        events(&found["vector"]),
        ev(&[
            ("UPSERT_CONTEXT", A),
            ("UPSERT_CONTEXT", B),
            ("UPSERT_CONTEXT", E2),
            ("DELETE_CONTEXT", E),
            ("DELETE_CONTEXT", GHOST),
        ])
    );
    let k = &found["keyword"].findings;
    assert_eq!(k.missing, finding(3, &[D]), "{k:?}");
    assert_eq!(k.orphan, finding(1, &[OUTSIDE]), "{k:?}");
    assert_eq!(k.stale, finding(1, &[C]), "{k:?}");
    assert_eq!(
        events(&found["keyword"]),
        ev(&[
            ("UPSERT_CONTEXT", C),
            ("UPSERT_CONTEXT", D),
            ("DELETE_CONTEXT", OUTSIDE),
        ])
    );
    let r = &found["relation"].findings;
    assert_eq!(r.missing, finding(1, &[C]), "{r:?}");
    assert_eq!(r.orphan, finding(1, &[D]), "{r:?}");
    assert_eq!(r.stale, finding(1, &[A]), "{r:?}");
    assert_eq!((r.source_records, r.index_records), (3, 3));
    assert_eq!(
        events(&found["relation"]),
        ev(&[
            ("UPSERT_RELATION", A),
            ("UPSERT_RELATION", C),
            ("UPSERT_RELATION", D),
        ])
    );
    // Every repair event is an UPSERT_CONTEXT of reason `repair` or a plain delete.
    for e in &found["vector"].events {
        let json = serde_json::to_value(&e.payload).expect("json");
        assert_eq!(json["trace_id"], "t-repair");
        if let ce_core::EventPayload::UpsertContext(p) = &e.payload {
            assert_eq!(p.reason, ce_core::UpsertReason::Repair);
        }
    }

    // A subtree sees only its part: the keyword orphan outside it is not reported.
    let docs = f.reconcile("ctx://acc/docs");
    assert_eq!(docs["keyword"].findings.orphan, Finding::default());
    assert_eq!(docs["keyword"].findings.missing, finding(3, &[D]));
    assert_eq!(docs["vector"].findings.orphan, finding(4, &[E, GHOST]));

    // Repair: each consumer's events for it alone, then the workers.
    for (consumer, r) in &found {
        let n = f
            .env
            .store
            .append_batch_for(&[(*consumer).to_owned()], r.events.clone())
            .expect("append");
        assert_eq!(n.len(), r.events.len());
    }
    f.drain();
    assert!(f.env.dead().is_empty(), "{:?}", f.env.dead());
    f.assert_converged("after the repair");
    for (c, r) in f.reconcile("ctx://") {
        assert!(
            r.findings.is_clean(),
            "{c} after the repair: {:?}",
            r.findings
        );
        assert!(r.events.is_empty(), "{c}");
    }
}

#[test]
fn a_vector_index_of_another_model_is_all_stale_and_gets_no_events() {
    let f = Fixture::new();
    f.put(A, "alpha");
    f.drain();
    let projector = IndexProjector::default();
    let mut r =
        Reconciler::new(f.env.store.as_ref(), &projector, &CtxUri::root(), "t").expect("read");
    let other = HashEmbedder::new(DIM * 2).identity().clone();
    let view = IndexView::Vector {
        index: f.vector.as_ref(),
        model: Some(&other),
    };
    let got = r.reconcile("vector", view).expect("reconcile");
    assert_eq!(got.findings.stale, finding(3, &[A]));
    let why = got.findings.model_mismatch.expect("mismatch reported");
    assert!(why.contains("ce reindex --consumer vector"), "{why}");
    assert!(got.events.is_empty());
    // Without a model to check against, the same index is clean.
    let view = IndexView::Vector {
        index: f.vector.as_ref(),
        model: None,
    };
    assert!(
        r.reconcile("vector", view)
            .expect("reconcile")
            .findings
            .is_clean()
    );
}

#[test]
fn orphan_deletes_go_through_the_delete_safety_check() {
    let f = Fixture::new();
    for i in 0..10 {
        f.put(&format!("ctx://acc/n{i}"), &format!("node {i}"));
    }
    f.drain();
    // 30 records (3 levels per node); the source loses 9 of them (3 nodes) and the vector
    // index never hears of it (its deliveries acknowledged without being applied).
    let removed: Vec<CtxUri> = (0..3).map(|i| uri(&format!("ctx://acc/n{i}"))).collect();
    for u in &removed {
        f.env.store.rm(u, false, None, None).expect("rm");
    }
    let claimed = f
        .env
        .store
        .claim_batch("vector", "lost", 64)
        .expect("claim");
    for c in &claimed {
        f.env
            .store
            .mark_done(&c.claim)
            .expect("ack without applying");
    }
    let found = f.reconcile("ctx://");
    let v = &found["vector"].findings;
    assert_eq!((v.orphan.records, v.index_records), (9, 30));
    let refused = v.delete_safety().expect_err("9 of 30 is more than 25 %");
    assert_eq!((refused.deletes, refused.scope_size), (9, 30));
    // One node fewer (6 of 30 records) passes.
    let projector = IndexProjector::default();
    f.put("ctx://acc/n0", "node 0 again");
    let mut r =
        Reconciler::new(f.env.store.as_ref(), &projector, &CtxUri::root(), "t").expect("read");
    let view = IndexView::Vector {
        index: f.vector.as_ref(),
        model: None,
    };
    let v = r.reconcile("vector", view).expect("reconcile").findings;
    assert_eq!(v.orphan.records, 6, "{v:?}");
    v.delete_safety().expect("6 of 30 is allowed");
}
