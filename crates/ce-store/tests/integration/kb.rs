//! Knowledge bases and items through `KbStore` and `WriteOp::Kb`, on every backend: rows
//! round-trip, each op's checks, subtree marks and deletes, the deleting roots of the
//! recovery scan, and the stale guard failing a whole batch (nodes, rows, jobs) so that
//! nothing of it is written.

use ce_core::{Classify, Config, ErrorCode};
use ce_store::{
    BaseStatus, ItemError, ItemKind, ItemStatus, JobFilter, JobSpec, KbItem, KbOp, KnowledgeBase,
    PutRequest, SourceStore, StoreError, WriteOp,
};
use serde_json::json;

use crate::common::{self, Backend, T0, backend_tests, uri};

backend_tests!(
    bases_and_items_round_trip_and_embedding_records_the_journal_position,
    each_op_checks_its_preconditions_and_a_failed_check_writes_nothing,
    subtrees_are_marked_deleting_and_deleted_leaves_first,
    the_stale_guard_fails_the_whole_batch_nodes_and_jobs_included,
    the_overview_counts_items_by_base_and_status_and_keeps_the_latest_failures,
);

fn base(name: &str) -> KnowledgeBase {
    KnowledgeBase {
        name: name.into(),
        root: uri(&format!("ctx://acct/resources/{name}")),
        settings: json!({"max_tokens": 256}),
        status: BaseStatus::Active,
        created_at_ms: T0,
        updated_at_ms: T0,
    }
}

fn item(b: &str, id: &str, parent: Option<&str>, kind: ItemKind, node: &str) -> KbItem {
    KbItem {
        base: b.into(),
        id: id.into(),
        parent_id: parent.map(str::to_owned),
        kind,
        source: format!("/src/{id}"),
        node_uri: uri(&format!("ctx://acct/resources/{b}/{node}")),
        status: ItemStatus::Idle,
        error: None,
        through_seq: None,
        fingerprint: None,
        created_at_ms: T0,
        updated_at_ms: T0,
    }
}

fn kb(s: &dyn SourceStore, ops: Vec<KbOp>) -> ce_store::Result<Vec<ce_store::WriteOutcome>> {
    s.apply_batch(ops.into_iter().map(WriteOp::Kb).collect())
}

fn status(s: &dyn SourceStore, b: &str, id: &str) -> ItemStatus {
    s.kb_item(b, id).expect("item").status
}

/// A directory `d` with a file `d1` and a sub-directory `d2` holding `d3`, and a file `f`.
fn tree(s: &dyn SourceStore) {
    kb(
        s,
        vec![
            KbOp::CreateBase(base("docs")),
            KbOp::InsertItem(item("docs", "d", None, ItemKind::Directory, "d")),
            KbOp::InsertItem(item("docs", "d1", Some("d"), ItemKind::File, "d/a.md")),
            KbOp::InsertItem(item("docs", "d2", Some("d"), ItemKind::Directory, "d/sub")),
            KbOp::InsertItem(item("docs", "d3", Some("d2"), ItemKind::File, "d/sub/b.md")),
            KbOp::InsertItem(item("docs", "f", None, ItemKind::File, "f.md")),
        ],
    )
    .expect("tree");
}

