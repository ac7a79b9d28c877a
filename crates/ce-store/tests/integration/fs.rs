//! Source-of-truth semantics through the traits: put modes, implicit ancestors, versions,
//! rm, mv, relations, optimistic concurrency and limits. Every rejected operation must leave
//! the whole store (nodes, edges, events, deliveries) exactly as it was.

use ce_core::{
    Classify, Config, ContextNode, CtxUri, ErrorCode, EventPayload, OwnerSpace, RelationMode,
    UpsertReason, test_cases,
};
use ce_store::{
    LinkRequest, PutMode, PutRequest, SourceStore, StoreError, UriVersion, WriteFence, WriteOp,
    WriteOutcome,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::{
    self, Backend, Place, Store, assert_invariants, assert_rejected, backend_tests, snapshot, uri,
};

backend_tests!(
    put_creates_missing_ancestors_as_containers_with_their_own_events,
    put_modes_replace_merge_append_and_identical_writes,
    rm_refuses_non_empty_nodes_and_removes_subtrees_with_one_event,
    mv_rewrites_the_subtree_and_its_relations,
    mv_rederives_path_attributes_unless_set_explicitly,
    mv_refuses_targets_that_make_descendant_uris_too_long,
    relations_link_unlink_and_versions,
    expect_version_is_checked_before_anything_is_written,
    oversize_text_is_refused_whole,
    bad_input_is_refused_without_harm,
    random_writes_keep_the_invariants,
    apply_batch_is_all_or_nothing,
    writes_under_an_older_fencing_token_are_refused,
    a_hold_lasts_until_its_batch_is_applied_by_the_named_consumers,
    a_batch_writes_over_what_it_removed,
);

fn store(backend: Backend) -> (Place, Store, ce_core::ManualClock) {
    common::fresh(backend, common::two_consumers())
}

fn text(content: &str) -> PutRequest {
    PutRequest {
        content: Some(content.into()),
        ..PutRequest::default()
    }
}

fn put(s: &dyn SourceStore, u: &str, content: &str) -> WriteOutcome {
    s.put(&uri(u), text(content)).expect("put")
}

fn node(s: &dyn SourceStore, u: &str) -> ContextNode {
    s.read_node(&uri(u))
        .expect("read")
        .unwrap_or_else(|| panic!("{u} is missing"))
}

fn absent(s: &dyn SourceStore, u: &str) -> bool {
    s.read_node(&uri(u)).expect("read").is_none()
}

fn link(from: &str, to: &str, t: &str) -> LinkRequest {
    LinkRequest {
        from: uri(from),
        to: uri(to),
        relation_type: t.into(),
        weight: 1.0,
        reason: String::new(),
        trace_id: None,
    }
}

/// The payloads of the events an outcome reports, in order.
fn payloads(s: &dyn SourceStore, out: &WriteOutcome) -> Vec<EventPayload> {
    out.event_ids
        .iter()
        .map(|id| s.show(id).expect("reported event exists").0.payload)
        .collect()
}

fn upsert(p: &EventPayload) -> (String, u64, UpsertReason) {
    match p {
        EventPayload::UpsertContext(u) => (u.uri.to_string(), u.expected_node_version, u.reason),
        other => panic!("expected UPSERT_CONTEXT, got {other:?}"),
    }
}

fn relation(p: &EventPayload) -> (String, u64) {
    match p {
        EventPayload::UpsertRelation(r) => {
            assert_eq!(r.mode, RelationMode::Replace);
            (r.uri.to_string(), r.relation_version)
        }
        other => panic!("expected UPSERT_RELATION, got {other:?}"),
    }
}

fn edges(s: &dyn SourceStore, u: &str) -> Vec<(String, String, String)> {
    s.get_edges(&uri(u))
        .expect("edges")
        .into_iter()
        .map(|e| {
            (
                e.from_uri.to_string(),
                e.to_uri.to_string(),
                e.relation_type,
            )
        })
        .collect()
}

fn edge(from: &str, to: &str, t: &str) -> (String, String, String) {
    (from.to_owned(), to.to_owned(), t.to_owned())
}

fn put_creates_missing_ancestors_as_containers_with_their_own_events(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    let mut req = text("body");
    req.abstract_text = Some("abstract".into());
    req.meta.insert("k".into(), json!(1));
    let out = s.put(&uri("ctx://acc/docs/guide/intro"), req).expect("put");
    assert!(out.changed);
    assert_eq!(out.version, 1);
    assert_eq!(out.nodes_affected, 4);
    let ev: Vec<_> = payloads(s, &out).iter().map(upsert).collect();
    assert_eq!(
        ev,
        [
            ("ctx://acc".to_owned(), 1, UpsertReason::Create),
            ("ctx://acc/docs".to_owned(), 1, UpsertReason::Create),
            ("ctx://acc/docs/guide".to_owned(), 1, UpsertReason::Create),
            (
                "ctx://acc/docs/guide/intro".to_owned(),
                1,
                UpsertReason::Create
            ),
        ],
        "ancestors first, each with its own create event, then the node"
    );
    for c in ["ctx://acc", "ctx://acc/docs", "ctx://acc/docs/guide"] {
        let n = node(s, c);
        assert!(
            n.layers.is_empty() && n.meta.is_empty(),
            "{c} is a bare container"
        );
        assert_eq!(n.version, 1);
        assert_eq!(n.parent_uri, uri(c).parent().expect("parent"));
    }
    let n = node(s, "ctx://acc/docs/guide/intro");
    assert_eq!(
        (n.layers.abstract_text.as_str(), n.layers.content.as_str()),
        ("abstract", "body")
    );
    assert_eq!(n.content_hash, n.layers.content_hash());
    assert_eq!(n.parent_uri, uri("ctx://acc/docs/guide"));
    assert_eq!(n.meta.get("k"), Some(&json!(1)));

    // A sibling under existing ancestors appends exactly one event.
    let out = put(s, "ctx://acc/docs/guide/setup", "x");
    assert_eq!(payloads(s, &out).len(), 1);
    assert_eq!(
        s.stat(&uri("ctx://acc/docs/guide")).expect("stat").children,
        2
    );
    let names: Vec<String> = s
        .ls(&uri("ctx://acc/docs/guide"))
        .expect("ls")
        .into_iter()
        .map(|n| n.uri.to_string())
        .collect();
    assert_eq!(
        names,
        ["ctx://acc/docs/guide/intro", "ctx://acc/docs/guide/setup"]
    );
    assert_eq!(
        common::all_events(s).len(),
        5,
        "no event beyond the reported ones"
    );
    assert_invariants(s);
}

fn put_modes_replace_merge_append_and_identical_writes(backend: Backend) {
    let (_d, s, clock) = store(backend);
    let s = s.as_ref();
    let u = "ctx://acc/n";
    let mut req = text("c1");
    req.abstract_text = Some("A".into());
    req.overview = Some("O".into());
    req.meta.insert("a".into(), json!(1));
    req.meta.insert("b".into(), json!(2));
    let v1 = s.put(&uri(u), req.clone()).expect("create");
    assert_eq!(v1.version, 1);

    // The identical write changes nothing at all: no version, no event, no timestamp.
    clock.advance(1000);
    let before = snapshot(s);
    let same = s.put(&uri(u), req).expect("identical put");
    assert_eq!(
        (same.changed, same.version, same.event_ids.len()),
        (false, 1, 0)
    );
    assert!(snapshot(s) == before, "an identical put changed the store");

    let mut merge = PutRequest {
        mode: PutMode::Merge,
        ..PutRequest::default()
    };
    merge.overview = Some("O2".into());
    merge.meta.insert("b".into(), serde_json::Value::Null);
    merge.meta.insert("c".into(), json!(3));
    let v2 = s.put(&uri(u), merge).expect("merge");
    assert_eq!(v2.version, 2);
    assert_eq!(
        payloads(s, &v2).iter().map(upsert).collect::<Vec<_>>(),
        [(u.into(), 2, UpsertReason::Merge)]
    );
    let n = node(s, u);
    assert_eq!(
        (
            n.layers.abstract_text.as_str(),
            n.layers.overview.as_str(),
            n.layers.content.as_str()
        ),
        ("A", "O2", "c1")
    );
    assert_eq!(
        n.meta,
        [("a".to_owned(), json!(1)), ("c".to_owned(), json!(3))]
            .into_iter()
            .collect()
    );

    let empty_merge = PutRequest {
        mode: PutMode::Merge,
        ..PutRequest::default()
    };
    assert!(!s.put(&uri(u), empty_merge).expect("empty merge").changed);

    let append = PutRequest {
        mode: PutMode::Append,
        content: Some("+c2".into()),
        ..PutRequest::default()
    };
    let v3 = s.put(&uri(u), append).expect("append");
    assert_eq!(
        payloads(s, &v3).iter().map(upsert).collect::<Vec<_>>(),
        [(u.into(), 3, UpsertReason::Append)]
    );
    let n = node(s, u);
    assert_eq!(
        (n.layers.content.as_str(), n.layers.overview.as_str()),
        ("c1+c2", "O2")
    );

    let v4 = s.put(&uri(u), text("x")).expect("replace");
    assert_eq!(
        payloads(s, &v4).iter().map(upsert).collect::<Vec<_>>(),
        [(u.into(), 4, UpsertReason::Replace)]
    );
    let n = node(s, u);
    assert_eq!(
        (
            n.layers.abstract_text.as_str(),
            n.layers.overview.as_str(),
            n.layers.content.as_str()
        ),
        ("", "", "x"),
        "replace drops the layers it does not give"
    );
    assert!(n.meta.is_empty(), "replace drops meta");
    assert_eq!(n.version, 4);
    assert_eq!(n.content_hash, n.layers.content_hash());

    // A meta-only change is a change.
    let mut meta_only = text("x");
    meta_only.meta.insert("z".into(), json!("y"));
    assert_eq!(s.put(&uri(u), meta_only).expect("meta").version, 5);
    assert_eq!(
        common::all_events(s).len(),
        6,
        "the account's event plus one per changing write"
    );
    assert_invariants(s);
}

fn rm_refuses_non_empty_nodes_and_removes_subtrees_with_one_event(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    put(s, "ctx://acc/p/x", "x");
    put(s, "ctx://acc/p/x/a", "a");
    put(s, "ctx://acc/p/x/a/b", "b");
    put(s, "ctx://acc/o", "o");
    put(s, "ctx://acc/o2", "o2");
    for (f, t) in [
        ("ctx://acc/o", "ctx://acc/p/x/a"),
        ("ctx://acc/o2", "ctx://acc/p/x"),
        ("ctx://acc/p/x/a", "ctx://acc/o"),
        ("ctx://acc/p/x/a/b", "ctx://acc/p/x"),
        ("ctx://acc/o", "ctx://acc/o2"),
    ] {
        s.link(link(f, t, "refs")).expect("link");
    }
    let x = node(s, "ctx://acc/p/x");
    let (o_rv, o2_rv) = (
        node(s, "ctx://acc/o").relation_version,
        node(s, "ctx://acc/o2").relation_version,
    );

    let err = assert_rejected(s, ErrorCode::NotEmpty, false, |s| {
        s.rm(&uri("ctx://acc/p/x"), false, None, None)
    });
    assert!(
        matches!(err, StoreError::NotEmpty { children: 1, .. }),
        "{err}"
    );
    assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.rm(&uri("ctx://acc/p/x"), true, Some(x.version + 1), None)
    });
    // An rm of a path the source lacks is refused, but still queues the removal of index
    // records left behind under it (OpenViking #3064): one recursive DELETE, nothing else.
    let before = snapshot(s);
    let err = s
        .rm(&uri("ctx://acc/nope"), false, None, None)
        .expect_err("rm of a missing node");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let after = snapshot(s);
    assert_eq!((&after.nodes, &after.edges), (&before.nodes, &before.edges));
    let added: Vec<_> = after.outbox[before.outbox.len()..]
        .iter()
        .map(|d| d.event.payload.clone())
        .collect();
    assert!(!added.is_empty(), "no cleanup event");
    for p in added {
        match p {
            EventPayload::DeleteContext(d) => {
                assert_eq!(d.uri, uri("ctx://acc/nope"));
                assert!(d.recursive, "cleanup covers the subtree");
            }
            other => panic!("unexpected cleanup event {other:?}"),
        }
    }
    assert_rejected(s, ErrorCode::InvalidUri, false, |s| {
        s.rm(&CtxUri::root(), true, None, None)
    });

    let out = s
        .rm(&uri("ctx://acc/p/x"), true, Some(x.version), None)
        .expect("rm -r");
    assert_eq!(
        (out.version, out.nodes_affected, out.changed),
        (x.version, 3, true)
    );
    let ev = payloads(s, &out);
    assert_eq!(
        ev.len(),
        3,
        "one DELETE_CONTEXT and one UPSERT_RELATION per outside owner: {ev:?}"
    );
    match &ev[0] {
        EventPayload::DeleteContext(d) => {
            assert_eq!(d.uri, uri("ctx://acc/p/x"));
            assert_eq!(d.expected_deleted_version, x.version);
            assert!(d.recursive);
        }
        other => panic!("expected DELETE_CONTEXT first, got {other:?}"),
    }
    assert_eq!(
        ev[1..].iter().map(relation).collect::<Vec<_>>(),
        [
            ("ctx://acc/o".to_owned(), o_rv + 1),
            ("ctx://acc/o2".to_owned(), o2_rv + 1)
        ]
    );
    for gone in ["ctx://acc/p/x", "ctx://acc/p/x/a", "ctx://acc/p/x/a/b"] {
        assert!(absent(s, gone), "{gone} survived rm -r");
    }
    assert_eq!(
        edges(s, "ctx://acc/o"),
        [edge("ctx://acc/o", "ctx://acc/o2", "refs")]
    );
    assert!(
        s.relations(&uri("ctx://acc/o"))
            .expect("relations")
            .incoming
            .is_empty()
    );
    assert!(
        edges(s, "ctx://acc/p/x/a").is_empty(),
        "edges of removed nodes are gone"
    );
    assert_invariants(s);

    // A re-created URI continues above the removed version (a stale DELETE can never hit it).
    let old_b = 1;
    let out = put(s, "ctx://acc/p/x/a/b", "again");
    assert!(out.version > old_b);
    assert!(node(s, "ctx://acc/p/x").version > x.version);
    assert!(node(s, "ctx://acc/p/x/a").version > 1);

    // A leaf goes without `recursive`; its incoming edges' owners are announced.
    let o_rv = node(s, "ctx://acc/o").relation_version;
    let out = s
        .rm(&uri("ctx://acc/o2"), false, None, None)
        .expect("rm leaf");
    let ev = payloads(s, &out);
    assert!(
        matches!(&ev[0], EventPayload::DeleteContext(d) if !d.recursive && d.expected_deleted_version == 1)
    );
    assert_eq!(
        ev[1..].iter().map(relation).collect::<Vec<_>>(),
        [("ctx://acc/o".to_owned(), o_rv + 1)]
    );
    assert_invariants(s);
}

