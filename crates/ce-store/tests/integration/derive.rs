//! Derived layers in the store (docs/derive.md): provenance per layer, dirty keys bumped in
//! the commit that changes a node's inputs, and write-backs fenced by the coalesce and node
//! versions, on both backends.

use ce_core::{Config, Derivation, LayerOrigin, Level};
use ce_store::derive::{DerivedOutcome, DerivedWrite, LayerWrite, WaitingFolders};
use ce_store::{PutMode, PutRequest, StoreError, WriteOp};

use crate::common::{Backend, Store, backend_tests, fresh, uri};

/// The default configuration, which has the derive consumer on.
fn derive_on() -> Config {
    let c = Config::default();
    assert!(
        !c.derived_types().is_empty(),
        "derive is a default consumer"
    );
    c
}

fn put(s: &Store, u: &str, req: PutRequest) {
    s.put(&uri(u), req).expect("put");
}

fn content(text: &str) -> PutRequest {
    PutRequest {
        content: Some(text.into()),
        ..PutRequest::default()
    }
}

fn derived(text: &str) -> LayerWrite {
    LayerWrite::Derived {
        text: text.into(),
        derivation: Derivation {
            generator: "test:1".into(),
            input_hash: format!("hash-of-{text}"),
            tokens_in: 3,
            tokens_out: 2,
            at_ms: 0,
        },
    }
}

/// A write-back of both layers of `u` as read now.
fn write_back(s: &Store, u: &str, l0: &str, l1: &str) -> DerivedWrite {
    let key = s
        .dirty_within(&uri(u))
        .expect("dirty")
        .into_iter()
        .find(|k| k.uri == uri(u))
        .expect("an open key");
    let node = s.read_node(&uri(u)).expect("read").expect("node");
    DerivedWrite {
        uri: uri(u),
        node_version: node.version,
        coalesce_version: key.coalesce_version,
        abstract_layer: derived(l0),
        overview_layer: derived(l1),
        tokens_in: 3,
        tokens_out: 2,
    }
}

fn dirty_uris(s: &Store) -> Vec<String> {
    s.dirty_within(&ce_core::CtxUri::root())
        .expect("dirty")
        .into_iter()
        .map(|k| k.uri.to_string())
        .collect()
}

fn a_put_marks_its_node_and_new_ancestors_pending_and_dirty(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(
        &s,
        "ctx://a/resources/docs/guide",
        content("How to install."),
    );
    assert_eq!(
        dirty_uris(&s),
        [
            "ctx://a",
            "ctx://a/resources",
            "ctx://a/resources/docs",
            "ctx://a/resources/docs/guide"
        ]
    );
    let n = s
        .read_node(&uri("ctx://a/resources/docs/guide"))
        .expect("read")
        .expect("node");
    assert!(n.provenance.abstract_origin.is_pending() && n.provenance.overview_origin.is_pending());
    // A memory is not derived by default: no pending layer, no key of its own.
    put(&s, "ctx://a/memories/m1", content("likes tea"));
    let m = s
        .read_node(&uri("ctx://a/memories/m1"))
        .expect("read")
        .expect("node");
    assert_eq!(m.provenance.abstract_origin, LayerOrigin::None);
    assert!(!dirty_uris(&s).contains(&"ctx://a/memories/m1".to_owned()));
    // A client's layers are the client's.
    let full = PutRequest {
        abstract_text: Some("mine".into()),
        overview: Some("my overview".into()),
        content: Some("text".into()),
        ..PutRequest::default()
    };
    put(&s, "ctx://a/resources/mine", full);
    let u = s
        .read_node(&uri("ctx://a/resources/mine"))
        .expect("read")
        .expect("node");
    assert!(u.provenance.all_user());
    assert!(!dirty_uris(&s).contains(&"ctx://a/resources/mine".to_owned()));
    assert_eq!(s.count_dirty().expect("count"), 4);
}