fn bases_and_items_round_trip_and_embedding_records_the_journal_position(backend: Backend) {
    let (_p, s, _clock) = common::fresh(backend, Config::default());
    tree(s.as_ref());
    let b = s.kb_base("docs").expect("base");
    assert_eq!(b, base("docs"));
    assert_eq!(s.kb_bases().expect("bases"), vec![base("docs")]);
    let items = s.kb_items("docs").expect("items");
    let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["d", "d1", "d2", "d3", "f"]);
    assert_eq!(
        items[3],
        item("docs", "d3", Some("d2"), ItemKind::File, "d/sub/b.md")
    );

    // A node write, then `embedding` in the same batch: the item records the journal
    // position that the batch reached.
    let out = s
        .apply_batch(vec![
            WriteOp::Put {
                uri: uri("ctx://acct/resources/docs/f.md"),
                req: PutRequest {
                    content: Some("hello".into()),
                    ..PutRequest::default()
                },
            },
            WriteOp::Kb(KbOp::SetStatus {
                base: "docs".into(),
                item: "f".into(),
                status: ItemStatus::Embedding,
                error: None,
            }),
        ])
        .expect("commit");
    assert!(!out[0].event_ids.is_empty());
    let f = s.kb_item("docs", "f").expect("f");
    assert_eq!(f.status, ItemStatus::Embedding);
    let last_seq = common::all_events(s.as_ref()).keys().max().copied();
    assert_eq!(f.through_seq, last_seq, "through the batch's last event");
    assert!(
        !s.applied_through(
            &Config::default().index.outbox.consumers,
            f.through_seq.unwrap_or(0)
        )
        .expect("applied")
    );

    // A failure keeps its error; the next status clears it.
    let err = ItemError {
        code: "parse_error".into(),
        message: "parse error: pdf input cannot be read".into(),
    };
    kb(
        s.as_ref(),
        vec![KbOp::SetStatus {
            base: "docs".into(),
            item: "d1".into(),
            status: ItemStatus::Failed,
            error: Some(err.clone()),
        }],
    )
    .expect("fail");
    assert_eq!(s.kb_item("docs", "d1").expect("d1").error, Some(err));
    assert_eq!(s.kb_items_in(ItemStatus::Failed).expect("failed").len(), 1);
    kb(
        s.as_ref(),
        vec![KbOp::SetStatus {
            base: "docs".into(),
            item: "d1".into(),
            status: ItemStatus::Idle,
            error: None,
        }],
    )
    .expect("reset");
    assert_eq!(s.kb_item("docs", "d1").expect("d1").error, None);

    // The fingerprint round-trips, survives status changes, and is cleared by `None`; a
    // missing item is stale.
    let set = |fp: Option<&str>| KbOp::SetFingerprint {
        base: "docs".into(),
        item: "d3".into(),
        fingerprint: fp.map(str::to_owned),
    };
    kb(s.as_ref(), vec![set(Some("abc123"))]).expect("set");
    kb(
        s.as_ref(),
        vec![KbOp::SetStatus {
            base: "docs".into(),
            item: "d3".into(),
            status: ItemStatus::Completed,
            error: None,
        }],
    )
    .expect("complete");
    let d3 = s.kb_item("docs", "d3").expect("d3");
    assert_eq!(
        (d3.status, d3.fingerprint.as_deref()),
        (ItemStatus::Completed, Some("abc123"))
    );
    assert_eq!(
        s.kb_children("docs", "d2").expect("children"),
        vec![d3.clone()]
    );
    let kids: Vec<String> = s
        .kb_children("docs", "d")
        .expect("children")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(kids, ["d1", "d2"]);
    kb(s.as_ref(), vec![set(None)]).expect("clear");
    assert_eq!(s.kb_item("docs", "d3").expect("d3").fingerprint, None);
    let missing = KbOp::SetFingerprint {
        base: "docs".into(),
        item: "nope".into(),
        fingerprint: Some("x".into()),
    };
    assert!(matches!(
        kb(s.as_ref(), vec![missing]),
        Err(StoreError::KbStale { status: None, .. })
    ));
}