fn mv_rewrites_the_subtree_and_its_relations(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    let mut req = text("xc");
    req.abstract_text = Some("X".into());
    s.put(&uri("ctx://acc/p/x"), req).expect("put");
    let mut req = text("ac");
    req.meta.insert("m".into(), json!("v"));
    s.put(&uri("ctx://acc/p/x/a"), req).expect("put");
    put(s, "ctx://acc/p/x/a/b", "bc");
    put(s, "ctx://acc/o", "o");
    s.link(link("ctx://acc/o", "ctx://acc/p/x/a", "refs"))
        .expect("link");
    s.link(link("ctx://acc/p/x/a", "ctx://acc/o", "refs"))
        .expect("link");
    s.link(link("ctx://acc/p/x/a/b", "ctx://acc/p/x/a", "part_of"))
        .expect("link");
    let before: Vec<ContextNode> = s.read_subtree(&uri("ctx://acc/p/x")).expect("subtree");
    let o_rv = node(s, "ctx://acc/o").relation_version;

    let (from, to) = (uri("ctx://acc/p/x"), uri("ctx://acc/q/y"));
    let out = s.mv(&from, &to, None).expect("mv");
    assert_eq!(
        (out.uri.clone(), out.changed, out.nodes_affected),
        (to.clone(), true, 3)
    );
    assert_eq!(out.version, node(s, "ctx://acc/q/y").version);
    let ev = payloads(s, &out);
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(
        upsert(&ev[0]),
        ("ctx://acc/q".to_owned(), 1, UpsertReason::Create),
        "new ancestor first"
    );
    match &ev[1] {
        EventPayload::MoveContext(m) => {
            assert_eq!((&m.from_uri, &m.to_uri), (&from, &to));
            assert_eq!(m.old_parent_uri, uri("ctx://acc/p"));
            assert_eq!(m.new_parent_uri, uri("ctx://acc/q"));
            assert!(m.recursive);
        }
        other => panic!("expected MOVE_CONTEXT, got {other:?}"),
    }
    assert_eq!(
        relation(&ev[2]),
        ("ctx://acc/o".to_owned(), o_rv + 1),
        "outside owner announced"
    );

    for old in &before {
        let new_uri = old.uri.rebase(&from, &to).expect("within");
        assert!(absent(s, old.uri.as_str()), "{} still exists", old.uri);
        let n = s
            .read_node(&new_uri)
            .expect("read")
            .unwrap_or_else(|| panic!("{new_uri} missing"));
        assert_eq!(n.layers, old.layers, "layers kept for {new_uri}");
        assert_eq!(n.meta, old.meta);
        assert_eq!(n.parent_uri, new_uri.parent().expect("parent"));
        assert!(
            n.version > old.version,
            "{new_uri} version {} not above {}",
            n.version,
            old.version
        );
        assert_eq!(n.relation_version, old.relation_version);
    }
    assert_eq!(
        edges(s, "ctx://acc/o"),
        [edge("ctx://acc/o", "ctx://acc/q/y/a", "refs")]
    );
    assert_eq!(
        edges(s, "ctx://acc/q/y/a"),
        [edge("ctx://acc/q/y/a", "ctx://acc/o", "refs")]
    );
    assert_eq!(
        edges(s, "ctx://acc/q/y/a/b"),
        [edge("ctx://acc/q/y/a/b", "ctx://acc/q/y/a", "part_of")]
    );
    assert!(edges(s, "ctx://acc/p/x/a").is_empty());
    assert_invariants(s);

    // Rejected moves change nothing.
    assert_rejected(s, ErrorCode::InvalidMove, false, |s| {
        s.mv(&to, &uri("ctx://acc/q/y/a/z"), None)
    });
    assert_rejected(s, ErrorCode::AlreadyExists, false, |s| {
        s.mv(&to, &uri("ctx://acc/o"), None)
    });
    assert_rejected(s, ErrorCode::AlreadyExists, false, |s| {
        s.mv(&uri("ctx://acc/q/y/a/b"), &uri("ctx://acc/q"), None)
    });
    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.mv(&uri("ctx://acc/nope"), &uri("ctx://acc/z"), None)
    });
    assert_rejected(s, ErrorCode::InvalidMove, false, |s| {
        s.mv(&CtxUri::root(), &uri("ctx://acc/z"), None)
    });
    assert_rejected(s, ErrorCode::InvalidMove, false, |s| {
        s.mv(&to, &CtxUri::root(), None)
    });
    let before = snapshot(s);
    let same = s.mv(&to, &to, None).expect("mv onto itself");
    assert!(!same.changed && same.event_ids.is_empty());
    assert!(snapshot(s) == before);

    // Moving back continues every version above both the moved node and the tombstone.
    let at_y: Vec<ContextNode> = s.read_subtree(&to).expect("subtree");
    let uris_at_y: Vec<CtxUri> = at_y.iter().map(|n| n.uri.clone()).collect();
    assert_eq!(uris_at_y.len(), 3);
    assert_eq!(s.subtree_uris(&to).expect("uris"), uris_at_y);
    assert!(s.subtree_uris(&from).expect("uris").is_empty());
    s.mv(&to, &from, None).expect("mv back");
    for n in &at_y {
        let back = n.uri.rebase(&to, &from).expect("within");
        assert!(node(s, back.as_str()).version > n.version);
    }
    assert_invariants(s);
}

