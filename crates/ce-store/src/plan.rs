//! Pure write planning shared by every backend: what a node becomes after a request.
//!
//! Backends read the current row, call these functions and write the result in the same
//! transaction as the events; no backend re-implements the merge rules.

use ce_core::{
    ContextNode, CoreError, CtxUri, LayerOrigin, Layers, Level, Meta, Millis, PathDefaults,
    Provenance, UpsertReason,
};

use crate::derive::{Rules, settle_layer_origins};
use crate::error::{Result, StoreError};
use crate::model::{PutMode, PutRequest};

/// The node to write and why.
#[derive(Debug, Clone)]
pub struct PlannedNode {
    /// The full new row.
    pub node: ContextNode,
    /// The reason recorded in `UPSERT_CONTEXT`.
    pub reason: UpsertReason,
    /// Layers the node had that a replace left empty (it was not given them).
    pub layers_removed: Vec<Level>,
}

/// Generates a trace id when the caller gave none.
pub fn trace_id_or_new(trace_id: Option<String>) -> String {
    trace_id
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| uuid::Uuid::now_v7().simple().to_string())
}

/// Checks `expect_version` against the stored version (`None` = no node).
pub fn check_expected(uri: &CtxUri, expected: Option<u64>, actual: Option<u64>) -> Result<()> {
    match (expected, actual) {
        (None, _) | (Some(0), None) => Ok(()),
        (Some(e), Some(a)) if e == a => Ok(()),
        (Some(e), a) => Err(StoreError::VersionConflict {
            uri: uri.clone(),
            expected: e,
            actual: a,
        }),
    }
}

/// Refuses a move of or onto the root, and a move into the source's own subtree.
pub fn check_move(from: &CtxUri, to: &CtxUri) -> Result<()> {
    let invalid = |reason| StoreError::InvalidMove {
        from: from.clone(),
        to: to.clone(),
        reason,
    };
    if from.is_root() || to.is_root() {
        return Err(invalid("the root ctx:// cannot be moved or replaced"));
    }
    if from != to && to.is_within(from) {
        return Err(invalid("the target lies inside the source"));
    }
    Ok(())
}

/// The version a URI gets when it (re)appears: one above anything it ever had.
pub fn next_version(current: Option<u64>, tombstone: Option<u64>) -> u64 {
    current.unwrap_or(0).max(tombstone.unwrap_or(0)) + 1
}

/// A bare container node (an implicitly created ancestor).
pub fn container(uri: &CtxUri, version: u64, now: Millis, trace_id: &str) -> ContextNode {
    let d = PathDefaults::of(uri);
    let layers = Layers::default();
    ContextNode {
        parent_uri: uri.parent().unwrap_or_else(CtxUri::root),
        uri: uri.clone(),
        context_type: d.context_type,
        category: d.category,
        owner_space: d.owner_space,
        content_hash: layers.content_hash(),
        layers,
        meta: Meta::new(),
        version,
        relation_version: 0,
        created_at_ms: now,
        updated_at_ms: now,
        trace_id: trace_id.to_owned(),
        provenance: Provenance::default(),
    }
}