fn a_write_back_lands_once_and_climbs_to_the_parent(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(
        &s,
        "ctx://a/resources/docs/guide",
        content("How to install."),
    );
    let parent_before = s
        .dirty_within(&uri("ctx://a/resources/docs"))
        .expect("dirty")[0]
        .coalesce_version;
    let w = write_back(
        &s,
        "ctx://a/resources/docs/guide",
        "Install guide.",
        "- install",
    );
    let out = s.write_derived(vec![w.clone()]).expect("write");
    assert!(matches!(out[0], DerivedOutcome::Written { .. }), "{out:?}");
    let n = s
        .read_node(&uri("ctx://a/resources/docs/guide"))
        .expect("read")
        .expect("node");
    assert_eq!(n.layers.abstract_text, "Install guide.");
    assert!(matches!(
        n.provenance.abstract_origin,
        LayerOrigin::Derived(_)
    ));
    assert!(!dirty_uris(&s).contains(&"ctx://a/resources/docs/guide".to_owned()));
    let parent_after = s
        .dirty_within(&uri("ctx://a/resources/docs"))
        .expect("dirty")[0]
        .coalesce_version;
    assert!(
        parent_after > parent_before,
        "the new abstract dirties the folder"
    );
    // The same write-back again: the key is clean and the node moved on.
    let again = s.write_derived(vec![w]).expect("write");
    assert!(
        matches!(again[0], DerivedOutcome::Discarded { .. }),
        "{again:?}"
    );
    let usage = s.derive_usage(crate::common::T0).expect("usage");
    assert_eq!(
        (usage.tokens_in, usage.derivations, usage.discarded),
        (6, 1, 1)
    );
}

fn a_write_back_older_than_the_inputs_is_discarded(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(&s, "ctx://a/resources/n", content("first text"));
    let stale = write_back(&s, "ctx://a/resources/n", "about the first", "-");
    put(&s, "ctx://a/resources/n", content("second text"));
    let out = s.write_derived(vec![stale]).expect("write");
    assert!(
        matches!(out[0], DerivedOutcome::Discarded { .. }),
        "{out:?}"
    );
    let n = s
        .read_node(&uri("ctx://a/resources/n"))
        .expect("read")
        .expect("node");
    assert!(n.layers.abstract_text.is_empty() && n.provenance.abstract_origin.is_pending());
    let fresh_write = write_back(&s, "ctx://a/resources/n", "about the second", "-");
    let out = s.write_derived(vec![fresh_write]).expect("write");
    assert!(matches!(out[0], DerivedOutcome::Written { .. }), "{out:?}");
    // A merge of the content keeps the derived text until it is derived again.
    let merge = PutRequest {
        mode: PutMode::Merge,
        content: Some("third text".into()),
        ..PutRequest::default()
    };
    put(&s, "ctx://a/resources/n", merge);
    let n = s
        .read_node(&uri("ctx://a/resources/n"))
        .expect("read")
        .expect("node");
    assert_eq!(n.layers.abstract_text, "about the second");
    assert!(dirty_uris(&s).contains(&"ctx://a/resources/n".to_owned()));
}

fn a_user_layer_is_never_overwritten_and_can_be_handed_back(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(&s, "ctx://a/resources/n", content("text"));
    let w = write_back(&s, "ctx://a/resources/n", "derived", "derived overview");
    // The client writes its own abstract after the derivation read the node.
    let mine = PutRequest {
        mode: PutMode::Merge,
        abstract_text: Some("mine".into()),
        ..PutRequest::default()
    };
    put(&s, "ctx://a/resources/n", mine);
    assert!(matches!(
        s.write_derived(vec![w]).expect("write")[0],
        DerivedOutcome::Discarded { .. }
    ));
    let w = write_back(&s, "ctx://a/resources/n", "derived", "derived overview");
    s.write_derived(vec![w]).expect("write");
    let n = s
        .read_node(&uri("ctx://a/resources/n"))
        .expect("read")
        .expect("node");
    assert_eq!(n.layers.abstract_text, "mine", "a user layer always wins");
    assert!(n.provenance.abstract_origin.is_user());
    assert_eq!(n.layers.overview, "derived overview");
    // Handing the abstract back makes it pending again.
    let back = PutRequest {
        mode: PutMode::Merge,
        derive: vec![Level::L0],
        ..PutRequest::default()
    };
    put(&s, "ctx://a/resources/n", back);
    let n = s
        .read_node(&uri("ctx://a/resources/n"))
        .expect("read")
        .expect("node");
    assert!(n.layers.abstract_text.is_empty() && n.provenance.abstract_origin.is_pending());
    // … but not for a type that is not derived, nor together with text for the layer.
    put(&s, "ctx://a/memories/m", content("x"));
    let refused = |u: &str, req: PutRequest| match s.put(&uri(u), req) {
        Err(StoreError::Core(ce_core::CoreError::InvalidField { field, .. })) => field,
        other => panic!("expected an invalid derive field, got {other:?}"),
    };
    let memory = PutRequest {
        mode: PutMode::Merge,
        derive: vec![Level::L0],
        ..PutRequest::default()
    };
    assert_eq!(refused("ctx://a/memories/m", memory), "derive");
    let both = PutRequest {
        mode: PutMode::Merge,
        abstract_text: Some("a".into()),
        derive: vec![Level::L0],
        ..PutRequest::default()
    };
    assert_eq!(refused("ctx://a/resources/n", both), "derive");
}