fn mv_rederives_path_attributes_unless_set_explicitly(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    put(s, "ctx://acc/users/u1/memories/prefs/theme", "dark");
    let mut req = text("x");
    req.owner_space = Some(OwnerSpace::Shared);
    s.put(&uri("ctx://acc/users/u1/memories/prefs/lang"), req)
        .expect("put");
    s.mv(
        &uri("ctx://acc/users/u1/memories"),
        &uri("ctx://acc/users/u2/memories"),
        None,
    )
    .expect("mv");
    assert_eq!(
        node(s, "ctx://acc/users/u2/memories/prefs/theme").owner_space,
        OwnerSpace::User("u2".into())
    );
    assert_eq!(
        node(s, "ctx://acc/users/u2/memories/prefs/lang").owner_space,
        OwnerSpace::Shared
    );
    assert_invariants(s);
}

/// A move whose rebased descendants would exceed the URI length limit must be refused: the
/// store cannot hold URIs that `CtxUri::parse` rejects (reading them back would fail).
fn mv_refuses_targets_that_make_descendant_uris_too_long(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    let leaf = "l".repeat(200);
    put(s, &format!("ctx://acc/x/{leaf}"), "deep");
    let to = format!(
        "ctx://acc/{}",
        "t".repeat(ce_core::uri::MAX_URI_BYTES - "ctx://acc/".len())
    );
    assert_eq!(to.len(), ce_core::uri::MAX_URI_BYTES);
    assert_rejected(s, ErrorCode::InvalidUri, false, |s| {
        s.mv(&uri("ctx://acc/x"), &uri(&to), None)
    });
    assert_invariants(s);
}