/// Plans a put: the node `uri` becomes, or `None` when the write would change nothing.
///
/// `tombstone` is the last version of a removed node at this URI, so versions never repeat.
pub fn plan_put(
    uri: &CtxUri,
    existing: Option<&ContextNode>,
    tombstone: Option<u64>,
    req: PutRequest,
    now: Millis,
    rules: &Rules,
    trace_id: &str,
) -> Result<Option<PlannedNode>> {
    let max_layer_bytes = rules.max_layer_bytes;
    if uri.is_root() {
        return Err(StoreError::RootNotWritable);
    }
    check_expected(uri, req.expect_version, existing.map(|n| n.version))?;
    for (field, v) in [
        ("abstract", &req.abstract_text),
        ("overview", &req.overview),
        ("content", &req.content),
    ] {
        if let Some(t) = v {
            check_size(field, t.len(), max_layer_bytes)?;
        }
    }
    if let Some(c) = &req.category
        && (c.chars().any(char::is_control) || c.len() > 256)
    {
        return Err(CoreError::InvalidField {
            field: "category",
            reason: format!("{c:?} must be at most 256 bytes without control characters"),
        }
        .into());
    }
    for k in req.meta.keys() {
        if k.is_empty() || k.len() > 256 || k.chars().any(char::is_control) {
            return Err(CoreError::InvalidField {
                field: "meta",
                reason: format!("key {k:?} must be 1-256 bytes without control characters"),
            }
            .into());
        }
    }

    for level in &req.derive {
        let written = match level {
            Level::L0 => req.abstract_text.is_some(),
            Level::L1 => req.overview.is_some(),
            Level::L2 => false,
        };
        if written {
            return Err(CoreError::InvalidField {
                field: "derive",
                reason: format!("layer {level} is both written and handed back to derivation"),
            }
            .into());
        }
    }
    let defaults = PathDefaults::of(uri);
    let base = match (existing, req.mode) {
        (Some(n), PutMode::Merge | PutMode::Append) => n.clone(),
        (Some(n), PutMode::Replace) => ContextNode {
            layers: Layers::default(),
            meta: Meta::new(),
            context_type: defaults.context_type,
            category: defaults.category.clone(),
            owner_space: defaults.owner_space.clone(),
            ..n.clone()
        },
        (None, _) => container(uri, 0, now, trace_id),
    };
    let mut node = base;
    match (existing, req.mode) {
        (None, _) => node.provenance = Provenance::default(),
        // A replace replaces the client's layers; derived ones are not the client's and stay
        // (re-derived if the inputs changed), so re-importing an unchanged tree changes
        // nothing.
        (Some(old), PutMode::Replace) => {
            for level in [Level::L0, Level::L1] {
                let kept = old.provenance.get(level).filter(|o| !o.is_user()).cloned();
                if let Some(o) = node.provenance.get_mut(level) {
                    *o = kept.clone().unwrap_or_default();
                }
                if kept.is_some() {
                    match level {
                        Level::L0 => node.layers.abstract_text = old.layers.abstract_text.clone(),
                        _ => node.layers.overview = old.layers.overview.clone(),
                    }
                }
            }
        }
        (Some(_), _) => {}
    }
    for (level, given) in [(Level::L0, &req.abstract_text), (Level::L1, &req.overview)] {
        let origin = match given {
            Some(t) if !t.is_empty() => LayerOrigin::User,
            Some(_) => LayerOrigin::None,
            None => continue,
        };
        if let Some(o) = node.provenance.get_mut(level) {
            *o = origin;
        }
    }
    if let Some(t) = req.abstract_text {
        node.layers.abstract_text = t;
    }
    if let Some(t) = req.overview {
        node.layers.overview = t;
    }
    if let Some(t) = req.content {
        if req.mode == PutMode::Append {
            check_size(
                "content",
                node.layers.content.len() + t.len(),
                max_layer_bytes,
            )?;
            node.layers.content.push_str(&t);
        } else {
            node.layers.content = t;
        }
    }
    if let Some(t) = req.context_type {
        node.context_type = t;
    }
    if let Some(c) = req.category {
        node.category = c;
    }
    if let Some(o) = req.owner_space {
        node.owner_space = o;
    }
    for (k, v) in req.meta {
        if v.is_null() && req.mode != PutMode::Replace {
            node.meta.remove(&k);
        } else {
            node.meta.insert(k, v);
        }
    }
    hand_back_to_derivation(&mut node, &req.derive, rules)?;
    settle_layer_origins(&mut node, rules);

    let reason = match (existing, req.mode) {
        (None, _) => UpsertReason::Create,
        (Some(_), PutMode::Replace) => UpsertReason::Replace,
        (Some(_), PutMode::Merge) => UpsertReason::Merge,
        (Some(_), PutMode::Append) => UpsertReason::Append,
    };
    if let Some(old) = existing {
        let same = old.layers == node.layers
            && old.provenance == node.provenance
            && old.meta == node.meta
            && old.context_type == node.context_type
            && old.category == node.category
            && old.owner_space == node.owner_space;
        if same {
            return Ok(None);
        }
    }
    // Hashed only once the node changes (a re-import of 10,000 unchanged nodes hashed
    // every layer of every one of them: 5 % of it).
    node.content_hash = node.layers.content_hash();
    node.version = next_version(existing.map(|n| n.version), tombstone);
    node.updated_at_ms = now;
    if existing.is_none() {
        node.created_at_ms = now;
    }
    node.trace_id = trace_id.to_owned();
    let layers_removed = match (existing, req.mode) {
        (Some(old), PutMode::Replace) => Level::ALL
            .into_iter()
            .filter(|&l| !old.layers.get(l).is_empty() && node.layers.get(l).is_empty())
            .collect(),
        _ => Vec::new(),
    };
    Ok(Some(PlannedNode {
        node,
        reason,
        layers_removed,
    }))
}

