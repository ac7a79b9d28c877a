//! Outbox operations outside the delivery state machine, one body per test on every backend:
//! appends for chosen consumers, the latest failure in the stats, dead-delivery repair
//! (count, force done, requeue), fencing of acknowledgements by token and lease, and
//! `list` / `show`.
//!
//! Backend-specific outbox tests (query plans, PostgreSQL's NOTIFY) stay next to their
//! backend in `src/{sqlite,postgres}/outbox.rs`.

use ce_core::{
    Config, CtxUri, DeleteContextPayload, DeliveryStatus, EVENT_VERSION, ErrorCode, EventPayload,
    EventType, OutboxEventCreate, UpsertContextPayload, UpsertReason,
};
use ce_store::model::{DeadCounts, DeadFilter, FORCED_DONE_CODE};
use ce_store::{IndexOwner, LAG_SCAN_LIMIT, OutboxFilter, StoreError};

use crate::common::{self, Backend, T0, backend_tests, failure, uri};

backend_tests!(
    append_for_one_consumer_leaves_the_others_alone,
    stats_report_the_latest_failure,
    dead_repair_follows_its_filter_and_touches_only_dead_deliveries,
    fenced_transitions_follow_token_and_lease,
    list_pages_and_show_finds_by_id_or_seq,
    lag_counts_what_is_not_applied_within_a_subtree,
    expired_claims_are_taken_over_at_once_and_the_old_token_is_stale,
    the_first_instance_owns_a_consumer_until_another_takes_it_over,
);

/// The default configuration with `names` as the consumers, in that order.
fn consumers(names: &[&str]) -> Config {
    let mut c = Config::default();
    c.index.outbox.consumers = names.iter().map(|n| (*n).to_owned()).collect();
    c
}

fn upsert(u: &str) -> OutboxEventCreate {
    OutboxEventCreate {
        payload: EventPayload::UpsertContext(UpsertContextPayload {
            event_version: EVENT_VERSION,
            uri: uri(u),
            expected_node_version: 1,
            reason: UpsertReason::Create,
            trace_id: "t".into(),
        }),
    }
}

fn delete(u: &str) -> OutboxEventCreate {
    OutboxEventCreate {
        payload: EventPayload::DeleteContext(DeleteContextPayload {
            event_version: EVENT_VERSION,
            uri: uri(u),
            expected_deleted_version: 1,
            recursive: false,
            trace_id: "t".into(),
        }),
    }
}

/// A repair for one consumer creates deliveries for it only; unknown or no consumers are
/// refused and append nothing.
fn append_for_one_consumer_leaves_the_others_alone(backend: Backend) {
    let (_place, store, _clock) = common::fresh(backend, Config::default());
    let appended = store
        .append_batch_for(
            &["keyword".to_owned()],
            vec![delete("ctx://acc/resources/a")],
        )
        .expect("append");
    let (_, deliveries) = store.show(&appended[0].event_id).expect("show");
    let consumers: Vec<&str> = deliveries.iter().map(|d| d.consumer.as_str()).collect();
    assert_eq!(consumers, ["keyword"]);
    for bad in [vec!["nope".to_owned()], vec![]] {
        let err = store
            .append_batch_for(&bad, vec![delete("ctx://acc/resources/a")])
            .expect_err("refused");
        assert!(err.to_string().contains("consumer"), "{err}");
    }
    let pending: u64 = store
        .stats()
        .expect("stats")
        .iter()
        .map(|s| s.pending)
        .sum();
    assert_eq!(pending, 1);
}

/// The stats carry the latest failure of each consumer: code, message, event and whether
/// it killed the delivery.
fn stats_report_the_latest_failure(backend: Backend) {
    let (_place, store, _clock) = common::fresh(backend, consumers(&["vector"]));
    store
        .append_batch(vec![upsert("ctx://acc/a"), upsert("ctx://acc/b")])
        .expect("append");
    let last = || store.stats().expect("stats")[0].last_error.clone();
    assert_eq!(last(), None);
    let claimed = store.claim_batch("vector", "w1", 10).expect("claim");
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    store
        .mark_failed(
            &claimed[0].claim,
            &failure("provider timed out", ErrorCode::EmbedTimeout, true),
        )
        .expect("fail a");
    let e = last().expect("a failure");
    assert_eq!(
        (e.seq, e.code.as_str(), e.message.as_str(), e.dead),
        (
            claimed[0].event.seq,
            "embed_timeout",
            "provider timed out",
            false
        )
    );
    assert_eq!(e.event_id, claimed[0].event.event_id);
    store
        .mark_failed(
            &claimed[1].claim,
            &failure("bad payload", ErrorCode::InvalidPayload, false),
        )
        .expect("fail b");
    let e = last().expect("b failure");
    assert_eq!((e.seq, e.dead), (claimed[1].event.seq, true));
}