fn relations_link_unlink_and_versions(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    put(s, "ctx://acc/a", "a");
    put(s, "ctx://acc/b", "b");
    let a_version = node(s, "ctx://acc/a").version;

    let out = s
        .link(link("ctx://acc/a", "ctx://acc/b", "refs"))
        .expect("link");
    assert_eq!((out.changed, out.version), (true, 1));
    assert_eq!(
        payloads(s, &out).iter().map(relation).collect::<Vec<_>>(),
        [("ctx://acc/a".to_owned(), 1)]
    );

    let before = snapshot(s);
    let same = s
        .link(link("ctx://acc/a", "ctx://acc/b", "refs"))
        .expect("identical link");
    assert_eq!(
        (same.changed, same.version, same.event_ids.len()),
        (false, 1, 0)
    );
    assert!(snapshot(s) == before, "an identical link changed the store");

    let mut heavier = link("ctx://acc/a", "ctx://acc/b", "refs");
    heavier.weight = 0.5;
    assert_eq!(s.link(heavier).expect("reweight").version, 2);
    assert_eq!(
        s.link(link("ctx://acc/a", "ctx://acc/b", "cites"))
            .expect("link")
            .version,
        3
    );
    assert_eq!(
        s.link(link("ctx://acc/b", "ctx://acc/a", "refs"))
            .expect("link")
            .version,
        1
    );
    let r = s.relations(&uri("ctx://acc/b")).expect("relations");
    assert_eq!(r.outgoing.len(), 1);
    assert_eq!(r.incoming.len(), 2);
    assert_eq!(
        r.incoming
            .iter()
            .find(|e| e.relation_type == "refs")
            .map(|e| e.weight),
        Some(0.5)
    );
    assert_eq!(
        node(s, "ctx://acc/a").version,
        a_version,
        "links do not bump the node version"
    );
    assert_eq!(node(s, "ctx://acc/a").relation_version, 3);

    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.link(link("ctx://acc/a", "ctx://acc/zz", "refs"))
    });
    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.link(link("ctx://acc/zz", "ctx://acc/a", "refs"))
    });
    for bad in ["", "has space", "a|b", &"t".repeat(65)] {
        assert_rejected(s, ErrorCode::InvalidField, false, |s| {
            s.link(link("ctx://acc/a", "ctx://acc/b", bad))
        });
    }
    let mut nan = link("ctx://acc/a", "ctx://acc/b", "refs");
    nan.weight = f64::NAN;
    assert_rejected(s, ErrorCode::InvalidField, false, |s| s.link(nan));

    let out = s
        .unlink(&uri("ctx://acc/a"), &uri("ctx://acc/b"), "cites", None)
        .expect("unlink");
    assert_eq!(
        payloads(s, &out).iter().map(relation).collect::<Vec<_>>(),
        [("ctx://acc/a".to_owned(), 4)]
    );
    assert_eq!(
        edges(s, "ctx://acc/a"),
        [edge("ctx://acc/a", "ctx://acc/b", "refs")]
    );
    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.unlink(&uri("ctx://acc/a"), &uri("ctx://acc/b"), "cites", None)
    });
    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.unlink(&uri("ctx://acc/zz"), &uri("ctx://acc/b"), "refs", None)
    });
    assert_invariants(s);
}