fn each_op_checks_its_preconditions_and_a_failed_check_writes_nothing(backend: Backend) {
    let (_p, s, _clock) = common::fresh(backend, Config::default());
    tree(s.as_ref());
    let code = |r: ce_store::Result<Vec<ce_store::WriteOutcome>>| match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => (e.code(), e.is_retryable()),
    };
    // A taken name, a bad name, a root that is an account.
    assert_eq!(
        code(kb(s.as_ref(), vec![KbOp::CreateBase(base("docs"))])),
        (ErrorCode::AlreadyExists, false)
    );
    let mut bad = base("Bad Name");
    bad.root = uri("ctx://acct/resources/x");
    assert_eq!(
        code(kb(s.as_ref(), vec![KbOp::CreateBase(bad)])),
        (ErrorCode::InvalidField, false)
    );
    let mut top = base("top");
    top.root = uri("ctx://acct");
    assert_eq!(
        code(kb(s.as_ref(), vec![KbOp::CreateBase(top)])),
        (ErrorCode::InvalidField, false)
    );
    // An item of a missing base, outside its base, owning a taken node, under a missing parent.
    let e = kb(
        s.as_ref(),
        vec![KbOp::InsertItem(item(
            "nope",
            "x",
            None,
            ItemKind::File,
            "x",
        ))],
    )
    .expect_err("no base");
    assert!(matches!(e, StoreError::KbNotFound { .. }), "{e}");
    let mut outside = item("docs", "x", None, ItemKind::File, "x");
    outside.node_uri = uri("ctx://acct/elsewhere/x");
    assert_eq!(
        code(kb(s.as_ref(), vec![KbOp::InsertItem(outside)])),
        (ErrorCode::InvalidField, false)
    );
    // Taken node: the first insert of the batch is rolled back with it.
    let e = kb(
        s.as_ref(),
        vec![
            KbOp::InsertItem(item("docs", "new", None, ItemKind::File, "new.md")),
            KbOp::InsertItem(item("docs", "dup", None, ItemKind::File, "f.md")),
        ],
    )
    .expect_err("taken");
    assert!(matches!(e, StoreError::KbRefused { .. }), "{e}");
    assert!(
        s.kb_item("docs", "new").is_err(),
        "nothing of the batch stays"
    );
    let e = kb(
        s.as_ref(),
        vec![KbOp::InsertItem(item(
            "docs",
            "x",
            Some("ghost"),
            ItemKind::File,
            "x",
        ))],
    )
    .expect_err("no parent");
    assert!(matches!(e, StoreError::KbStale { status: None, .. }), "{e}");
    // A deleting base takes no items, and keeps its rows until they are gone.
    kb(
        s.as_ref(),
        vec![KbOp::MarkBaseDeleting {
            base: "docs".into(),
        }],
    )
    .expect("mark");
    let e = kb(
        s.as_ref(),
        vec![KbOp::InsertItem(item(
            "docs",
            "x",
            None,
            ItemKind::File,
            "x",
        ))],
    )
    .expect_err("deleting");
    assert!(matches!(e, StoreError::KbRefused { .. }), "{e}");
    assert_eq!(
        code(kb(
            s.as_ref(),
            vec![KbOp::DeleteBase {
                base: "docs".into()
            }]
        )),
        (ErrorCode::StateTransition, false)
    );
    kb(
        s.as_ref(),
        vec![KbOp::DeleteItems {
            base: "docs".into(),
            ids: vec!["d".into(), "f".into()],
        }],
    )
    .expect("rows");
    let out = kb(
        s.as_ref(),
        vec![KbOp::DeleteBase {
            base: "docs".into(),
        }],
    )
    .expect("base");
    assert!(out[0].changed);
    let again = kb(
        s.as_ref(),
        vec![KbOp::DeleteBase {
            base: "docs".into(),
        }],
    )
    .expect("again");
    assert!(!again[0].changed, "a missing base is done already");
    assert!(matches!(
        s.kb_base("docs"),
        Err(StoreError::KbNotFound { .. })
    ));
}

