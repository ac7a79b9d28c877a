//! Keyword and hybrid modes against the same fixture as the vector tests.

use ce_core::{Classify as _, ErrorCode};

use super::tests::{Fixture, u, uris};
use super::*;

fn mode(q: &str, m: SearchMode) -> SearchRequest {
    SearchRequest {
        mode: Some(m),
        ..SearchRequest::new(q)
    }
}

fn corpus() -> Fixture {
    let f = Fixture::new();
    f.put(
        "ctx://acc/docs/kafka",
        "Kafka consumer lag runbook.",
        "When consumer lag grows, check the partition rebalance and the fetch size.",
    );
    f.put(
        "ctx://acc/docs/queues",
        "Message queue notes.",
        "Queues decouple producers from consumers; watch lag and retries.",
    );
    f.put(
        "ctx://acc/docs/garden",
        "Tomato garden.",
        "Water tomatoes in the morning; 番茄需要充足的阳光。",
    );
    f.index_all();
    f
}

#[test]
fn keyword_mode_ranks_by_bm25_without_the_embedder() {
    let f = corpus();
    let r = f
        .retriever()
        .search(&mode("rebalance partition", SearchMode::Keyword))
        .expect("search");
    assert_eq!(
        (r.mode.as_str(), r.mode_used),
        ("keyword", SearchMode::Keyword)
    );
    assert_eq!(uris(&r), ["ctx://acc/docs/kafka"]);
    assert!(
        r.model.is_empty(),
        "keyword mode embeds nothing: {}",
        r.model
    );
    assert_eq!(r.timings.embed_ms, 0.0);
    assert!(r.hits[0].score > 0.0);
    // Chinese text is segmented: a word of the sentence finds it.
    let zh = f
        .retriever()
        .search(&mode("阳光", SearchMode::Keyword))
        .expect("search");
    assert_eq!(uris(&zh), ["ctx://acc/docs/garden"]);
}