fn expect_version_is_checked_before_anything_is_written(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    let u = uri("ctx://acc/docs/n");
    let with = |content: &str, v: u64| PutRequest {
        expect_version: Some(v),
        ..text(content)
    };

    let err = assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.put(&u, with("a", 3))
    });
    assert!(
        matches!(
            err,
            StoreError::VersionConflict {
                expected: 3,
                actual: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        absent(s, "ctx://acc/docs"),
        "no ancestor is created by a refused write"
    );
    assert_eq!(s.put(&u, with("a", 0)).expect("create-only").version, 1);
    assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.put(&u, with("b", 0))
    });
    let err = assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.put(&u, with("b", 5))
    });
    assert!(
        matches!(
            err,
            StoreError::VersionConflict {
                expected: 5,
                actual: Some(1),
                ..
            }
        ),
        "{err}"
    );
    assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.put(&u, with("a", 2))
    });
    assert_eq!(
        s.put(&u, with("b", 1)).expect("matching version").version,
        2
    );
    assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.rm(&u, false, Some(1), None)
    });
    s.rm(&u, false, Some(2), None).expect("rm at version");
    assert_eq!(s.put(&u, with("c", 0)).expect("re-create").version, 3);
    assert_invariants(s);
}

fn oversize_text_is_refused_whole(backend: Backend) {
    let mut config = common::two_consumers();
    config.store.max_layer_bytes = 1024;
    let (_d, s, _c) = common::fresh(backend, config);
    let s = s.as_ref();
    let u = uri("ctx://acc/n");
    s.put(&u, text(&"a".repeat(1024)))
        .expect("exactly at the limit");
    for (abs, ov, content) in [
        (None, None, Some(1025)),
        (Some(1025), None, None),
        (None, Some(4096), None),
    ] {
        let req = PutRequest {
            abstract_text: abs.map(|n| "x".repeat(n)),
            overview: ov.map(|n| "x".repeat(n)),
            content: content.map(|n| "x".repeat(n)),
            ..PutRequest::default()
        };
        let err = assert_rejected(s, ErrorCode::PayloadTooLarge, false, |s| s.put(&u, req));
        assert_eq!(err.code().http_status(), 413);
    }
    // The limit is in bytes, and it holds after an append too.
    assert_rejected(s, ErrorCode::PayloadTooLarge, false, |s| {
        s.put(&u, text(&"é".repeat(513)))
    });
    let append = PutRequest {
        mode: PutMode::Append,
        content: Some("b".into()),
        ..PutRequest::default()
    };
    assert_rejected(s, ErrorCode::PayloadTooLarge, false, |s| s.put(&u, append));
    // A refused deep write creates no ancestors.
    assert_rejected(s, ErrorCode::PayloadTooLarge, false, |s| {
        s.put(&uri("ctx://acc/new/deep/n"), text(&"x".repeat(2000)))
    });
    assert_invariants(s);
}

fn bad_input_is_refused_without_harm(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    put(s, "ctx://acc/n", "x");
    assert_rejected(s, ErrorCode::InvalidUri, false, |s| {
        s.put(&CtxUri::root(), text("x"))
    });
    let mut req = text("x");
    req.category = Some("bad\u{7}".into());
    assert_rejected(s, ErrorCode::InvalidField, false, |s| {
        s.put(&uri("ctx://acc/m"), req)
    });
    let mut req = text("x");
    req.meta.insert(String::new(), json!(1));
    assert_rejected(s, ErrorCode::InvalidField, false, |s| {
        s.put(&uri("ctx://acc/m"), req)
    });
    assert_invariants(s);
}

