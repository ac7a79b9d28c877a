//! The engine on a real data directory with the hashing embedder.

use std::path::Path;
use std::time::{Duration, Instant};

use ce_core::config::{DERIVE_CONSUMER, KEYWORD_CONSUMER, RELATION_CONSUMER, VECTOR_CONSUMER};
use ce_core::{Classify as _, Config, CtxUri, ErrorCode};
use ce_retrieval::{SearchMode, SearchRequest};
use ce_store::{PutRequest, UriVersion};

use super::*;
use crate::status::{DrainProgress, Validation};

fn config(extra: &str) -> Config {
    Config::from_toml(&format!("[index.embedding]\nprovider = \"hash\"\n{extra}")).expect("config")
}

/// The indexes without the derive consumer: for tests that count embeddings, records or
/// events of the indexes themselves, which derived roll-ups of the folders would add to
/// (the derive consumer has its own tests: crates/ce-derive/tests, cli::derive).
const NO_DERIVE: &str = "[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\"]\n";

fn on_demand(dir: &Path, cfg: Config) -> Engine {
    let options = EngineOptions {
        workers: 2,
        run_workers: false,
        role: "test".into(),
        consumers: Vec::new(),
    };
    Engine::open_with(dir, cfg, options).expect("engine")
}

fn u(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

fn put(e: &Engine, uri: &str, text: &str) {
    let req = PutRequest {
        abstract_text: Some(text.into()),
        content: Some(format!("{text} (details)")),
        ..PutRequest::default()
    };
    e.put(&u(uri), req).expect("put");
}

fn hits(e: &Engine, q: &str) -> Vec<String> {
    let mut req = SearchRequest::new(q);
    req.min_score = Some(0.3);
    req.mode = Some(SearchMode::Vector);
    e.search(&req)
        .expect("search")
        .hits
        .into_iter()
        .map(|h| h.uri.to_string())
        .collect()
}

fn quiet(_: &DrainProgress) {}

#[test]
fn drain_indexes_and_search_finds_and_status_reports_no_lag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = on_demand(dir.path(), config(""));
    assert!(e.readiness().ready, "{:?}", e.readiness());
    put(&e, "ctx://acc/docs/a", "dark mode everywhere");
    put(&e, "ctx://acc/docs/b", "refunds within thirty days");
    let validation = |e: &Engine, consumer: &str| {
        let s = e.status().expect("status");
        let c = s
            .consumers
            .into_iter()
            .find(|c| c.consumer == consumer)
            .expect("consumer");
        (c.validation, c.applied)
    };
    assert_eq!(
        validation(&e, VECTOR_CONSUMER),
        (crate::status::Validation::Partial, false)
    );
    let report = e.drain(&quiet).expect("drain");
    assert_eq!(
        validation(&e, VECTOR_CONSUMER),
        (crate::status::Validation::AppliedValid, true)
    );
    assert_eq!(
        validation(&e, KEYWORD_CONSUMER),
        (crate::status::Validation::AppliedValid, true)
    );
    assert_eq!(
        validation(&e, RELATION_CONSUMER),
        (crate::status::Validation::AppliedValid, true)
    );
    assert!(report.progress.succeeded >= 2, "{report:?}");
    // The document alone: the folders' derived roll-ups are not flat hits.
    assert_eq!(hits(&e, "dark mode everywhere"), ["ctx://acc/docs/a"]);
    let s = e.status().expect("status");
    let vector = s
        .consumers
        .iter()
        .find(|c| c.consumer == VECTOR_CONSUMER)
        .expect("vector");
    assert_eq!(vector.lag_events, 0);
    assert_eq!(vector.lag_seconds, 0.0);
    assert!(s.index_records >= 4, "{s:?}");
    assert_eq!(s.keyword_records, Some(s.index_records));
    assert_eq!(s.model, s.index_model);
    // Every consumer was drained.
    assert!(s.consumers.iter().all(|c| c.lag_events == 0), "{s:?}");
    assert_eq!(s.relation_records, Some(0));
}