fn subtrees_are_marked_deleting_and_deleted_leaves_first(backend: Backend) {
    let (_p, s, _clock) = common::fresh(backend, Config::default());
    tree(s.as_ref());
    kb(
        s.as_ref(),
        vec![KbOp::SetStatus {
            base: "docs".into(),
            item: "d3".into(),
            status: ItemStatus::Failed,
            error: Some(ItemError {
                code: "parse_error".into(),
                message: "bad".into(),
            }),
        }],
    )
    .expect("failed");
    kb(
        s.as_ref(),
        vec![KbOp::MarkDeleting {
            base: "docs".into(),
            root: "d2".into(),
        }],
    )
    .expect("mark d2");
    assert_eq!(status(s.as_ref(), "docs", "d2"), ItemStatus::Deleting);
    assert_eq!(status(s.as_ref(), "docs", "d3"), ItemStatus::Deleting);
    assert_eq!(
        s.kb_item("docs", "d3").expect("d3").error,
        None,
        "deleting clears the error"
    );
    assert_eq!(status(s.as_ref(), "docs", "d"), ItemStatus::Idle);
    let roots: Vec<String> = s
        .kb_deleting_roots()
        .expect("roots")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(roots, ["d2"]);
    // Marking the whole directory later: its own root is the one left to clean.
    kb(
        s.as_ref(),
        vec![KbOp::MarkDeleting {
            base: "docs".into(),
            root: "d".into(),
        }],
    )
    .expect("mark d");
    let roots: Vec<String> = s
        .kb_deleting_roots()
        .expect("roots")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(roots, ["d"]);
    // Marking a missing item is done already.
    let out = kb(
        s.as_ref(),
        vec![KbOp::MarkDeleting {
            base: "docs".into(),
            root: "ghost".into(),
        }],
    )
    .expect("ghost");
    assert!(!out[0].changed);
    kb(
        s.as_ref(),
        vec![KbOp::DeleteItems {
            base: "docs".into(),
            ids: vec!["d".into()],
        }],
    )
    .expect("delete");
    let left: Vec<String> = s
        .kb_items("docs")
        .expect("items")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(left, ["f"]);
    let again = kb(
        s.as_ref(),
        vec![KbOp::DeleteItems {
            base: "docs".into(),
            ids: vec!["d".into()],
        }],
    )
    .expect("again");
    assert!(!again[0].changed, "a missing row counts as done");
    assert!(s.kb_deleting_roots().expect("roots").is_empty());
}

fn the_stale_guard_fails_the_whole_batch_nodes_and_jobs_included(backend: Backend) {
    let (_p, s, _clock) = common::fresh(backend, Config::default());
    tree(s.as_ref());
    kb(
        s.as_ref(),
        vec![KbOp::MarkDeleting {
            base: "docs".into(),
            root: "f".into(),
        }],
    )
    .expect("mark");
    let events_before = common::all_events(s.as_ref()).len();
    let batch = |item: &str| {
        vec![
            WriteOp::Kb(KbOp::Guard {
                base: "docs".into(),
                item: item.into(),
                refuse: vec![ItemStatus::Deleting],
            }),
            WriteOp::Put {
                uri: uri("ctx://acct/resources/docs/f.md"),
                req: PutRequest {
                    content: Some("resurrected?".into()),
                    ..PutRequest::default()
                },
            },
            WriteOp::Kb(KbOp::SetStatus {
                base: "docs".into(),
                item: item.into(),
                status: ItemStatus::Embedding,
                error: None,
            }),
            WriteOp::Enqueue(JobSpec {
                job_type: "kb-index-documents".into(),
                payload: json!({"base": "docs", "item": item}),
                idempotency_key: Some(format!("kb:docs:{item}:index")),
                run_at_ms: None,
                parent_job_id: None,
            }),
        ]
    };
    for (who, want) in [("f", Some(ItemStatus::Deleting)), ("gone", None)] {
        let e = s.apply_batch(batch(who)).expect_err("stale");
        match &e {
            StoreError::KbStale { status, .. } => assert_eq!(*status, want, "{e}"),
            other => panic!("expected the stale guard, got {other}"),
        }
        assert_eq!(
            (e.code(), e.is_retryable()),
            (ErrorCode::StateTransition, false)
        );
    }
    assert!(
        s.read_node(&uri("ctx://acct/resources/docs/f.md"))
            .expect("read")
            .is_none(),
        "no node"
    );
    let events = common::all_events(s.as_ref()).len();
    assert_eq!(events, events_before, "no event");
    assert!(
        s.list_jobs(&JobFilter {
            limit: 100,
            ..JobFilter::default()
        })
        .expect("jobs")
        .is_empty(),
        "no job"
    );
    assert_eq!(
        status(s.as_ref(), "docs", "f"),
        ItemStatus::Deleting,
        "still deleting"
    );
    // The same batch for a live item commits all of it.
    s.apply_batch(batch("d1")).expect("live");
    assert_eq!(status(s.as_ref(), "docs", "d1"), ItemStatus::Embedding);
    assert_eq!(
        s.list_jobs(&JobFilter {
            limit: 100,
            ..JobFilter::default()
        })
        .expect("jobs")
        .len(),
        1
    );
}