/// Random writes over a small tree: after every operation the invariants hold, a refused
/// operation changed nothing, an accepted one appended exactly the events it reports, and
/// an unchanged one appended none.
fn random_writes_keep_the_invariants(backend: Backend) {
    let seed = common::seed("random_writes_keep_the_invariants");
    let mut rng = StdRng::seed_from_u64(seed);
    let (_d, s, clock) = common::fresh(
        backend,
        Config {
            ..common::two_consumers()
        },
    );
    let s = s.as_ref();
    // Two accounts (account nodes move and go too), a non-ASCII name (relation rewrites
    // on move count characters), and a sibling that shares a prefix (`a` / `a-b`).
    let pick = |rng: &mut StdRng| {
        let mut u = format!("ctx://{}", ["r", "s"][usize::from(rng.random_bool(0.2))]);
        for _ in 0..rng.random_range(0..=3) {
            u.push_str(&format!("/{}", ["a", "a-b", "é"][rng.random_range(0..3)]));
        }
        uri(&u)
    };
    let mut seen = std::collections::BTreeMap::new();
    for step in 0..test_cases(300) {
        clock.advance(rng.random_range(0..2000));
        let before = snapshot(s);
        let (a, b) = (pick(&mut rng), pick(&mut rng));
        let what = rng.random_range(0..100);
        let desc = format!("step {step}: op {what} on {a} {b}");
        let res = match what {
            0..40 => {
                let mode =
                    [PutMode::Replace, PutMode::Merge, PutMode::Append][rng.random_range(0..3)];
                let mut req = PutRequest {
                    mode,
                    ..text(["x", "y", ""][rng.random_range(0..3)])
                };
                if rng.random_bool(0.3) {
                    req.expect_version = Some(rng.random_range(0..4));
                }
                s.put(&a, req)
            }
            40..55 => s.rm(&a, rng.random_bool(0.7), None, None),
            55..70 => s.mv(&a, &b, None),
            70..90 => s.link(link(
                a.as_str(),
                b.as_str(),
                ["r", "s"][rng.random_range(0..2)],
            )),
            _ => s.unlink(&a, &b, "r", None),
        };
        let after = snapshot(s);
        match res {
            Err(e) if (40..55).contains(&what) && e.code() == ErrorCode::NotFound => {
                // rm of a missing node: only the index cleanup event is queued.
                assert_eq!((&after.nodes, &after.edges), (&before.nodes, &before.edges));
                let added = &after.outbox[before.outbox.len()..];
                assert!(
                    !added.is_empty()
                        && added.iter().all(|d| matches!(
                            &d.event.payload,
                            EventPayload::DeleteContext(p) if p.uri == a && p.recursive
                        )),
                    "{desc}: rm of a missing node queued {added:?}"
                );
            }
            Err(e) => {
                assert!(
                    after == before,
                    "{desc}: refused ({e}) but changed the store"
                );
                assert!(!e.is_retryable(), "{desc}: {e} should not be retryable");
            }
            Ok(out) if !out.changed => {
                assert!(
                    out.event_ids.is_empty(),
                    "{desc}: unchanged write reported events"
                );
                assert!(after == before, "{desc}: unchanged write changed the store");
            }
            Ok(out) => {
                let old: std::collections::BTreeSet<_> = before
                    .outbox
                    .iter()
                    .map(|r| r.event.event_id.clone())
                    .collect();
                let mut new: Vec<_> = after
                    .outbox
                    .iter()
                    .filter(|r| r.delivery.consumer == "vector" && !old.contains(&r.event.event_id))
                    .map(|r| r.event.event_id.clone())
                    .collect();
                new.dedup();
                assert_eq!(
                    new, out.event_ids,
                    "{desc}: appended events differ from the reported ones"
                );
                assert!(!new.is_empty(), "{desc}: a change without an event");
            }
        }
        let bad = common::violations(&after, &s.consumers());
        assert!(
            bad.is_empty(),
            "{desc} (CE_SEED={seed}): invariants broken:\n  {}",
            bad.join("\n  ")
        );
        for n in &after.nodes {
            let v = seen.entry(n.uri.clone()).or_insert(n.version);
            *v = (*v).max(n.version);
        }
        let asked: Vec<CtxUri> = (0..rng.random_range(0..8))
            .map(|_| pick(&mut rng))
            .collect();
        check_batched_reads(s, &after, &seen, &asked, &desc);
    }
}

/// The batched reads (`read_nodes`, `versions`, `kinds`) of `asked` — duplicates, absent and
/// removed URIs included — agree URI by URI, in order, with the snapshot `now` and `seen`
/// (the newest version of every URI ever live: one not live now has a tombstone at least as
/// new).
fn check_batched_reads(
    s: &dyn SourceStore,
    now: &common::Snapshot,
    seen: &std::collections::BTreeMap<CtxUri, u64>,
    asked: &[CtxUri],
    desc: &str,
) {
    let live = |u: &CtxUri| now.nodes.iter().find(|n| &n.uri == u);
    let want: Vec<&ContextNode> = asked.iter().filter_map(live).collect();
    let got = s.read_nodes(asked).expect("read_nodes");
    assert_eq!(
        got.iter().collect::<Vec<_>>(),
        want,
        "{desc}: read_nodes({asked:?})"
    );
    let versions = s.versions(asked).expect("versions");
    assert_eq!(versions.len(), asked.len(), "{desc}: versions({asked:?})");
    for (u, v) in asked.iter().zip(versions) {
        match (live(u), seen.get(u), v) {
            (Some(n), _, UriVersion::Live(v)) => assert_eq!(v, n.version, "{desc}: {u}"),
            (None, Some(last), UriVersion::Deleted(t)) => {
                assert!(t >= *last, "{desc}: {u} tombstone {t} older than {last}")
            }
            (None, None, UriVersion::Unknown) => {}
            (n, last, v) => {
                panic!("{desc}: versions says {v:?} of {u} (live {n:?}, seen {last:?})")
            }
        }
    }
    let kinds = s.kinds(asked).expect("kinds");
    let want_kinds: Vec<ce_core::NodeKind> = asked
        .iter()
        .map(|u| {
            let children = now.nodes.iter().filter(|n| &n.parent_uri == u).count();
            ce_core::NodeKind::of(u, children as u64)
        })
        .collect();
    assert_eq!(kinds, want_kinds, "{desc}: kinds({asked:?})");
}

fn apply_batch_is_all_or_nothing(backend: Backend) {
    let mut config = common::two_consumers();
    config.store.max_layer_bytes = 1024;
    let (_d, s, _c) = common::fresh(backend, config);
    let s = s.as_ref();
    put(s, "ctx://acc/a", "a");

    // A failing op anywhere rolls back the ops before it, events included.
    assert_rejected(s, ErrorCode::PayloadTooLarge, false, |s| {
        s.apply_batch(vec![
            WriteOp::Put {
                uri: uri("ctx://acc/new/b"),
                req: text("b"),
            },
            WriteOp::SetRelations {
                from: uri("ctx://acc/a"),
                edges: vec![link("ctx://acc/a", "ctx://acc/new/b", "refs")],
                trace_id: None,
            },
            WriteOp::Put {
                uri: uri("ctx://acc/c"),
                req: text(&"x".repeat(2000)),
            },
        ])
    });
    assert_rejected(s, ErrorCode::NotFound, false, |s| {
        s.apply_batch(vec![
            WriteOp::Put {
                uri: uri("ctx://acc/b"),
                req: text("b"),
            },
            WriteOp::SetRelations {
                from: uri("ctx://acc/a"),
                edges: vec![link("ctx://acc/a", "ctx://acc/missing", "refs")],
                trace_id: None,
            },
        ])
    });

    // A later op sees the earlier ones; each reports its own events.
    let outs = s
        .apply_batch(vec![
            WriteOp::Put {
                uri: uri("ctx://acc/new/b"),
                req: text("b"),
            },
            WriteOp::SetRelations {
                from: uri("ctx://acc/a"),
                edges: vec![link("ctx://acc/a", "ctx://acc/new/b", "refs")],
                trace_id: None,
            },
        ])
        .expect("batch");
    assert_eq!(
        outs.iter().map(|o| o.event_ids.len()).collect::<Vec<_>>(),
        [2, 1]
    );
    assert_eq!(
        relation(&payloads(s, &outs[1])[0]),
        ("ctx://acc/a".to_owned(), 1)
    );
    assert_eq!(
        edges(s, "ctx://acc/a"),
        [edge("ctx://acc/a", "ctx://acc/new/b", "refs")]
    );

    // The same edge set again changes nothing; an empty one removes every edge.
    let before = snapshot(s);
    let same = s
        .apply_batch(vec![WriteOp::SetRelations {
            from: uri("ctx://acc/a"),
            edges: vec![link("ctx://acc/a", "ctx://acc/new/b", "refs")],
            trace_id: None,
        }])
        .expect("same set");
    assert!(!same[0].changed && same[0].event_ids.is_empty());
    assert!(snapshot(s) == before);
    let cleared = s
        .apply_batch(vec![WriteOp::SetRelations {
            from: uri("ctx://acc/a"),
            edges: vec![],
            trace_id: None,
        }])
        .expect("clear");
    assert_eq!(
        relation(&payloads(s, &cleared[0])[0]),
        ("ctx://acc/a".to_owned(), 2)
    );
    assert!(edges(s, "ctx://acc/a").is_empty());
    assert_invariants(s);
}