/// Dead repair selects by consumer, type, subtree, error code, sequence range and
/// exhaustion; only dead deliveries move; a forced one is done and says so.
fn dead_repair_follows_its_filter_and_touches_only_dead_deliveries(backend: Backend) {
    let mut cfg = consumers(&["vector", "keyword"]);
    cfg.index.outbox.max_retries = 3;
    let (_place, store, clock) = common::fresh(backend, cfg);
    // Events: 1 ctx://acc, 2 ctx://acc/a, 3 ctx://acc/b, 4 ctx://acc/ab (a sibling that
    // shares the text prefix "ctx://acc/a" but is not in its subtree): what puts of
    // ctx://acc/a, ctx://acc/b and ctx://acc/ab append.
    let events = ["ctx://acc", "ctx://acc/a", "ctx://acc/b", "ctx://acc/ab"];
    store
        .append_batch(events.iter().map(|u| upsert(u)).collect())
        .expect("append");
    // vector: seq 2 dies by exhaustion (retryable failures), 1, 3 and 4 at once.
    for c in store.claim_batch("vector", "w", 10).expect("claim") {
        let retryable = c.event.seq == 2;
        let code = if retryable {
            ErrorCode::EmbedTimeout
        } else {
            ErrorCode::InvalidPayload
        };
        store
            .mark_failed(&c.claim, &failure("boom", code, retryable))
            .expect("fail");
    }
    for _ in 0..3 {
        clock.advance(3_600_000);
        let again = store.claim_batch("vector", "w", 10).expect("claim");
        assert_eq!(again.len(), 1);
        store
            .mark_failed(
                &again[0].claim,
                &failure("boom", ErrorCode::EmbedTimeout, true),
            )
            .expect("fail");
    }
    // keyword: seq 3 dead, seq 4 left claimed, the others done.
    for c in store.claim_batch("keyword", "w", 10).expect("claim") {
        match c.event.seq {
            3 => {
                store
                    .mark_failed(&c.claim, &failure("bad", ErrorCode::InvalidPayload, false))
                    .expect("fail");
            }
            4 => {}
            _ => store.mark_done(&c.claim).expect("done"),
        }
    }
    let n = |pairs: &[(&str, u64)]| -> DeadCounts {
        pairs.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
    };
    let count = |f: DeadFilter| store.count_dead(&f).expect("count");
    let sub = |u: &str| Some(uri(u));
    assert_eq!(
        count(DeadFilter::default()),
        n(&[("keyword", 1), ("vector", 4)])
    );
    assert_eq!(
        count(DeadFilter {
            subtree: sub("ctx://acc/a"),
            ..DeadFilter::default()
        }),
        n(&[("vector", 1)])
    );
    assert_eq!(
        count(DeadFilter {
            exhausted_only: true,
            ..DeadFilter::default()
        }),
        n(&[("vector", 1)])
    );
    assert_eq!(
        count(DeadFilter {
            error_code: Some("invalid_payload".into()),
            min_seq: Some(3),
            max_seq: Some(4),
            ..DeadFilter::default()
        }),
        n(&[("keyword", 1), ("vector", 2)])
    );
    assert_eq!(
        count(DeadFilter {
            event_type: Some(EventType::DeleteContext),
            ..DeadFilter::default()
        }),
        n(&[])
    );
    assert_eq!(
        count(DeadFilter {
            event_type: Some(EventType::UpsertContext),
            subtree: sub("ctx://acc/b"),
            ..DeadFilter::default()
        }),
        n(&[("keyword", 1), ("vector", 1)])
    );
    let keyword_all = DeadFilter {
        subtree: Some(CtxUri::root()),
        consumer: Some("keyword".into()),
        ..DeadFilter::default()
    };
    assert_eq!(count(keyword_all.clone()), n(&[("keyword", 1)]));
    let unknown = DeadFilter {
        consumer: Some("nope".into()),
        ..DeadFilter::default()
    };
    assert!(matches!(
        store.count_dead(&unknown),
        Err(StoreError::UnknownConsumer { .. })
    ));

    // Force the keyword one done: done, says why, nothing else moved; a rerun finds none.
    assert_eq!(
        store.force_done(&keyword_all).expect("force"),
        n(&[("keyword", 1)])
    );
    assert_eq!(store.force_done(&keyword_all).expect("again"), n(&[]));
    let delivery = |seq: &str, consumer: &str| {
        let (_, ds) = store.show(seq).expect("show");
        ds.into_iter()
            .find(|d| d.consumer == consumer)
            .expect("delivery")
    };
    let k = delivery("3", "keyword");
    assert_eq!(k.status, DeliveryStatus::Done);
    assert_eq!(k.error_code.as_deref(), Some(FORCED_DONE_CODE));
    let last = k.last_error.unwrap_or_default();
    assert!(
        last.contains("forced done") && last.contains("invalid_payload: bad"),
        "{last}"
    );
    assert_eq!(delivery("4", "keyword").status, DeliveryStatus::Claimed);

    // Requeue the vector ones from seq 3: pending, fresh budget, visible now.
    let f = DeadFilter {
        consumer: Some("vector".into()),
        min_seq: Some(3),
        ..DeadFilter::default()
    };
    assert_eq!(
        store.requeue_dead_matching(&f).expect("requeue"),
        n(&[("vector", 2)])
    );
    for seq in ["3", "4"] {
        let v = delivery(seq, "vector");
        assert_eq!((v.status, v.retry_count), (DeliveryStatus::Pending, 0));
    }
    assert_eq!(count(DeadFilter::default()), n(&[("vector", 2)]));
    let claimed = store.claim_batch("vector", "w", 10).expect("claim");
    let seqs: Vec<i64> = claimed.iter().map(|c| c.event.seq).collect();
    assert_eq!(seqs, [3, 4]);

    // requeue_dead by sequence: only the named dead ones, duplicates counted once.
    assert_eq!(
        store
            .requeue_dead(Some("vector"), Some(&[2, 2, 3]))
            .expect("requeue"),
        1
    );
    assert_eq!(store.requeue_dead(None, None).expect("requeue"), 1);
    assert!(store.requeue_dead(Some("nope"), None).is_err());
    assert_eq!(count(DeadFilter::default()), n(&[]));
}