fn the_overview_counts_items_by_base_and_status_and_keeps_the_latest_failures(backend: Backend) {
    let (_p, s, clock) = common::fresh(backend, Config::default());
    tree(s.as_ref());
    kb(
        s.as_ref(),
        vec![
            KbOp::CreateBase(base("empty")),
            KbOp::CreateBase(base("notes")),
            KbOp::InsertItem(item("notes", "n1", None, ItemKind::Note, "n1")),
        ],
    )
    .expect("more bases");
    // docs: d1, d3 and f fail one after the other (f last), d2 completes, d stays idle;
    // notes: its one item is deleting.
    let fail = |id: &str, code: &str| {
        clock.advance(1000);
        kb(
            s.as_ref(),
            vec![KbOp::SetStatus {
                base: "docs".into(),
                item: id.into(),
                status: ItemStatus::Failed,
                error: Some(ItemError {
                    code: code.into(),
                    message: format!("{id} went wrong"),
                }),
            }],
        )
        .expect("fail");
    };
    fail("d1", "parse_error");
    fail("d3", "unsupported_format");
    fail("f", "upstream");
    kb(
        s.as_ref(),
        vec![KbOp::SetStatus {
            base: "docs".into(),
            item: "d2".into(),
            status: ItemStatus::Completed,
            error: None,
        }],
    )
    .expect("complete");
    kb(
        s.as_ref(),
        vec![KbOp::MarkDeleting {
            base: "notes".into(),
            root: "n1".into(),
        }],
    )
    .expect("delete");

    let all = s.kb_overview(2).expect("overview");
    let names: Vec<&str> = all.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["docs", "empty", "notes"]);
    let count = |o: &ce_store::KbOverview, st: ItemStatus| o.counts[&st];
    let docs = &all[0];
    assert_eq!(
        docs.counts.len(),
        ItemStatus::ALL.len(),
        "every status listed"
    );
    assert_eq!(count(docs, ItemStatus::Failed), 3);
    assert_eq!(count(docs, ItemStatus::Completed), 1);
    assert_eq!(count(docs, ItemStatus::Idle), 1, "d");
    assert_eq!(docs.counts.values().sum::<u64>(), 5);
    // The two most recent failures, newest first.
    let failed: Vec<(&str, &str)> = docs
        .recent_failures
        .iter()
        .map(|f| (f.id.as_str(), f.error.code.as_str()))
        .collect();
    assert_eq!(failed, [("f", "upstream"), ("d3", "unsupported_format")]);
    assert_eq!(docs.recent_failures[0].error.message, "f went wrong");
    assert_eq!(docs.recent_failures[0].kind, ItemKind::File);
    assert_eq!(
        docs.recent_failures[0].node_uri,
        uri("ctx://acct/resources/docs/f.md")
    );
    assert!(docs.recent_failures[0].at_ms > docs.recent_failures[1].at_ms);
    assert!(all[1].counts.values().all(|&n| n == 0), "{:?}", all[1]);
    assert!(all[1].recent_failures.is_empty());
    assert_eq!(count(&all[2], ItemStatus::Deleting), 1);
    assert_eq!(all[2].counts.values().sum::<u64>(), 1);
    // No failures asked for: counts only.
    assert!(
        s.kb_overview(0)
            .expect("overview")
            .iter()
            .all(|o| o.recent_failures.is_empty())
    );
}