/// Fencing (docs/store.md): a write under a lock carries its token; once a newer token was
/// recorded for the path, an ancestor or a descendant, an older one is refused in the write's
/// own transaction and the batch leaves nothing behind.
fn writes_under_an_older_fencing_token_are_refused(backend: Backend) {
    let (_d, s, _clock) = common::fresh(backend, Config::default());
    let s = s.as_ref();
    let fence = |p: &str, token| WriteFence {
        path: uri(p),
        token,
    };
    let put = |p: &str| WriteOp::Put {
        uri: uri(p),
        req: text("body"),
    };
    s.apply_fenced(
        &[fence("ctx://acc/docs", 10)],
        vec![put("ctx://acc/docs/a")],
    )
    .expect("first holder writes");
    // The same token again (a second write of the same lease) and a newer one pass.
    s.apply_fenced(
        &[fence("ctx://acc/docs", 10)],
        vec![put("ctx://acc/docs/b")],
    )
    .expect("same lease writes again");
    s.apply_fenced(
        &[fence("ctx://acc/docs/a", 20)],
        vec![put("ctx://acc/docs/a")],
    )
    .expect("newer holder of a descendant writes");
    // The old tree holder has lost: its token 10 is older than 20 recorded below it.
    let err = assert_rejected(s, ErrorCode::LeaseLost, true, |s| {
        s.apply_fenced(
            &[fence("ctx://acc/docs", 10)],
            vec![WriteOp::Rm {
                uri: uri("ctx://acc/docs"),
                recursive: true,
                expect_version: None,
                trace_id: None,
            }],
        )
    });
    assert!(
        matches!(&err, StoreError::LeaseLost { token: 10, newest: 20, newest_path, .. } if newest_path == "ctx://acc/docs/a"),
        "{err}"
    );
    // An ancestor's newer token fences out writes below it too.
    s.apply_fenced(&[fence("ctx://acc", 30)], vec![put("ctx://acc/x")])
        .expect("account-wide holder");
    assert_rejected(s, ErrorCode::LeaseLost, true, |s| {
        s.apply_fenced(
            &[fence("ctx://acc/docs/a", 25)],
            vec![WriteOp::Mv {
                from: uri("ctx://acc/docs/a"),
                to: uri("ctx://acc/docs/c"),
                trace_id: None,
            }],
        )
    });
    // Unrelated paths (a sibling, another account) are not fenced by these tokens.
    s.apply_fenced(
        &[fence("ctx://other/docs", 1)],
        vec![put("ctx://other/docs/a")],
    )
    .expect("another account");
    s.apply_fenced(
        &[fence("ctx://acc2", 5)],
        vec![WriteOp::Mv {
            from: uri("ctx://other/docs/a"),
            to: uri("ctx://other/docs/z"),
            trace_id: None,
        }],
    )
    .expect("a move fenced on an unrelated path");
    assert!(
        s.read_node(&uri("ctx://other/docs/z"))
            .expect("read")
            .is_some()
    );
}

/// A hold recorded last in a batch covers exactly that batch's events: it stays open until
/// every named consumer has finished (done or dead) each of them, and ends once.
fn a_hold_lasts_until_its_batch_is_applied_by_the_named_consumers(backend: Backend) {
    let (_d, s, _clock) = common::fresh(backend, common::two_consumers());
    let s = s.as_ref();
    s.put(&uri("ctx://acc/before"), text("x"))
        .expect("earlier write");
    let out = s
        .apply_batch(vec![
            WriteOp::Put {
                uri: uri("ctx://acc/imp/a"),
                req: text("a"),
            },
            WriteOp::Put {
                uri: uri("ctx://acc/imp/b"),
                req: text("b"),
            },
            WriteOp::Hold {
                id: "h1".into(),
                at: uri("ctx://acc/imp"),
                lease: "{\"opaque\":true}".into(),
                only_with_events: true,
            },
        ])
        .expect("batch with a hold");
    assert_eq!(out.len(), 3);
    let holds = s.holds().expect("holds");
    assert_eq!(holds.len(), 1);
    let h = &holds[0];
    assert_eq!((h.id.as_str(), h.at.as_str()), ("h1", "ctx://acc/imp"));
    assert_eq!(h.lease, "{\"opaque\":true}");
    let last_seq = common::all_events(s).keys().copied().max().expect("events");
    assert_eq!(h.through_seq, last_seq, "the hold covers its own batch");
    // A later write is not part of it.
    s.put(&uri("ctx://acc/after"), text("y"))
        .expect("later write");

    let vector = ["vector".to_owned()];
    let both = ["vector".to_owned(), "keyword".to_owned()];
    assert!(!s.applied_through(&vector, h.through_seq).expect("progress"));
    // The vector consumer works through the batch; keyword does nothing.
    loop {
        let claimed = s.claim_batch("vector", "w", 1).expect("claim");
        let Some(c) = claimed.first() else { break };
        if c.event.seq > h.through_seq {
            break;
        }
        s.mark_done(&c.claim).expect("done");
    }
    assert!(s.applied_through(&vector, h.through_seq).expect("progress"));
    assert!(!s.applied_through(&both, h.through_seq).expect("progress"));
    assert!(s.end_hold("h1").expect("end"));
    assert!(!s.end_hold("h1").expect("end again"), "ends once");
    assert!(s.holds().expect("holds").is_empty());
}