#[test]
fn disabled_workers_leave_a_valid_but_unapplied_delta() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = on_demand(dir.path(), config("[index.worker]\nenabled = false\n"));
    put(&e, "ctx://acc/docs/a", "dark mode everywhere");
    let s = e.status().expect("status");
    let vector = s
        .consumers
        .iter()
        .find(|c| c.consumer == VECTOR_CONSUMER)
        .expect("vector");
    assert_eq!(vector.validation, crate::status::Validation::DeltaValid);
    assert!(!vector.applied);
    assert!(vector.validation_reason.contains("enabled"), "{vector:?}");
}

#[test]
fn moves_reuse_vectors_and_workers_wake_on_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EngineOptions {
        workers: 2,
        run_workers: true,
        role: "test".into(),
        consumers: Vec::new(),
    };
    // A long poll interval: only the wake-up hint can make this fast.
    let e = Engine::open_with(
        dir.path(),
        config(&format!(
            "[index.worker]\npoll_interval_ms = 60000\n{NO_DERIVE}"
        )),
        options,
    )
    .expect("engine");
    // Two per consumer: vector, keyword, relation (derivation off: the search below
    // expects the note alone, not the folders' roll-ups).
    assert_eq!(e.running_workers(), 6);
    // Its workers run continuously: a drain is a caller's mistake, not a failure to retry.
    let err = e.drain(&quiet).expect_err("drain while workers run");
    assert_eq!(
        (err.code(), err.is_retryable()),
        (ErrorCode::InvalidField, false),
        "{err}"
    );
    assert_eq!(
        e.status().expect("status").worker_consumers,
        [VECTOR_CONSUMER, KEYWORD_CONSUMER, RELATION_CONSUMER],
        "a worker per configured consumer"
    );
    put(&e, "ctx://acc/drafts/note", "quarterly planning notes");
    let wait = |q: &str, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while hits(&e, q) != [want] {
            assert!(Instant::now() < deadline, "{want} not found for {q:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("quarterly planning notes", "ctx://acc/drafts/note");
    let before = e.embedder().expect("embedder").stats();
    e.mv(
        &u("ctx://acc/drafts/note"),
        &u("ctx://acc/archive/note"),
        None,
    )
    .expect("mv");
    wait("quarterly planning notes", "ctx://acc/archive/note");
    let after = e.embedder().expect("embedder").stats();
    assert_eq!(
        before.provider_calls, after.provider_calls,
        "a move embedded text"
    );
    e.shutdown();
    assert_eq!(e.running_workers(), 0);
    let s = e.status().expect("status");
    let vector = s
        .consumers
        .iter()
        .find(|c| c.consumer == VECTOR_CONSUMER)
        .expect("vector");
    assert_eq!(vector.claimed, 0, "shutdown left a claim behind");
}

#[test]
fn a_move_asks_the_embedder_for_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Derivation off: the account's roll-up names the moved folder, so it is new text.
    let e = on_demand(dir.path(), config(NO_DERIVE));
    put(&e, "ctx://acc/drafts/note", "quarterly planning notes");
    put(&e, "ctx://acc/drafts/other", "something else");
    e.drain(&quiet).expect("drain");
    let before = e.embedder().expect("embedder").stats();
    e.mv(&u("ctx://acc/drafts"), &u("ctx://acc/archive"), None)
        .expect("mv");
    e.drain(&quiet).expect("drain");
    let after = e.embedder().expect("embedder").stats();
    assert_eq!(before, after, "the move asked the embedder for vectors");
    assert_eq!(
        hits(&e, "quarterly planning notes"),
        ["ctx://acc/archive/note"]
    );
    // A leaf into a parent the move creates.
    let list = |e: &Engine| {
        e.index()
            .expect("vector index")
            .list_under(&CtxUri::root())
            .expect("list")
            .into_iter()
            .map(|r| {
                (
                    r.record.uri.to_string(),
                    r.record.level.as_u8(),
                    r.node_version,
                )
            })
            .collect::<Vec<_>>()
    };
    let after = e.embedder().expect("embedder").stats();
    e.mv(&u("ctx://acc/archive/note"), &u("ctx://acc/old/note"), None)
        .expect("mv");
    e.drain(&quiet).expect("drain");
    assert!(
        list(&e)
            .iter()
            .any(|(u, l, _)| u == "ctx://acc/old/note" && *l == 0)
    );
    let last = e.embedder().expect("embedder").stats();
    assert_eq!(after, last, "the leaf move asked the embedder for vectors");
}