/// `PutRequest::derive`: the named layers lose their client text and become pending, so the
/// `derive` consumer writes them. Refused for a layer the same request writes, and for a node
/// whose context type is not derived.
fn hand_back_to_derivation(node: &mut ContextNode, levels: &[Level], rules: &Rules) -> Result<()> {
    if levels.is_empty() {
        return Ok(());
    }
    if !rules.derives(node.context_type) {
        return Err(CoreError::InvalidField {
            field: "derive",
            reason: format!(
                "{} nodes get no derived layers here (derive.types {:?}, and the derive consumer \
                 must be one of index.outbox.consumers)",
                node.context_type,
                rules.derived.iter().map(|t| t.as_str()).collect::<Vec<_>>()
            ),
        }
        .into());
    }
    for &level in levels {
        let Some(origin) = node.provenance.get_mut(level) else {
            return Err(CoreError::InvalidField {
                field: "derive",
                reason: "only L0 (abstract) and L1 (overview) are derived; L2 is the content"
                    .into(),
            }
            .into());
        };
        if !origin.is_user() {
            continue;
        }
        *origin = LayerOrigin::Pending;
        match level {
            Level::L0 => node.layers.abstract_text.clear(),
            _ => node.layers.overview.clear(),
        }
    }
    Ok(())
}

fn check_size(field: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(CoreError::TooLarge { field, len, max }.into());
    }
    Ok(())
}