fn removing_and_moving_dirty_the_folders_and_carry_the_keys(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(&s, "ctx://a/resources/x/one", content("one"));
    put(&s, "ctx://a/resources/y/two", content("two"));
    for u in ["ctx://a/resources/x/one", "ctx://a/resources/y/two"] {
        let w = write_back(&s, u, "d", "d");
        s.write_derived(vec![w]).expect("write");
    }
    let version = |u: &str| {
        s.dirty_within(&uri(u))
            .expect("dirty")
            .into_iter()
            .find(|k| k.uri == uri(u))
            .map(|k| k.coalesce_version)
    };
    let y_before = version("ctx://a/resources/y");
    s.mv(
        &uri("ctx://a/resources/x/one"),
        &uri("ctx://a/resources/y/one"),
        None,
    )
    .expect("mv");
    assert!(
        version("ctx://a/resources/y") > y_before,
        "the new folder gained a child"
    );
    assert!(
        version("ctx://a/resources/x").is_some(),
        "the old folder lost one"
    );
    s.rm(&uri("ctx://a/resources/y"), true, None, None)
        .expect("rm");
    assert!(
        !dirty_uris(&s)
            .iter()
            .any(|u| u.starts_with("ctx://a/resources/y")),
        "removed nodes have no keys: {:?}",
        dirty_uris(&s)
    );
    assert!(dirty_uris(&s).contains(&"ctx://a/resources".to_owned()));
}

fn without_the_derive_consumer_nothing_is_pending(backend: Backend) {
    let mut config = Config::default();
    config.index.outbox.consumers.retain(|c| c != "derive");
    let (_p, s, _c) = fresh(backend, config);
    put(&s, "ctx://a/resources/n", content("text"));
    let n = s
        .read_node(&uri("ctx://a/resources/n"))
        .expect("read")
        .expect("node");
    assert_eq!(n.provenance.abstract_origin, LayerOrigin::None);
    assert_eq!(s.count_dirty().expect("count"), 0);
}

fn a_snapshot_reads_children_with_their_content_cut_to_the_l0_fallback(backend: Backend) {
    let mut config = derive_on();
    config.projector.l0_fallback_chars = 5;
    let (_p, s, _c) = fresh(backend, config.clone());
    // Multi-byte characters: the cut counts characters, as the projector's fallback does.
    put(
        &s,
        "ctx://a/resources/f/long",
        content("ünïcödé text that goes on"),
    );
    put(&s, "ctx://a/resources/f/short", content("abc"));
    // A client's L1 (the L0's first fallback) is cut the same way.
    let overview = PutRequest {
        overview: Some("överview that goes on".into()),
        content: Some("text".into()),
        ..PutRequest::default()
    };
    put(&s, "ctx://a/resources/f/the-overview", overview);
    let folder = uri("ctx://a/resources/f");
    let snaps = s
        .derive_snapshots(std::slice::from_ref(&folder), WaitingFolders::Read)
        .expect("snapshots");
    assert_eq!(snaps.len(), 1);
    let layers: Vec<(&str, &str)> = snaps[0]
        .children
        .iter()
        .map(|c| (c.layers.overview.as_str(), c.layers.content.as_str()))
        .collect();
    assert_eq!(layers, [("", "ünïcö"), ("", "abc"), ("överv", "text")]);
    // What the folder's derivation reads of a child is its L0 with fallbacks: unchanged.
    let projector = ce_core::IndexProjector::new(config.projector);
    for (cut, full) in snaps[0]
        .children
        .iter()
        .zip(["long", "short", "the-overview"])
    {
        let whole = s
            .read_node(&uri(&format!("ctx://a/resources/f/{full}")))
            .expect("read")
            .expect("node");
        assert_eq!(
            whole.layers.content.len() > cut.layers.content.len(),
            full == "long"
        );
        assert_eq!(cut.layers.abstract_text, whole.layers.abstract_text);
        assert_eq!(cut.uri, whole.uri);
        assert_eq!(cut.provenance, whole.provenance);
        assert_eq!(
            projector.layers_text(&cut.layers, &cut.provenance, Level::L0),
            projector.level_text(&whole, Level::L0)
        );
    }
    // The snapshot's node itself is whole.
    assert_eq!(snaps[0].node.uri, folder);
}