#[test]
fn a_model_change_is_not_ready_until_reindexed() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = on_demand(dir.path(), config(NO_DERIVE));
        put(&e, "ctx://acc/docs/a", "dark mode everywhere");
        e.put(&u("ctx://acc/docs/empty"), PutRequest::default())
            .expect("put");
        e.drain(&quiet).expect("drain");
    }
    let e = on_demand(dir.path(), config(&format!("dimensions = 64\n{NO_DERIVE}")));
    let r = e.readiness();
    assert!(!r.ready);
    assert!(
        r.reasons[0].contains("ce reindex --consumer vector"),
        "{r:?}"
    );
    let mut vector = SearchRequest::new("dark");
    vector.mode = Some(SearchMode::Vector);
    let err = e.search(&vector).expect_err("mismatch");
    assert_eq!(err.code(), ErrorCode::SchemaMismatch, "{err}");
    // `auto` falls back to the keyword index and says why.
    let auto = e.search(&SearchRequest::new("dark")).expect("auto");
    assert_eq!(auto.mode_used, SearchMode::Keyword);
    let notice = auto.notice.expect("a notice");
    assert!(notice.contains("ce reindex --consumer vector"), "{notice}");
    // The blocked vector consumer holds nobody back: keyword search still answers, and a
    // drain applies the keyword consumer and reports the vector one blocked.
    let mut keyword = SearchRequest::new("dark");
    keyword.mode = Some(SearchMode::Keyword);
    let found = e.search(&keyword).expect("keyword search");
    assert_eq!(found.hits[0].uri, u("ctx://acc/docs/a"));
    put(&e, "ctx://acc/docs/b", "light theme");
    let drained = e.drain(&quiet).expect("keyword drain");
    let state = |c: &str| {
        drained
            .remaining
            .iter()
            .find(|s| s.consumer == c)
            .map(|s| (s.validation, s.lag_events))
    };
    assert_eq!(state(VECTOR_CONSUMER), Some((Validation::Blocked, 1)));
    assert_eq!(state(KEYWORD_CONSUMER), Some((Validation::AppliedValid, 0)));

    let report = e.reindex(VECTOR_CONSUMER).expect("reindex");
    assert_eq!(
        report.requeued, 2,
        "only nodes with text (a, b) are requeued: {report:?}"
    );
    assert!(report.cleared_records > 0);
    assert_eq!(report.model.as_ref().map(|m| m.dimension), Some(64));
    assert!(e.readiness().ready);
    e.drain(&quiet).expect("drain");
    assert_eq!(hits(&e, "dark mode everywhere")[0], "ctx://acc/docs/a");
    assert_eq!(
        e.reindex("graph").expect_err("unsupported").code(),
        ErrorCode::InvalidField
    );
}

#[test]
fn a_missing_model_keeps_nodes_working_and_auto_search_on_keywords() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-model");
    let cfg = Config::from_toml(&format!(
        "[index.embedding]\nprovider = \"local\"\nmodel_dir = {:?}\n",
        missing.display().to_string()
    ))
    .expect("config");
    let e = Engine::open_with(dir.path(), cfg, EngineOptions::default()).expect("engine");
    let r = e.readiness();
    assert!(!r.ready);
    assert!(r.reasons[0].contains("scripts/fetch-model.sh"), "{r:?}");
    // The keyword, relation and derive consumers do not need the model: their workers run.
    assert_eq!(e.running_workers(), 6);
    assert_eq!(
        e.status().expect("status").worker_consumers,
        [KEYWORD_CONSUMER, RELATION_CONSUMER, DERIVE_CONSUMER]
    );
    put(&e, "ctx://acc/docs/a", "still writable");
    assert!(matches!(
        e.store()
            .versions(&[u("ctx://acc/docs/a")])
            .expect("versions")[..],
        [UriVersion::Live(1)]
    ));
    for m in [SearchMode::Vector, SearchMode::Hybrid] {
        let mut req = SearchRequest::new("x");
        req.mode = Some(m);
        let err = e.search(&req).expect_err("no model");
        assert_eq!(err.code(), ErrorCode::Unavailable, "{m}: {err}");
        assert!(err.is_retryable());
    }
    let auto = e.search(&SearchRequest::new("x")).expect("auto falls back");
    assert_eq!(auto.mode_used, SearchMode::Keyword);
    assert!(
        auto.notice
            .is_some_and(|n| n.contains("scripts/fetch-model.sh"))
    );
}