/// Rewrites a node for a move to `new_uri`: new URI and parent, a fresh version, and
/// path-derived attributes re-derived where they still equal the old path's defaults
/// (explicitly set attributes are kept).
pub fn moved(
    node: &ContextNode,
    new_uri: CtxUri,
    dest_tombstone: Option<u64>,
    now: Millis,
    trace_id: &str,
) -> ContextNode {
    let old_d = PathDefaults::of(&node.uri);
    let new_d = PathDefaults::of(&new_uri);
    let mut n = node.clone();
    if n.context_type == old_d.context_type {
        n.context_type = new_d.context_type;
    }
    if n.category == old_d.category {
        n.category = new_d.category;
    }
    if n.owner_space == old_d.owner_space {
        n.owner_space = new_d.owner_space;
    }
    n.parent_uri = new_uri.parent().unwrap_or_else(CtxUri::root);
    n.uri = new_uri;
    n.version = next_version(Some(node.version), dest_tombstone);
    n.updated_at_ms = now;
    n.trace_id = trace_id.to_owned();
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn put(content: &str) -> PutRequest {
        PutRequest {
            content: Some(content.into()),
            ..PutRequest::default()
        }
    }

    #[test]
    fn create_takes_path_defaults_and_tombstone_version() {
        let u = uri("ctx://a/users/u1/memories/prefs/theme");
        let p = plan_put(&u, None, Some(7), put("x"), 5, &Rules::limit(100), "t")
            .expect("ok")
            .expect("changed");
        assert_eq!(p.reason, UpsertReason::Create);
        assert_eq!(p.node.version, 8);
        assert_eq!(p.node.owner_space.to_string(), "user:u1");
        assert_eq!(p.node.category, "prefs");
    }

    #[test]
    fn replace_names_the_layers_it_empties() {
        let u = uri("ctx://a/x");
        let full = PutRequest {
            abstract_text: Some("a".into()),
            content: Some("c".into()),
            ..PutRequest::default()
        };
        let created = plan_put(&u, None, None, full, 5, &Rules::limit(100), "t")
            .expect("ok")
            .expect("new");
        assert_eq!(created.layers_removed, [], "a create removes nothing");
        let n = created.node;
        let overview = |mode| PutRequest {
            overview: Some("o".into()),
            mode,
            ..PutRequest::default()
        };
        let replaced = plan_put(
            &u,
            Some(&n),
            None,
            overview(PutMode::Replace),
            6,
            &Rules::limit(100),
            "t",
        )
        .expect("ok")
        .expect("changed");
        assert_eq!(replaced.layers_removed, [Level::L0, Level::L2]);
        let merged = plan_put(
            &u,
            Some(&n),
            None,
            overview(PutMode::Merge),
            6,
            &Rules::limit(100),
            "t",
        )
        .expect("ok")
        .expect("changed");
        assert_eq!(merged.layers_removed, []);
    }

    #[test]
    fn identical_write_plans_nothing() {
        let u = uri("ctx://a/x");
        let n = plan_put(&u, None, None, put("x"), 5, &Rules::limit(100), "t")
            .expect("ok")
            .expect("new")
            .node;
        assert!(
            plan_put(&u, Some(&n), None, put("x"), 6, &Rules::limit(100), "t2")
                .expect("ok")
                .is_none()
        );
        let merge = PutRequest {
            mode: PutMode::Merge,
            ..PutRequest::default()
        };
        assert!(
            plan_put(&u, Some(&n), None, merge, 6, &Rules::limit(100), "t2")
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn merge_append_and_replace() {
        let u = uri("ctx://a/x");
        let mut req = put("one");
        req.abstract_text = Some("abs".into());
        req.meta.insert("k".into(), json!("v"));
        let n = plan_put(&u, None, None, req, 5, &Rules::limit(100), "t")
            .expect("ok")
            .expect("new")
            .node;
        let app = PutRequest {
            mode: PutMode::Append,
            content: Some("two".into()),
            ..PutRequest::default()
        };
        let a = plan_put(&u, Some(&n), None, app, 6, &Rules::limit(100), "t")
            .expect("ok")
            .expect("changed");
        assert_eq!(
            (a.node.layers.content.as_str(), a.node.version),
            ("onetwo", 2)
        );
        assert_eq!(a.node.layers.abstract_text, "abs");
        let mut m = PutRequest {
            mode: PutMode::Merge,
            ..PutRequest::default()
        };
        m.meta.insert("k".into(), serde_json::Value::Null);
        let m = plan_put(&u, Some(&a.node), None, m, 7, &Rules::limit(100), "t")
            .expect("ok")
            .expect("changed");
        assert!(m.node.meta.is_empty());
        assert_eq!(m.node.layers.content, "onetwo");
        let r = plan_put(
            &u,
            Some(&m.node),
            None,
            put("z"),
            8,
            &Rules::limit(100),
            "t",
        )
        .expect("ok")
        .expect("changed");
        assert_eq!(r.node.layers.abstract_text, "");
        assert_eq!(r.reason, UpsertReason::Replace);
    }

    #[test]
    fn limits_and_versions_are_enforced() {
        let u = uri("ctx://a/x");
        let err = plan_put(&u, None, None, put("0123456789"), 5, &Rules::limit(4), "t")
            .expect_err("too big");
        assert!(matches!(
            err,
            StoreError::Core(CoreError::TooLarge {
                field: "content",
                ..
            })
        ));
        let mut req = put("x");
        req.expect_version = Some(3);
        let err = plan_put(&u, None, None, req, 5, &Rules::limit(100), "t").expect_err("conflict");
        assert!(matches!(
            err,
            StoreError::VersionConflict {
                actual: None,
                expected: 3,
                ..
            }
        ));
        let mut req = put("x");
        req.expect_version = Some(0);
        assert!(
            plan_put(&u, None, None, req, 5, &Rules::limit(100), "t")
                .expect("create-only")
                .is_some()
        );
        assert!(matches!(
            plan_put(
                &CtxUri::root(),
                None,
                None,
                put("x"),
                5,
                &Rules::limit(100),
                "t"
            ),
            Err(StoreError::RootNotWritable)
        ));
    }

    #[test]
    fn move_rederives_defaults_but_keeps_explicit_attributes() {
        let from = uri("ctx://a/users/u1/memories");
        let to = uri("ctx://a/users/u2/memories");
        let n = plan_put(
            &uri("ctx://a/users/u1/memories/prefs/theme"),
            None,
            None,
            put("x"),
            1,
            &Rules::limit(100),
            "t",
        )
        .expect("ok")
        .expect("new")
        .node;
        let m = moved(
            &n,
            n.uri.rebase(&from, &to).expect("within"),
            Some(4),
            9,
            "t",
        );
        assert_eq!(m.uri.as_str(), "ctx://a/users/u2/memories/prefs/theme");
        assert_eq!(m.parent_uri.as_str(), "ctx://a/users/u2/memories/prefs");
        assert_eq!(m.owner_space.to_string(), "user:u2");
        assert_eq!(m.version, 5);
        let mut explicit = n.clone();
        explicit.owner_space = ce_core::OwnerSpace::Shared;
        assert_eq!(
            moved(
                &explicit,
                explicit.uri.rebase(&from, &to).expect("within"),
                None,
                9,
                "t"
            )
            .owner_space,
            ce_core::OwnerSpace::Shared
        );
    }
}