#[test]
fn hybrid_fuses_the_two_rankings_by_reciprocal_rank() {
    let f = corpus();
    let r = f
        .retriever()
        .search(&mode("consumer lag", SearchMode::Hybrid))
        .expect("search");
    assert_eq!(r.mode_used, SearchMode::Hybrid);
    assert_eq!(r.fusion.as_deref(), Some("rrf k=60, vector×1, keyword×1"));
    let fusion = Fusion::default();
    for h in &r.hits {
        let ranks = h.ranks.expect("hybrid hits carry their ranks");
        let part = |rank: Option<usize>, w: f64| {
            rank.map_or(0.0, |r| w / (f64::from(fusion.rrf_k) + r as f64))
        };
        let expected =
            part(ranks.vector, fusion.vector_weight) + part(ranks.keyword, fusion.keyword_weight);
        assert!((f64::from(h.score) - expected).abs() < 1e-6, "{h:?}");
    }
    let scores: Vec<f32> = r.hits.iter().map(|h| h.score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // Both lag documents match the words; the keyword ranking puts them first.
    let top2: Vec<&str> = uris(&r).into_iter().take(2).collect();
    assert!(top2.contains(&"ctx://acc/docs/kafka"), "{top2:?}");
    assert!(top2.contains(&"ctx://acc/docs/queues"), "{top2:?}");
}

#[test]
fn fusion_weights_decide_which_ranking_counts() {
    let f = corpus();
    let only = |vector_weight: f64, keyword_weight: f64, m: SearchMode| {
        let mut r = f.retriever();
        r.fusion.vector_weight = vector_weight;
        r.fusion.keyword_weight = keyword_weight;
        let hybrid = r
            .search(&mode("tomatoes morning", SearchMode::Hybrid))
            .expect("hybrid");
        let single = r.search(&mode("tomatoes morning", m)).expect("single");
        (
            uris(&hybrid)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
            uris(&single)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        )
    };
    // With one weight at 0 the fused order is that mode's order (nodes only the other mode
    // found follow with score 0, ordered by URI).
    let (hybrid, keyword) = only(0.0, 1.0, SearchMode::Keyword);
    assert_eq!(hybrid[..keyword.len()], keyword[..]);
    let (hybrid, vector) = only(1.0, 0.0, SearchMode::Vector);
    assert_eq!(
        hybrid[..vector.len().min(hybrid.len())],
        vector[..vector.len().min(hybrid.len())]
    );
}

#[test]
fn hybrid_hydrates_both_rankings_and_counts_what_it_drops() {
    let f = corpus();
    // Changed after indexing: every record of it, in both indexes, is now stale.
    f.put(
        "ctx://acc/docs/kafka",
        "Kafka consumer lag runbook, v2.",
        "Rewritten.",
    );
    let r = f
        .retriever()
        .search(&mode("rebalance partition", SearchMode::Hybrid))
        .expect("search");
    assert!(!uris(&r).contains(&"ctx://acc/docs/kafka"), "{r:?}");
    assert!(r.dropped_by_hydration >= 2, "{r:?}");
    f.index_all();
    let r = f
        .retriever()
        .search(&mode("runbook", SearchMode::Keyword))
        .expect("search");
    assert_eq!(uris(&r), ["ctx://acc/docs/kafka"]);
    assert_eq!(r.hits[0].version, 2);
    assert_eq!(r.dropped_by_hydration, 0);
}

#[test]
fn modes_without_their_index_and_bad_modes_are_refused() {
    let f = corpus();
    let mut r = f.retriever();
    r.keyword = None;
    for m in [SearchMode::Keyword, SearchMode::Hybrid] {
        let err = r.search(&mode("lag", m)).expect_err("no keyword index");
        assert_eq!(err.code(), ErrorCode::InvalidField, "{err}");
        assert!(err.to_string().contains("keyword index"), "{err}");
    }
    assert_eq!(
        r.mode(&SearchRequest::new("lag")).expect("auto").used,
        SearchMode::Vector
    );
    r.keyword = Some(f.keyword_side());
    assert_eq!(
        r.mode(&SearchRequest::new("lag")).expect("auto").used,
        SearchMode::Hybrid
    );
    r.vector = None;
    assert_eq!(
        r.mode(&SearchRequest::new("lag")).expect("auto").used,
        SearchMode::Keyword
    );
    let mut req = mode("lag", SearchMode::Keyword);
    req.min_score = Some(0.5);
    let err = r.search(&req).expect_err("min_score in keyword mode");
    assert!(err.to_string().contains("min_score"), "{err}");
    let err = "fuzzy".parse::<SearchMode>().expect_err("bad mode");
    assert!(err.to_string().contains("mode"), "{err}");
    assert_eq!(u("ctx://acc/docs/kafka").account_id(), "acc");
}

#[test]
fn auto_falls_back_to_keyword_with_a_notice_when_vectors_cannot_serve() {
    let f = corpus();
    let mut r = f.retriever();
    r.vector = None;
    r.vector_unavailable = Some("embedding model not loaded");
    let out = r.search(&SearchRequest::new("rebalance")).expect("auto");
    assert_eq!(
        (out.mode.as_str(), out.mode_used),
        (AUTO_MODE, SearchMode::Keyword)
    );
    assert_eq!(uris(&out), ["ctx://acc/docs/kafka"]);
    let notice = out.notice.expect("a notice");
    assert!(notice.contains("embedding model not loaded"), "{notice}");
    assert!(notice.contains("keyword"), "{notice}");
    // A named mode that needs vectors stays an error, retryable and `unavailable`.
    for m in [SearchMode::Vector, SearchMode::Hybrid] {
        let err = r.search(&mode("rebalance", m)).expect_err("named mode");
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains("not loaded"), "{err}");
    }
    // So does a configured default that needs them.
    r.fusion.default_mode = Some(SearchMode::Hybrid);
    let err = r
        .search(&SearchRequest::new("rebalance"))
        .expect_err("default");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    // With both indexes serving, auto is hybrid and says nothing.
    let out = f
        .retriever()
        .search(&SearchRequest::new("rebalance"))
        .expect("auto");
    assert_eq!((out.mode_used, out.notice), (SearchMode::Hybrid, None));
}

#[test]
fn every_hit_carries_the_stable_id_of_the_record_that_matched() {
    let f = corpus();
    for m in SearchMode::ALL {
        let out = f
            .retriever()
            .search(&mode("rebalance partition", m))
            .expect("search");
        assert!(!out.hits.is_empty(), "{m}: {out:?}");
        for h in &out.hits {
            assert_eq!(
                h.record_id,
                ce_core::stable_hash(h.uri.as_str(), h.level.as_u8()),
                "{m}: {h:?}"
            );
        }
    }
}

#[test]
fn the_lag_of_each_index_read_is_reported_within_the_scope() {
    let f = corpus();
    let out = f
        .retriever()
        .search(&mode("lag", SearchMode::Hybrid))
        .expect("search");
    let lag: Vec<(&str, u64)> = out
        .lag
        .iter()
        .map(|l| (l.index.as_str(), l.events))
        .collect();
    assert_eq!(lag, [("vector", 0), ("keyword", 0)]);
    f.put(
        "ctx://acc/docs/new",
        "Fresh note on consumer lag.",
        "Not indexed yet.",
    );
    f.put("ctx://other/docs/x", "Another account.", "Lag too.");
    let out = f
        .retriever()
        .search(&mode("fresh", SearchMode::Keyword))
        .expect("search");
    assert!(out.hits.is_empty(), "{out:?}");
    assert_eq!(out.lag.len(), 1, "keyword mode reads one index: {out:?}");
    // Each put appends its node's event and one per ancestor created.
    let all = out.lag[0].events;
    assert!(all >= 2, "{out:?}");
    let mut req = mode("fresh", SearchMode::Keyword);
    req.filter.account_id = Some("other".into());
    let other = f.retriever().search(&req).expect("search");
    assert!(
        other.lag[0].events >= 1 && other.lag[0].events < all,
        "{other:?}"
    );
    req.filter.account_id = None;
    req.filter.subtree = Some(u("ctx://acc/docs/new"));
    let one = f.retriever().search(&req).expect("search");
    assert_eq!(one.lag[0].events, 1, "{one:?}");
    f.index_all();
    let out = f
        .retriever()
        .search(&mode("fresh", SearchMode::Keyword))
        .expect("search");
    assert_eq!(
        (uris(&out), out.lag[0].events),
        (vec!["ctx://acc/docs/new"], 0)
    );
}