#[test]
fn a_second_engine_on_the_same_directory_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = on_demand(dir.path(), config(""));
    let err =
        Engine::open_with(dir.path(), config(""), EngineOptions::default()).expect_err("locked");
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(err.to_string().contains("--server"), "{err}");
}

#[test]
fn a_keyword_reindex_rebuilds_that_index_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = on_demand(dir.path(), config(""));
    put(&e, "ctx://acc/docs/a", "dark mode everywhere");
    put(&e, "ctx://acc/docs/b", "refunds within thirty days");
    e.drain(&quiet).expect("drain");
    let done = |e: &Engine, c: &str| {
        let s = e.status().expect("status");
        let c = s.consumers.iter().find(|s| s.consumer == c).cloned();
        c.map(|c| (c.done, c.lag_events)).expect("consumer")
    };
    let vector_before = done(&e, VECTOR_CONSUMER);
    let records = e.status().expect("status").keyword_records;
    let report = e.reindex(KEYWORD_CONSUMER).expect("reindex");
    // a, b, and the derived roll-ups of ctx://acc/docs and ctx://acc.
    assert_eq!((report.requeued, report.model.as_ref()), (4, None));
    assert_eq!(Some(report.cleared_records), records);
    assert_eq!(e.status().expect("status").keyword_records, Some(0));
    // The repair went to the keyword consumer only.
    assert_eq!(done(&e, VECTOR_CONSUMER), vector_before);
    assert_eq!(done(&e, KEYWORD_CONSUMER).1, 4);
    e.drain(&quiet).expect("drain");
    assert_eq!(e.status().expect("status").keyword_records, records);
    let mut req = SearchRequest::new("refunds");
    req.mode = Some(SearchMode::Keyword);
    let found = e.search(&req).expect("search");
    assert_eq!(found.hits[0].uri, u("ctx://acc/docs/b"));
}

/// A consumer added after the journal pruned what the others applied cannot be back-filled
/// from it: opening the engine queues its rebuild from the source, and one
/// `ce worker --once` (jobs, then the drain) gives it every node.
#[test]
fn a_consumer_added_after_the_journal_was_pruned_is_rebuilt_from_the_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = config("[index.outbox]\nconsumers = [\"vector\", \"relation\"]\n");
    let e = on_demand(dir.path(), before);
    put(&e, "ctx://acc/docs/a", "dark mode everywhere");
    put(&e, "ctx://acc/docs/b", "refunds within thirty days");
    e.drain(&quiet).expect("drain");
    std::thread::sleep(Duration::from_millis(5));
    let pruned = e.store().prune_journal(0, 100).expect("prune");
    assert!(pruned.events > 0, "{pruned:?}");
    e.shutdown();
    drop(e);

    let e = on_demand(dir.path(), config(NO_DERIVE));
    assert_eq!(
        e.store().rebuilds_needed().expect("flags"),
        vec![KEYWORD_CONSUMER.to_owned()]
    );
    let queued = e
        .list_jobs(&ce_store::JobFilter {
            limit: 100,
            ..ce_store::JobFilter::default()
        })
        .expect("jobs")
        .into_iter()
        .filter(|j| j.job_type == crate::jobs::reindex::REINDEX_JOB)
        .count();
    assert_eq!(queued, 1, "one rebuild queued at open");
    let (_, jobs) = e.drain_jobs_and_deliveries(&quiet).expect("worker --once");
    assert_eq!(jobs.completed, 1);
    assert!(e.store().rebuilds_needed().expect("flags").is_empty());
    let mut req = SearchRequest::new("refunds");
    req.mode = Some(SearchMode::Keyword);
    let found = e.search(&req).expect("search");
    assert_eq!(found.hits[0].uri, u("ctx://acc/docs/b"));
    e.shutdown();
    drop(e);
    // Reopened, nothing more is queued.
    let e = on_demand(dir.path(), config(NO_DERIVE));
    assert!(e.store().rebuilds_needed().expect("flags").is_empty());
    let (_, jobs) = e.drain_jobs_and_deliveries(&quiet).expect("worker --once");
    assert_eq!(jobs.ran, 0);
}
