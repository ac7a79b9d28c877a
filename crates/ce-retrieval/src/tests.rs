//! Retrieval against a real SQLite source, the hashing embedder and the in-memory vector
//! index, kept in step by a real `IndexWorker`.

use std::sync::Arc;

use ce_core::{Classify as _, Config, ErrorCode, IndexProjector, Meta};
use ce_embed::{HashEmbedder, ModelIdentity};
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::worker::target::KeywordTarget;
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{ContextFs as _, PutMode, PutRequest, SqliteStore};
use serde_json::json;

use super::*;

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) store: Arc<SqliteStore>,
    pub(crate) embedder: Arc<HashEmbedder>,
    pub(crate) index: Arc<MemoryVectorIndex>,
    worker: IndexWorker,
    pub(crate) keyword: Arc<MemoryKeywordIndex>,
    keyword_worker: IndexWorker,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::default();
        let store = Arc::new(SqliteStore::open(dir.path(), cfg.clone()).expect("store"));
        let embedder = Arc::new(HashEmbedder::new(64));
        let index = Arc::new(MemoryVectorIndex::new());
        let worker = IndexWorker::new(
            WorkerConfig::from_config(&cfg, "w1", "vector"),
            store.clone(),
            embedder.clone(),
            index.clone(),
            IndexProjector::new(cfg.projector),
        )
        .expect("worker");
        let keyword = Arc::new(MemoryKeywordIndex::new());
        let keyword_worker = IndexWorker::for_target(
            WorkerConfig::from_config(&cfg, "k1", "keyword"),
            store.clone(),
            Arc::new(KeywordTarget(keyword.clone())),
            None,
            IndexProjector::new(cfg.projector),
        )
        .expect("keyword worker");
        Fixture {
            _dir: dir,
            store,
            embedder,
            index,
            worker,
            keyword,
            keyword_worker,
        }
    }

    pub(crate) fn put(&self, uri: &str, abstract_text: &str, content: &str) {
        self.put_meta(uri, abstract_text, content, Meta::new());
    }

    fn put_meta(&self, uri: &str, abstract_text: &str, content: &str, meta: Meta) {
        let req = PutRequest {
            mode: PutMode::Replace,
            abstract_text: Some(abstract_text.into()),
            content: Some(content.into()),
            meta,
            ..PutRequest::default()
        };
        self.store.put(&u(uri), req).expect("put");
    }

    /// Runs the workers until the vector and keyword outboxes are drained.
    pub(crate) fn index_all(&self) {
        while self.worker.run_once(100).expect("run_once").claimed > 0 {}
        while self.keyword_worker.run_once(100).expect("run_once").claimed > 0 {}
    }

    /// The vector side over the fixture's vector index.
    pub(crate) fn vector_side(&self) -> VectorSide<'_> {
        VectorSide {
            embedder: self.embedder.as_ref(),
            index: self.index.as_ref(),
            consumer: "vector",
        }
    }

    /// The keyword side over the fixture's keyword index.
    pub(crate) fn keyword_side(&self) -> KeywordSide<'_> {
        KeywordSide {
            index: self.keyword.as_ref(),
            consumer: "keyword",
        }
    }

    /// A retriever over both indexes.
    pub(crate) fn retriever(&self) -> Retriever<'_> {
        Retriever {
            source: self.store.as_ref(),
            vector: Some(self.vector_side()),
            keyword: Some(self.keyword_side()),
            fusion: Fusion::default(),
            vector_unavailable: None,
        }
    }

    fn search(&self, req: &SearchRequest) -> Result<SearchResponse> {
        search(self.store.as_ref(), self.vector_side(), req)
    }

    /// Searches with a similarity floor, so unrelated nodes do not show up.
    fn find(&self, query: &str) -> SearchResponse {
        let mut req = SearchRequest::new(query);
        req.min_score = Some(0.2);
        self.search(&req).expect("search")
    }
}