/// Random batches (puts — repeated URIs, ancestors created on the way, over removed nodes —
/// removals, moves and relation sets in one transaction) give the same outcomes and leave the
/// same nodes on both backends. PostgreSQL reads a batch's nodes ahead, a window at a time,
/// and drops what its own writes touch; SQLite reads each node when it is needed: any stale
/// read ahead shows as a difference.
#[test]
fn random_batches_apply_alike_on_both_backends() {
    let seed = common::seed("random_batches_apply_alike_on_both_backends");
    let mut rng = StdRng::seed_from_u64(seed);
    let (_a, lite, lite_clock) = common::fresh(Backend::Sqlite, common::two_consumers());
    let (_b, pg, pg_clock) = common::fresh(Backend::Postgres, common::two_consumers());
    // Half the URIs under an account of the round's own, so a batch also writes whole new
    // chains (which PostgreSQL then knows live without reading them).
    let pick = |rng: &mut StdRng, round: u32| {
        let account = if rng.random_bool(0.5) {
            "r".to_owned()
        } else {
            format!("s{}", round / 4)
        };
        let mut u = format!("ctx://{account}");
        for _ in 0..rng.random_range(1..=3) {
            u.push_str(&format!("/{}", ["a", "b", "c"][rng.random_range(0..3)]));
        }
        uri(&u)
    };
    let nodes = |s: &Store| {
        common::snapshot(s.as_ref())
            .nodes
            .into_iter()
            .map(|n| (n.uri, n.version, n.layers, n.relation_version, n.meta))
            .collect::<Vec<_>>()
    };
    let mut ok = 0;
    for round in 0..test_cases(100) {
        let advance = rng.random_range(0..2000);
        lite_clock.advance(advance);
        pg_clock.advance(advance);
        // Removals, moves and relations mostly of nodes that exist (a batch with one op that
        // fails writes nothing), moves to new names.
        // The nodes that exist, then also those the batch puts.
        let mut live: Vec<CtxUri> = nodes(&lite)
            .into_iter()
            .map(|n| n.0)
            .filter(|u| u.depth() > 1)
            .collect();
        let ops: Vec<WriteOp> = (0..rng.random_range(2..30))
            .map(|i| {
                let (mut a, mut b) = (pick(&mut rng, round), pick(&mut rng, round));
                let what = rng.random_range(0..100);
                if what >= 70 && !live.is_empty() && rng.random_bool(0.9) {
                    a = live[rng.random_range(0..live.len())].clone();
                    if what >= 92 {
                        b = live[rng.random_range(0..live.len())].clone();
                    }
                }
                if what < 75 {
                    live.push(a.clone());
                }
                let b = if (82..92).contains(&what) {
                    b.join(&format!("m{round}-{i}")).expect("uri")
                } else {
                    b
                };
                match what {
                    0..75 => WriteOp::Put {
                        uri: a,
                        req: text(["x", "y", "z"][rng.random_range(0..3)]),
                    },
                    75..82 => WriteOp::Rm {
                        uri: a,
                        recursive: true,
                        expect_version: None,
                        trace_id: None,
                    },
                    82..92 => WriteOp::Mv {
                        from: a,
                        to: b,
                        trace_id: None,
                    },
                    _ => WriteOp::SetRelations {
                        edges: vec![link(a.as_str(), b.as_str(), "r")],
                        from: a,
                        trace_id: None,
                    },
                }
            })
            .collect();
        let desc = format!("round {round} (CE_SEED={seed}): {ops:?}");
        let summary = |r: ce_store::Result<Vec<WriteOutcome>>| match r {
            Ok(outs) => Ok(outs
                .into_iter()
                .map(|o| {
                    (
                        o.uri,
                        o.version,
                        o.changed,
                        o.nodes_affected,
                        o.event_ids.len(),
                    )
                })
                .collect::<Vec<_>>()),
            Err(e) => Err(e.code()),
        };
        let on_lite = summary(lite.apply_batch(ops.clone()));
        let on_pg = summary(pg.apply_batch(ops));
        assert_eq!(on_lite, on_pg, "{desc}: outcomes differ");
        ok += u32::from(on_lite.is_ok());
        assert_eq!(nodes(&lite), nodes(&pg), "{desc}: nodes differ");
    }
    assert!(
        ok * 3 >= test_cases(60),
        "only {ok} batches applied: the test tests little"
    );
}

/// One batch writes a chain (a new account's), removes it and writes under it again: the
/// removed folder comes back as a container, the rewritten node's version continues past its
/// tombstone (what a batch wrote or read earlier is not taken for what the store holds after
/// it removed it).
fn a_batch_writes_over_what_it_removed(backend: Backend) {
    let (_d, s, _c) = store(backend);
    let s = s.as_ref();
    let put_op = |u: &str, t: &str| WriteOp::Put {
        uri: uri(u),
        req: text(t),
    };
    let rm_op = |u: &str| WriteOp::Rm {
        uri: uri(u),
        recursive: true,
        expect_version: None,
        trace_id: None,
    };
    put(s, "ctx://n/old/x", "one");
    let outs = s
        .apply_batch(vec![
            put_op("ctx://m/a/b", "b"),
            put_op("ctx://n/old/x", "two"),
            rm_op("ctx://m/a"),
            rm_op("ctx://n/old"),
            put_op("ctx://m/a/c", "c"),
            put_op("ctx://n/old/x", "three"),
        ])
        .expect("batch");
    assert_eq!(outs[1].version, 2);
    assert_eq!(outs[5].version, 3, "past the tombstone of version 2");
    assert!(absent(s, "ctx://m/a/b"));
    assert_eq!(node(s, "ctx://m/a/c").layers.content, "c");
    assert_eq!(node(s, "ctx://n/old/x").layers.content, "three");
    for folder in ["ctx://m/a", "ctx://n/old"] {
        assert!(!absent(s, folder), "{folder} was created again");
    }
    assert_invariants(s);
}