/// Each leg of a hybrid search waits (up to 10 s) for the other to have started: the search
/// succeeds only if the two run at once.
#[test]
fn a_hybrid_search_runs_its_two_legs_at_once() {
    use std::sync::Mutex;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    use ce_embed::{EmbedError, ModelIdentity};
    use ce_index::keyword::{KeywordHit, NodeWrite, StoredRecord, SyncOutcome};

    /// Tells the other leg it has started, then waits for the other leg's word.
    struct Meeting {
        started: Sender<()>,
        other: Mutex<Receiver<()>>,
    }
    impl Meeting {
        fn pair() -> (Meeting, Meeting) {
            let (a_tx, a_rx) = channel();
            let (b_tx, b_rx) = channel();
            (
                Meeting {
                    started: a_tx,
                    other: Mutex::new(b_rx),
                },
                Meeting {
                    started: b_tx,
                    other: Mutex::new(a_rx),
                },
            )
        }
        fn meet(&self) -> bool {
            let _ = self.started.send(());
            let other = self.other.lock().expect("meeting");
            other.recv_timeout(Duration::from_secs(10)).is_ok()
        }
    }
    struct MeetingEmbedder<'a>(&'a dyn Embedder, Meeting);
    impl Embedder for MeetingEmbedder<'_> {
        fn identity(&self) -> &ModelIdentity {
            self.0.identity()
        }
        fn embed_texts(
            &self,
            texts: &[&str],
            timeout: Duration,
        ) -> std::result::Result<Vec<Vec<f32>>, EmbedError> {
            if !self.1.meet() {
                // The keyword leg did not start while the query was embedded.
                return Err(EmbedError::Timeout {
                    after: Duration::from_secs(10),
                });
            }
            self.0.embed_texts(texts, timeout)
        }
    }
    struct MeetingKeywords<'a>(&'a dyn KeywordIndex, Meeting);
    impl KeywordIndex for MeetingKeywords<'_> {
        fn write_nodes(
            &self,
            writes: &[NodeWrite],
        ) -> ce_index::Result<Vec<ce_index::Result<SyncOutcome>>> {
            self.0.write_nodes(writes)
        }
        fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> ce_index::Result<u64> {
            self.0.delete_by_uri(uri, subtree)
        }
        fn search(
            &self,
            query: &str,
            filter: &SearchFilter,
            top_k: usize,
        ) -> ce_index::Result<Vec<KeywordHit>> {
            if !self.1.meet() {
                return Err(ce_index::IndexError::Unavailable(
                    "the vector leg did not start while the keyword index was searched".into(),
                ));
            }
            self.0.search(query, filter, top_k)
        }
        fn get(&self, uris: &[CtxUri]) -> ce_index::Result<Vec<StoredRecord>> {
            self.0.get(uris)
        }
        fn list_under(&self, uri: &CtxUri) -> ce_index::Result<Vec<StoredRecord>> {
            self.0.list_under(uri)
        }
        fn count(&self) -> ce_index::Result<u64> {
            self.0.count()
        }
        fn clear(&self) -> ce_index::Result<()> {
            self.0.clear()
        }
    }

    if ce_core::parallel::threads() == 1 {
        // One core: the legs run one after the other by design (nothing to check here).
        return;
    }
    let f = corpus();
    let (a, b) = Meeting::pair();
    let embedder = MeetingEmbedder(f.embedder.as_ref(), a);
    let keywords = MeetingKeywords(f.keyword.as_ref(), b);
    let retriever = Retriever {
        vector: Some(VectorSide {
            embedder: &embedder,
            ..f.vector_side()
        }),
        keyword: Some(KeywordSide {
            index: &keywords,
            ..f.keyword_side()
        }),
        ..f.retriever()
    };
    let met = retriever
        .search(&mode("consumer lag", SearchMode::Hybrid))
        .expect("both legs ran at once");
    let alone = f
        .retriever()
        .search(&mode("consumer lag", SearchMode::Hybrid))
        .expect("search");
    assert!(!met.hits.is_empty());
    assert_eq!(uris(&met), uris(&alone));
}