/// Acks pass only for the live claim: same token, lease not over. A stale claim gets a
/// conflict that says why; done twice is fine; a batch answers each claim.
fn fenced_transitions_follow_token_and_lease(backend: Backend) {
    let cfg = consumers(&["vector"]);
    let lease = i64::from(cfg.index.worker.lease_seconds) * 1000;
    let (_place, store, clock) = common::fresh(backend, cfg);
    store
        .append_batch((0..4).map(|i| upsert(&format!("ctx://acc/n{i}"))).collect())
        .expect("append");
    let first = store.claim_batch("vector", "w1", 2).expect("claim");
    assert_eq!(
        first.iter().map(|c| c.event.seq).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(first[0].claim.claimed_until_ms, T0 + lease);
    // Claimed rows are not runnable while the lease lasts.
    let second = store.claim_batch("vector", "w2", 10).expect("claim");
    assert_eq!(
        second.iter().map(|c| c.event.seq).collect::<Vec<_>>(),
        [3, 4]
    );
    clock.advance(1_000);
    assert_eq!(
        store.renew(&first[0].claim).expect("renew"),
        T0 + 1_000 + lease
    );
    // The leases of seqs 2 to 4 run out (not the renewed one of seq 1); w3 takes them
    // over, and w1's and w2's claims of them are now stale.
    clock.advance(lease - 500);
    let taken = store.claim_batch("vector", "w3", 10).expect("claim");
    assert_eq!(
        taken.iter().map(|c| c.event.seq).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    let state = |e: StoreError| match e {
        StoreError::ClaimConflict { state, .. } => state,
        e => panic!("not a conflict: {e}"),
    };
    let stale = store.mark_done(&first[1].claim).expect_err("stale");
    assert_eq!(state(stale), "claimed by a newer claim");
    clock.advance(1_000);
    let expired = store.renew(&first[0].claim).expect_err("expired");
    assert_eq!(state(expired), "the lease expired");
    store.mark_done(&taken[0].claim).expect("done");
    store.mark_done(&taken[0].claim).expect("done twice");
    let failed = store
        .mark_failed(&taken[0].claim, &failure("late", ErrorCode::Internal, true))
        .expect_err("done");
    assert_eq!(state(failed), "status is done");
    let mut ghost = taken[1].claim.clone();
    ghost.seq = 99;
    assert!(matches!(
        store.mark_done(&ghost),
        Err(StoreError::EventNotFound { .. })
    ));
    // A batch: one answer per claim, in the order given; a lost claim stops nothing.
    let answers = store
        .mark_done_batch(&[
            taken[2].claim.clone(),
            ghost,
            second[0].claim.clone(),
            taken[1].claim.clone(),
        ])
        .expect("batch");
    let shape: Vec<&str> = answers
        .iter()
        .map(|a| match a {
            Ok(()) => "ok",
            Err(StoreError::ClaimConflict { .. }) => "conflict",
            Err(StoreError::EventNotFound { .. }) => "not found",
            Err(_) => "other",
        })
        .collect();
    assert_eq!(shape, ["ok", "not found", "conflict", "ok"]);
    let s = &store.stats().expect("stats")[0];
    assert_eq!((s.done, s.claimed, s.low_watermark_seq), (3, 1, Some(1)));
    assert_eq!(s.oldest_pending_created_at_ms, Some(T0));
}

/// `list` pages by `(seq, consumer)` in byte order and filters; `show` finds an event by
/// id or sequence.
fn list_pages_and_show_finds_by_id_or_seq(backend: Backend) {
    let (_place, store, _clock) =
        common::fresh(backend, consumers(&["vector", "Keyword", "_graph"]));
    let appended = store
        .append_batch(vec![upsert("ctx://acc/a"), delete("ctx://acc/b")])
        .expect("append");
    let page = |after: Option<(i64, &str)>, limit: u32| {
        store
            .list(&OutboxFilter {
                after_seq: after.map(|a| a.0),
                after_consumer: after.map(|a| a.1.to_owned()),
                limit: Some(limit),
                ..OutboxFilter::default()
            })
            .expect("list")
            .iter()
            .map(|r| (r.event.seq, r.delivery.consumer.clone()))
            .collect::<Vec<_>>()
    };
    let all = page(None, 100);
    let key = |s: i64, c: &str| (s, c.to_owned());
    assert_eq!(
        all,
        [
            key(1, "Keyword"),
            key(1, "_graph"),
            key(1, "vector"),
            key(2, "Keyword"),
            key(2, "_graph"),
            key(2, "vector"),
        ]
    );
    assert_eq!(page(Some((1, "_graph")), 2), all[2..4]);
    let deletes = store
        .list(&OutboxFilter {
            event_type: Some(EventType::DeleteContext),
            consumer: Some("vector".into()),
            status: Some(DeliveryStatus::Pending),
            ..OutboxFilter::default()
        })
        .expect("list");
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].event, appended[1]);
    assert!(
        store
            .list(&OutboxFilter {
                consumer: Some("nope".into()),
                ..OutboxFilter::default()
            })
            .is_err()
    );
    let (by_id, ds) = store.show(&appended[0].event_id).expect("show");
    assert_eq!(by_id, appended[0]);
    let order: Vec<&str> = ds.iter().map(|d| d.consumer.as_str()).collect();
    assert_eq!(order, ["Keyword", "_graph", "vector"]);
    assert_eq!(store.show("2").expect("show").0, appended[1]);
    assert!(matches!(
        store.show("evt-missing"),
        Err(StoreError::EventNotFound { .. })
    ));
}