/// With [`WaitingFolders::Skip`], a folder with a pending child is snapshotted as waiting,
/// without its children, until the last pending child is written back.
fn a_waiting_folder_is_snapshotted_without_its_children(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(&s, "ctx://a/resources/f/one", content("First text."));
    put(&s, "ctx://a/resources/f/two", content("Second text."));
    let folder = uri("ctx://a/resources/f");
    let snap = |waiting| {
        let mut snaps = s
            .derive_snapshots(std::slice::from_ref(&folder), waiting)
            .expect("snapshots");
        assert_eq!(snaps.len(), 1, "the folder's key is open");
        let snap = snaps.remove(0);
        let names: Vec<String> = snap
            .children
            .iter()
            .map(|c| c.uri.name().to_owned())
            .collect();
        (snap.waiting, names)
    };
    assert_eq!(snap(WaitingFolders::Skip), (true, vec![]));
    assert_eq!(
        snap(WaitingFolders::Read),
        (false, vec!["one".into(), "two".into()])
    );
    let one = write_back(&s, "ctx://a/resources/f/one", "First.", "First text.");
    assert!(matches!(
        s.write_derived(vec![one]).expect("write").as_slice(),
        [DerivedOutcome::Written { .. }]
    ));
    assert_eq!(
        snap(WaitingFolders::Skip),
        (true, vec![]),
        "two is still pending"
    );
    let two = write_back(&s, "ctx://a/resources/f/two", "Second.", "Second text.");
    s.write_derived(vec![two]).expect("write");
    assert_eq!(
        snap(WaitingFolders::Skip),
        (false, vec!["one".into(), "two".into()]),
        "nothing pending: the children are read"
    );
}

backend_tests!(
    a_waiting_folder_is_snapshotted_without_its_children,
    a_snapshot_reads_children_with_their_content_cut_to_the_l0_fallback,
    a_put_marks_its_node_and_new_ancestors_pending_and_dirty,
    a_write_back_lands_once_and_climbs_to_the_parent,
    a_write_back_older_than_the_inputs_is_discarded,
    a_user_layer_is_never_overwritten_and_can_be_handed_back,
    removing_and_moving_dirty_the_folders_and_carry_the_keys,
    without_the_derive_consumer_nothing_is_pending,
    a_batch_bumps_each_key_once_until_it_is_derived,
);

/// A batch that adds many children to one folder bumps the folder's key once (an import of
/// 10,000 files into one folder made 10,000 updates of one row: quadratic on PostgreSQL),
/// and the key moves on again with the next transaction after a write-back.
fn a_batch_bumps_each_key_once_until_it_is_derived(backend: Backend) {
    let (_p, s, _c) = fresh(backend, derive_on());
    put(&s, "ctx://a/resources/docs/first", content("first"));
    let folder = |s: &Store| {
        s.dirty_within(&uri("ctx://a/resources/docs"))
            .expect("dirty")
            .into_iter()
            .find(|k| k.uri == uri("ctx://a/resources/docs"))
            .expect("the folder has a key")
    };
    let before = folder(&s).coalesce_version;
    let children = |from: usize| {
        (from..from + 50)
            .map(|i| WriteOp::Put {
                uri: uri(&format!("ctx://a/resources/docs/n{i}")),
                req: content(&format!("child {i}")),
            })
            .collect::<Vec<_>>()
    };
    s.apply_batch(children(0)).expect("batch");
    let after = folder(&s);
    assert_eq!(
        after.coalesce_version,
        before + 1,
        "one bump for 50 children"
    );
    assert!(
        after.coalesce_version > after.derived_version,
        "the key is open"
    );
    let w = write_back(&s, "ctx://a/resources/docs", "Docs.", "- docs");
    s.write_derived(vec![w]).expect("write back");
    assert!(
        !dirty_uris(&s).contains(&"ctx://a/resources/docs".to_owned()),
        "derived: the key is clean"
    );
    s.apply_batch(children(50)).expect("batch");
    let again = folder(&s);
    assert_eq!(again.coalesce_version, after.coalesce_version + 1);
    assert_eq!(again.derived_version, after.coalesce_version, "open again");
}