pub(crate) fn u(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

pub(crate) fn uris(r: &SearchResponse) -> Vec<&str> {
    r.hits.iter().map(|h| h.uri.as_str()).collect()
}

#[test]
fn finds_indexed_nodes_with_their_current_abstract() {
    let f = Fixture::new();
    f.put(
        "ctx://acc/users/u1/memories/preferences/theme",
        "Prefers dark mode.",
        "Alice asked for dark mode in the IDE and the terminal.",
    );
    f.put(
        "ctx://acc/docs/refunds",
        "Refund policy.",
        "Refunds are possible within thirty days of purchase.",
    );
    f.index_all();
    let r = f.find("dark mode terminal");
    assert_eq!(
        r.hits.first().map(|h| h.uri.as_str()),
        Some("ctx://acc/users/u1/memories/preferences/theme")
    );
    let top = &r.hits[0];
    assert_eq!(top.abstract_text, "Prefers dark mode.");
    assert_eq!(top.version, 1);
    assert_eq!(top.context_type, "memory");
    assert_eq!(top.category, "preferences");
    assert_eq!(r.dropped_by_hydration, 0);
    assert_eq!(r.model, f.embedder.identity().key());
    // One hit per node even though each node has several records.
    let mut seen = uris(&r);
    seen.dedup();
    assert_eq!(seen.len(), r.hits.len());
}

#[test]
fn changed_and_removed_nodes_are_dropped_until_reindexed() {
    let f = Fixture::new();
    f.put("ctx://acc/docs/a", "Alpha", "apples and oranges");
    f.put("ctx://acc/docs/b", "Beta", "bananas and apples");
    f.index_all();
    assert_eq!(f.find("apples").hits.len(), 2);

    // The source moves on, the index has not caught up: never return the old text.
    f.put("ctx://acc/docs/a", "Alpha two", "cherries only");
    f.store
        .rm(&u("ctx://acc/docs/b"), false, None, None)
        .expect("rm");
    let r = f.find("apples");
    assert!(r.hits.is_empty(), "{r:?}");
    assert_eq!(r.dropped_by_hydration, r.candidates.min(6), "{r:?}");
    assert!(r.dropped_by_hydration >= 2);

    f.index_all();
    let r = f.find("apples");
    assert!(r.hits.is_empty(), "{r:?}");
    assert_eq!(r.dropped_by_hydration, 0);
    let r = f.find("cherries");
    assert_eq!(uris(&r), ["ctx://acc/docs/a"]);
    assert_eq!(r.hits[0].abstract_text, "Alpha two");
    assert_eq!(r.hits[0].version, 2);
}

#[test]
fn moved_nodes_are_found_at_their_new_uri() {
    let f = Fixture::new();
    f.put("ctx://acc/drafts/note", "Note", "quarterly planning notes");
    f.index_all();
    f.store
        .mv(
            &u("ctx://acc/drafts/note"),
            &u("ctx://acc/archive/note"),
            None,
        )
        .expect("mv");
    // Before the worker runs, the old records point at a node that is gone.
    let r = f.find("quarterly planning");
    assert!(r.hits.is_empty(), "{r:?}");
    f.index_all();
    let r = f.find("quarterly planning");
    assert_eq!(uris(&r), ["ctx://acc/archive/note"]);
    assert_eq!(r.hits[0].parent_uri.as_str(), "ctx://acc/archive");
}

#[test]
fn filters_narrow_the_candidates() {
    let f = Fixture::new();
    let mut meta = Meta::new();
    meta.insert("lang".into(), json!("en"));
    f.put_meta("ctx://acc/docs/en", "Guide", "install the tool", meta);
    let mut meta = Meta::new();
    meta.insert("lang".into(), json!("de"));
    f.put_meta("ctx://acc/docs/de", "Anleitung", "install the tool", meta);
    f.put("ctx://other/docs/x", "Other", "install the tool");
    f.index_all();

    let mut req = SearchRequest::new("install the tool");
    assert_eq!(f.search(&req).expect("search").hits.len(), 3);

    req.filter = filter_from_pairs([("lang", "de")]).expect("filter");
    assert_eq!(
        uris(&f.search(&req).expect("search")),
        ["ctx://acc/docs/de"]
    );

    req.filter = filter_from_pairs([("account_id", "other")]).expect("filter");
    assert_eq!(
        uris(&f.search(&req).expect("search")),
        ["ctx://other/docs/x"]
    );

    req.filter = filter_from_pairs([("subtree", "ctx://acc"), ("level", "0")]).expect("filter");
    let r = f.search(&req).expect("search");
    assert_eq!(r.hits.len(), 2);
    assert!(r.hits.iter().all(|h| h.level == Level::L0));

    req.filter =
        filter_from_pairs([("parent_uri", "ctx://acc/docs"), ("level", "2")]).expect("filter");
    let r = f.search(&req).expect("search");
    assert_eq!(r.hits.len(), 2);
    assert!(r.hits.iter().all(|h| h.level == Level::L2));

    req.top_k = 1;
    req.filter = SearchFilter::default();
    assert_eq!(f.search(&req).expect("search").hits.len(), 1);
}

#[test]
fn a_node_without_abstract_shows_its_indexed_text() {
    let f = Fixture::new();
    let long = "word ".repeat(100);
    f.put("ctx://acc/docs/plain", "", &long);
    f.index_all();
    let r = f.find("word");
    let hit = &r.hits[0];
    assert!(hit.abstract_text.starts_with("word word"), "{hit:?}");
    assert!(
        hit.abstract_text.chars().count() <= SNIPPET_CHARS + 1,
        "{hit:?}"
    );
    assert_eq!(hydrate::snippet(&long).chars().count(), SNIPPET_CHARS + 1);
    assert!(hydrate::snippet(&long).ends_with('…'));
    assert_eq!(hydrate::snippet("short"), "short");
}

#[test]
fn bad_requests_get_typed_errors() {
    let f = Fixture::new();
    let code = |req: SearchRequest| f.search(&req).expect_err("refused").code();
    assert_eq!(code(SearchRequest::new("  ")), ErrorCode::InvalidField);
    let mut req = SearchRequest::new("x");
    req.top_k = 0;
    assert_eq!(code(req.clone()), ErrorCode::InvalidField);
    // The interfaces stop at MAX_TOP_K; the retriever ranks deeper, up to its own bound.
    req.top_k = MAX_TOP_K + 1;
    assert!(req.validate().is_err());
    assert!(f.search(&req).is_ok());
    req.top_k = MAX_RETRIEVER_TOP_K + 1;
    assert_eq!(code(req), ErrorCode::InvalidField);
    let mut req = SearchRequest::new("x");
    req.min_score = Some(1.5);
    assert_eq!(code(req), ErrorCode::InvalidField);
    assert_eq!(
        code(SearchRequest::new("x".repeat(MAX_QUERY_BYTES + 1))),
        ErrorCode::PayloadTooLarge
    );
    assert!(matches!(
        filter_from_pairs([("level", "7")]),
        Err(CoreError::InvalidLevel { level: 7 })
    ));
    assert!(matches!(
        filter_from_pairs([("subtree", "ctx://a//b")]),
        Err(CoreError::InvalidUri(_))
    ));
    assert!(filter_from_pairs([("owner_space", "nobody")]).is_err());
    assert!(filter_from_pairs([("", "x")]).is_err());
}

#[test]
fn an_index_of_another_model_is_refused_with_the_fix() {
    let f = Fixture::new();
    let other = MemoryVectorIndex::new();
    other
        .bind_model(&ModelIdentity {
            provider: "local".into(),
            model: "all-MiniLM-L6-v2".into(),
            dimension: 384,
        })
        .expect("bind");
    let side = VectorSide {
        index: &other,
        ..f.vector_side()
    };
    let err = search(f.store.as_ref(), side, &SearchRequest::new("x")).expect_err("mismatch");
    assert_eq!(err.code(), ErrorCode::SchemaMismatch);
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("ce reindex --consumer vector"),
        "{err}"
    );
}

#[test]
fn an_empty_index_finds_nothing() {
    let f = Fixture::new();
    let r = f.find("anything");
    assert!(r.hits.is_empty());
    assert_eq!(r.candidates, 0);
}