/// The lag of a consumer counts its pending, claimed and retrying deliveries (not done or
/// dead ones), within a subtree when asked (a sibling sharing the text prefix is outside),
/// with the oldest one's age; an unknown consumer is refused.
fn lag_counts_what_is_not_applied_within_a_subtree(backend: Backend) {
    let (_place, store, clock) = common::fresh(backend, consumers(&["vector", "keyword"]));
    let none = store.lag("vector", None).expect("lag");
    assert_eq!((none.events, none.oldest_age_ms), (0, None));
    store
        .append_batch(vec![upsert("ctx://acc/a"), upsert("ctx://acc/ab")])
        .expect("append");
    clock.advance(5000);
    store
        .append_batch(vec![upsert("ctx://acc/a/x"), upsert("ctx://other/b")])
        .expect("append");
    let all = store.lag("vector", None).expect("lag");
    assert_eq!((all.events, all.oldest_age_ms), (4, Some(5000)));
    let a = uri("ctx://acc/a");
    assert_eq!(store.lag("vector", Some(&a)).expect("lag").events, 2);
    let acc = store.lag("vector", Some(&uri("ctx://acc"))).expect("lag");
    assert_eq!(acc.events, 3);
    // One applied, one claimed, one dead: the claimed one still lags.
    let claimed = store.claim_batch("vector", "w", 3).expect("claim");
    store.mark_done(&claimed[0].claim).expect("done");
    store
        .mark_failed(
            &claimed[1].claim,
            &failure("bad", ErrorCode::InvalidPayload, false),
        )
        .expect("dead");
    clock.advance(1000);
    let all = store.lag("vector", None).expect("lag");
    assert_eq!((all.events, all.oldest_age_ms), (2, Some(1000)));
    let sub = store.lag("vector", Some(&a)).expect("lag");
    assert_eq!((sub.events, sub.oldest_age_ms), (1, Some(1000)));
    // The other consumer is untouched.
    assert_eq!(store.lag("keyword", None).expect("lag").events, 4);
    // A backlog over the scan limit is counted up to it and flagged.
    let many = (0..LAG_SCAN_LIMIT).map(|i| upsert(&format!("ctx://big/n{i}")));
    store.append_batch(many.collect()).expect("append");
    let big = store.lag("keyword", None).expect("lag");
    assert_eq!(
        (big.events, big.capped),
        (LAG_SCAN_LIMIT + 1, true),
        "{big:?}"
    );
    let sub = store.lag("keyword", Some(&a)).expect("lag");
    assert_eq!((sub.events, sub.capped), (2, true), "{sub:?}");
    let err = store.lag("nope", None).expect_err("unknown consumer");
    assert!(matches!(err, StoreError::UnknownConsumer { .. }), "{err}");
}

/// `expire_claims` ends the leases of one consumer's claims at once (not the others'): the
/// next claim takes them over without waiting, and the old claim's token no longer counts.
fn expired_claims_are_taken_over_at_once_and_the_old_token_is_stale(backend: Backend) {
    let (_place, store, _clock) = common::fresh(backend, consumers(&["vector", "keyword"]));
    store
        .append_batch((0..3).map(|i| upsert(&format!("ctx://acc/n{i}"))).collect())
        .expect("append");
    let old = store.claim_batch("vector", "dead-1", 10).expect("claim");
    let kept = store.claim_batch("keyword", "live-1", 10).expect("claim");
    assert_eq!((old.len(), kept.len()), (3, 3));
    assert!(
        store
            .claim_batch("vector", "w", 10)
            .expect("claim")
            .is_empty()
    );
    assert_eq!(store.expire_claims("vector").expect("expire"), 3);
    let taken = store.claim_batch("vector", "w", 10).expect("claim");
    assert_eq!(
        taken.iter().map(|c| c.event.seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(
        store.mark_done(&old[0].claim).is_err(),
        "the old claim is stale"
    );
    for t in &taken {
        store.mark_done(&t.claim).expect("the new claims count");
    }
    // The keyword claims were left alone; an unknown consumer is refused.
    assert!(
        store
            .claim_batch("keyword", "w", 10)
            .expect("claim")
            .is_empty()
    );
    assert_eq!(store.expire_claims("vector").expect("again"), 0);
    assert!(store.expire_claims("graph").is_err());
}

/// The first instance to claim a consumer owns it; another is answered with the owner and
/// records nothing, until it takes the consumer over; the owner's host and directory follow
/// it, its `since` stays.
fn the_first_instance_owns_a_consumer_until_another_takes_it_over(backend: Backend) {
    let (_place, store, clock) = common::fresh(backend, consumers(&["keyword"]));
    let a = IndexOwner {
        instance: "a".into(),
        host: "h1".into(),
        data_dir: "/data/a".into(),
        since_ms: 0,
    };
    let b = IndexOwner {
        instance: "b".into(),
        host: "h2".into(),
        data_dir: "/data/b".into(),
        since_ms: 0,
    };
    let first = store.claim_owner("keyword", &a, false).expect("claim");
    assert_eq!((first.instance.as_str(), first.since_ms), ("a", T0));
    clock.advance(1_000);
    let refused = store.claim_owner("keyword", &b, false).expect("claim");
    assert_eq!(refused, first, "b is told a owns it");
    let moved = IndexOwner {
        data_dir: "/data/a2".into(),
        ..a.clone()
    };
    let again = store.claim_owner("keyword", &moved, false).expect("claim");
    assert_eq!((again.data_dir.as_str(), again.since_ms), ("/data/a2", T0));
    let taken = store.claim_owner("keyword", &b, true).expect("take over");
    assert_eq!((taken.instance.as_str(), taken.since_ms), ("b", T0 + 1_000));
    assert_eq!(
        store.claim_owner("keyword", &a, false).expect("claim"),
        taken
    );
    assert!(store.claim_owner("graph", &a, false).is_err());
}
