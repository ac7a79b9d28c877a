//! `IndexProjector` (spec §4): turns source objects into index records.
//!
//! Pure functions of their input: the same node always projects to the same records, which is
//! what makes replays idempotent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::rfc3339;
use crate::error::CoreError;
use crate::hash::{sha256_tagged, stable_hash};
use crate::node::{ContextNode, Layers, Level, RelationEdge};
use crate::provenance::{LayerOrigin, Provenance};
use crate::uri::CtxUri;

/// A record of the vector or keyword index (spec §2.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexRecord {
    /// `stable_hash(uri, level)`.
    pub id: String,
    /// Canonical node URI.
    pub uri: CtxUri,
    /// Canonical parent URI.
    pub parent_uri: CtxUri,
    /// `memory|resource|skill|session`.
    pub context_type: String,
    /// Category (may be empty).
    pub category: String,
    /// 0, 1 or 2.
    pub level: Level,
    /// The text of this level, fallbacks applied.
    pub text: String,
    /// Filterable flat scalars (spec §2.2.2 minimal set plus flat user metadata).
    pub filters: BTreeMap<String, Value>,
    /// Descriptive metadata (spec §2.2.2).
    pub metadata: BTreeMap<String, Value>,
}

/// A record of the relation index (spec §4.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelationIndexRecord {
    /// `stable_hash("{from}|{to}|{type}", 0)`.
    pub id: String,
    /// Source node.
    pub from_uri: CtxUri,
    /// Target node.
    pub to_uri: CtxUri,
    /// Relation type.
    pub relation_type: String,
    /// Weight.
    pub weight: f64,
    /// Reason.
    pub reason: String,
    /// Account of the source node.
    pub account_id: String,
    /// Owner space of the source node.
    pub owner_space: String,
}

/// What a move means to an index (spec §2.4, §4.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveProjection {
    /// Old URI of the moved root.
    pub old_uri: CtxUri,
    /// New URI of the moved root.
    pub new_uri: CtxUri,
    /// Old parent of the root.
    pub old_parent_uri: CtxUri,
    /// New parent of the root.
    pub new_parent_uri: CtxUri,
}

impl MoveProjection {
    /// Whether the move changes nothing (`from == to`).
    pub fn is_noop(&self) -> bool {
        self.old_uri == self.new_uri
    }
}

/// Something a projection noticed that deserves a log line but is not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionWarning {
    /// All three layers are empty, so the node has no records (a bare container).
    AllLayersEmpty {
        /// The node.
        uri: CtxUri,
    },
}

/// The records of one node, plus warnings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeProjection {
    /// Up to three records, in level order.
    pub records: Vec<IndexRecord>,
    /// Warnings to log.
    pub warnings: Vec<ProjectionWarning>,
}

/// Projector settings (spec §2.2.1 fallbacks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProjectorConfig {
    /// L0 falls back to the first N characters of the overview (then of the content).
    pub l0_fallback_chars: usize,
    /// L1 falls back to the first M characters of the content.
    pub l1_fallback_chars: usize,
}

impl Default for ProjectorConfig {
    fn default() -> Self {
        ProjectorConfig {
            l0_fallback_chars: 200,
            l1_fallback_chars: 1000,
        }
    }
}

/// Builds index records from source objects (spec §4, §11.2).
#[derive(Debug, Clone, Default)]
pub struct IndexProjector {
    config: ProjectorConfig,
}

/// The layer an index level's text comes from ([`IndexProjector::level_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LevelSource {
    /// The layer whose text is used.
    pub level: Level,
    /// Characters of it used (a fallback's limit); `None`: all of it.
    pub max_chars: Option<usize>,
}

/// Where a level's text came from.
struct LevelText<'a> {
    text: String,
    source_file: &'a str,
}

impl IndexProjector {
    /// A projector with the given fallbacks.
    pub fn new(config: ProjectorConfig) -> Self {
        IndexProjector { config }
    }

    /// Builds the L0/L1/L2 records of `node`, skipping empty levels (spec §4.2).
    pub fn build_context_records(&self, node: &ContextNode) -> NodeProjection {
        let mut out = NodeProjection::default();
        for level in Level::ALL {
            if let Some(r) = self.record(node, level) {
                out.records.push(r);
            }
        }
        if out.records.is_empty() {
            out.warnings.push(ProjectionWarning::AllLayersEmpty {
                uri: node.uri.clone(),
            });
        }
        out
    }

    /// Builds the record of one level given as a raw number; a level outside 0..=2 is a
    /// non-retryable [`CoreError::InvalidLevel`]. `Ok(None)` when the level's text is empty.
    pub fn build_level_record(
        &self,
        node: &ContextNode,
        level: i64,
    ) -> Result<Option<IndexRecord>, CoreError> {
        Ok(self.record(node, Level::from_i64(level)?))
    }

    /// Where the index record of `level` takes its text from (spec §2.2.1): the layer itself
    /// when it has text, else the first fallback layer that has, cut to its character
    /// limit; `None` when none has text (the level gets no record), and `None` while the
    /// layer's derivation is pending (docs/derive.md: its fallback would be embedded only
    /// to be replaced minutes later; the write-back of the derived layer indexes it).
    pub fn level_source(&self, node: &ContextNode, level: Level) -> Option<LevelSource> {
        self.layers_source(&node.layers, &node.provenance, level)
    }

    /// [`Self::level_source`] of a node given by its layers and their provenance alone.
    fn layers_source(
        &self,
        layers: &Layers,
        provenance: &Provenance,
        level: Level,
    ) -> Option<LevelSource> {
        if provenance.get(level).is_some_and(LayerOrigin::is_pending) {
            return None;
        }
        let (n, m) = (self.config.l0_fallback_chars, self.config.l1_fallback_chars);
        let candidates: &[(Level, Option<usize>)] = match level {
            Level::L0 => &[
                (Level::L0, None),
                (Level::L1, Some(n)),
                (Level::L2, Some(n)),
            ],
            Level::L1 => &[(Level::L1, None), (Level::L2, Some(m))],
            Level::L2 => &[(Level::L2, None)],
        };
        candidates
            .iter()
            .find(|(l, _)| !layers.get(*l).is_empty())
            .map(|&(level, max_chars)| LevelSource { level, max_chars })
    }

    /// The text the record of `level` carries (fallbacks applied), or `None` when the level
    /// gets no record.
    pub fn level_text(&self, node: &ContextNode, level: Level) -> Option<String> {
        self.sourced_text(node, level).map(|t| t.text)
    }

    /// [`Self::level_text`] of a node given by its layers and their provenance alone (a
    /// folder's roll-up reads no more of its children).
    pub fn layers_text(
        &self,
        layers: &Layers,
        provenance: &Provenance,
        level: Level,
    ) -> Option<String> {
        self.layers_sourced_text(layers, provenance, level)
            .map(|t| t.text)
    }

    fn sourced_text(&self, node: &ContextNode, level: Level) -> Option<LevelText<'static>> {
        self.layers_sourced_text(&node.layers, &node.provenance, level)
    }

    fn layers_sourced_text(
        &self,
        layers: &Layers,
        provenance: &Provenance,
        level: Level,
    ) -> Option<LevelText<'static>> {
        let source = self.layers_source(layers, provenance, level)?;
        let text = layers.get(source.level);
        Some(LevelText {
            text: source
                .max_chars
                .map_or_else(|| text.to_owned(), |m| truncate_chars(text, m)),
            source_file: match source.level {
                Level::L0 => ".abstract.md",
                Level::L1 => ".overview.md",
                Level::L2 => "content.md",
            },
        })
    }

    fn record(&self, node: &ContextNode, level: Level) -> Option<IndexRecord> {
        let LevelText { text, source_file } = self.sourced_text(node, level)?;
        let mut filters = BTreeMap::new();
        // Flat scalar user metadata is filterable; the minimal set below wins on a clash.
        for (k, v) in &node.meta {
            if matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                filters.insert(k.clone(), v.clone());
            }
        }
        filters.insert("uri".into(), json!(node.uri.as_str()));
        filters.insert("parent_uri".into(), json!(node.parent_uri.as_str()));
        filters.insert("context_type".into(), json!(node.context_type.as_str()));
        filters.insert("category".into(), json!(node.category));
        filters.insert("level".into(), json!(level.as_u8()));
        filters.insert("owner_space".into(), json!(node.owner_space.to_string()));
        filters.insert("account_id".into(), json!(node.account_id()));
        let mut metadata = BTreeMap::new();
        metadata.insert("node_version".into(), json!(node.version));
        metadata.insert("updated_at".into(), json!(rfc3339(node.updated_at_ms)));
        metadata.insert("content_hash".into(), json!(sha256_tagged(&text)));
        metadata.insert("source_files".into(), json!([source_file]));
        metadata.insert("tags".into(), tags(node));
        metadata.insert("trace_id".into(), json!(node.trace_id));
        Some(IndexRecord {
            id: stable_hash(node.uri.as_str(), level.as_u8()),
            uri: node.uri.clone(),
            parent_uri: node.parent_uri.clone(),
            context_type: node.context_type.as_str().to_owned(),
            category: node.category.clone(),
            level,
            text,
            filters,
            metadata,
        })
    }

    /// Builds one record per edge of `uri` (spec §4.3); edges from other nodes are ignored.
    pub fn build_relation_records(
        &self,
        from: &ContextNode,
        edges: &[RelationEdge],
    ) -> Vec<RelationIndexRecord> {
        edges
            .iter()
            .filter(|e| e.from_uri == from.uri)
            .map(|e| RelationIndexRecord {
                id: relation_id(&e.from_uri, &e.to_uri, &e.relation_type),
                from_uri: e.from_uri.clone(),
                to_uri: e.to_uri.clone(),
                relation_type: e.relation_type.clone(),
                weight: e.weight,
                reason: e.reason.clone(),
                account_id: from.account_id().to_owned(),
                owner_space: from.owner_space.to_string(),
            })
            .collect()
    }

    /// The move projection of `from → to` (spec §4.4). Moving the root is invalid.
    pub fn build_move_records(
        &self,
        from: &CtxUri,
        to: &CtxUri,
    ) -> Result<MoveProjection, CoreError> {
        let parent = |u: &CtxUri| {
            u.parent().ok_or_else(|| CoreError::InvalidField {
                field: "uri",
                reason: "the root ctx:// cannot be moved".into(),
            })
        };
        Ok(MoveProjection {
            old_parent_uri: parent(from)?,
            new_parent_uri: parent(to)?,
            old_uri: from.clone(),
            new_uri: to.clone(),
        })
    }
}

/// The stable id of a relation record: `stable_hash("{from}|{to}|{type}", 0)`.
pub fn relation_id(from: &CtxUri, to: &CtxUri, relation_type: &str) -> String {
    stable_hash(&format!("{from}|{to}|{relation_type}"), 0)
}

fn tags(node: &ContextNode) -> Value {
    match node.meta.get("tags") {
        Some(Value::Array(a)) => {
            Value::Array(a.iter().filter(|v| v.is_string()).cloned().collect())
        }
        Some(Value::String(s)) => json!(
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        ),
        _ => json!([]),
    }
}

/// The first `max` characters of `s` (on a character boundary).
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Meta;
    use crate::node::{ContextType, Layers, OwnerSpace};

    fn node(abstract_text: &str, overview: &str, content: &str) -> ContextNode {
        let uri = CtxUri::parse("ctx://acc1/users/u1/memories/preferences/theme").expect("uri");
        let layers = Layers {
            abstract_text: abstract_text.into(),
            overview: overview.into(),
            content: content.into(),
        };
        ContextNode {
            parent_uri: uri.parent().expect("parent"),
            uri,
            context_type: ContextType::Memory,
            category: "preferences".into(),
            owner_space: OwnerSpace::User("u1".into()),
            content_hash: layers.content_hash(),
            layers,
            meta: Meta::from([("tags".into(), json!(["ui"])), ("lang".into(), json!("zh"))]),
            version: 12,
            relation_version: 0,
            created_at_ms: 0,
            updated_at_ms: 1_773_482_400_000,
            trace_id: "t-001".into(),
            provenance: crate::Provenance::default(),
        }
    }

    #[test]
    fn a_pending_layer_gets_no_record_and_its_fallback_is_not_used() {
        let mut n = node("", "", "the content of the node");
        let all = IndexProjector::default().build_context_records(&n);
        assert_eq!(all.records.len(), 3, "fallbacks fill L0 and L1");
        n.provenance.abstract_origin = LayerOrigin::Pending;
        n.provenance.overview_origin = LayerOrigin::Pending;
        let p = IndexProjector::default().build_context_records(&n);
        let levels: Vec<Level> = p.records.iter().map(|r| r.level).collect();
        assert_eq!(
            levels,
            [Level::L2],
            "only the content is indexed while derivation is due"
        );
        n.provenance.overview_origin = LayerOrigin::User;
        n.layers.overview = "an overview".into();
        let p = IndexProjector::default().build_context_records(&n);
        let levels: Vec<Level> = p.records.iter().map(|r| r.level).collect();
        assert_eq!(
            levels,
            [Level::L1, Level::L2],
            "a pending L0 does not fall back to L1"
        );
    }

    /// Spec §13.5.2: a full node gives three records with every listed field.
    #[test]
    fn full_node_gives_three_records() {
        let n = node(
            "用户偏好深色主题。",
            "用户在多个会话中明确偏好深色主题，且不喜欢高亮背景。",
            "原始内容...",
        );
        let p = IndexProjector::default().build_context_records(&n);
        assert!(p.warnings.is_empty());
        let levels: Vec<u8> = p.records.iter().map(|r| r.level.as_u8()).collect();
        assert_eq!(levels, [0, 1, 2]);
        for r in &p.records {
            assert_eq!(
                r.id,
                stable_hash(
                    "ctx://acc1/users/u1/memories/preferences/theme",
                    r.level.as_u8()
                )
            );
            assert_eq!(
                r.parent_uri.as_str(),
                "ctx://acc1/users/u1/memories/preferences"
            );
            assert_eq!(r.context_type, "memory");
            assert_eq!(r.category, "preferences");
            assert!(!r.text.is_empty());
            for k in [
                "uri",
                "parent_uri",
                "context_type",
                "category",
                "level",
                "owner_space",
                "account_id",
            ] {
                assert!(r.filters.contains_key(k), "filter {k}");
            }
            assert_eq!(r.filters["owner_space"], json!("user:u1"));
            assert_eq!(r.filters["account_id"], json!("acc1"));
            assert_eq!(r.filters["level"], json!(r.level.as_u8()));
            assert_eq!(r.filters["lang"], json!("zh"));
            for k in [
                "node_version",
                "updated_at",
                "content_hash",
                "source_files",
                "tags",
                "trace_id",
            ] {
                assert!(r.metadata.contains_key(k), "metadata {k}");
            }
            assert_eq!(r.metadata["content_hash"], json!(sha256_tagged(&r.text)));
            assert_eq!(r.metadata["node_version"], json!(12));
            assert_eq!(r.metadata["updated_at"], json!("2026-03-14T10:00:00.000Z"));
            assert_eq!(r.metadata["tags"], json!(["ui"]));
        }
        assert_eq!(p.records[0].text, "用户偏好深色主题。");
        assert_eq!(p.records[2].metadata["source_files"], json!(["content.md"]));
    }

    /// Spec §13.5.3: all layers empty gives no record and a warning.
    #[test]
    fn empty_node_gives_no_record_and_a_warning() {
        let n = node("", "", "");
        let p = IndexProjector::default().build_context_records(&n);
        assert!(p.records.is_empty());
        assert_eq!(
            p.warnings,
            [ProjectionWarning::AllLayersEmpty { uri: n.uri.clone() }]
        );
    }

    /// Spec §13.5.3: level 9 is a non-retryable error.
    #[test]
    fn invalid_level_is_not_retryable() {
        use crate::error::Classify;
        let err = IndexProjector::default()
            .build_level_record(&node("a", "", ""), 9)
            .expect_err("level 9");
        assert_eq!(err, CoreError::InvalidLevel { level: 9 });
        assert!(!err.is_retryable());
    }

    #[test]
    fn fallbacks_truncate_by_characters() {
        let proj = IndexProjector::new(ProjectorConfig {
            l0_fallback_chars: 3,
            l1_fallback_chars: 5,
        });
        let p = proj.build_context_records(&node("", "", "深色主题界面简洁"));
        let texts: Vec<&str> = p.records.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(texts, ["深色主", "深色主题界", "深色主题界面简洁"]);
        assert_eq!(p.records[0].metadata["source_files"], json!(["content.md"]));
        let p = proj.build_context_records(&node("", "overview text", ""));
        let texts: Vec<&str> = p.records.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(texts, ["ove", "overview text"]);
        assert_eq!(
            p.records[0].metadata["source_files"],
            json!([".overview.md"])
        );
        let src = |n: &ContextNode, l| proj.level_source(n, l);
        let only_content = node("", "", "body");
        assert_eq!(
            src(&only_content, Level::L0),
            Some(LevelSource {
                level: Level::L2,
                max_chars: Some(3)
            })
        );
        assert_eq!(
            src(&only_content, Level::L2),
            Some(LevelSource {
                level: Level::L2,
                max_chars: None
            })
        );
        assert_eq!(src(&node("", "", ""), Level::L1), None);
        assert_eq!(src(&node("a", "", ""), Level::L2), None);
    }

    /// Spec §13.5.3: MOVE with from == to is a no-op.
    #[test]
    fn move_to_itself_is_a_noop() {
        let u = CtxUri::parse("ctx://a/x/y").expect("uri");
        let m = IndexProjector::default()
            .build_move_records(&u, &u)
            .expect("valid");
        assert!(m.is_noop());
        assert_eq!(m.old_parent_uri.as_str(), "ctx://a/x");
        let v = CtxUri::parse("ctx://a/z").expect("uri");
        let m = IndexProjector::default()
            .build_move_records(&u, &v)
            .expect("valid");
        assert!(!m.is_noop());
        assert_eq!(m.new_parent_uri.as_str(), "ctx://a");
        assert!(
            IndexProjector::default()
                .build_move_records(&CtxUri::root(), &v)
                .is_err()
        );
    }

    #[test]
    fn relation_records_have_stable_ids() {
        let n = node("a", "", "");
        let to = CtxUri::parse("ctx://acc1/docs/x").expect("uri");
        let edges = vec![RelationEdge {
            from_uri: n.uri.clone(),
            to_uri: to.clone(),
            relation_type: "references".into(),
            weight: 0.5,
            reason: "r".into(),
        }];
        let recs = IndexProjector::default().build_relation_records(&n, &edges);
        assert_eq!(recs.len(), 1);
        assert_eq!(
            recs[0].id,
            stable_hash(&format!("{}|{}|references", n.uri, to), 0)
        );
        assert_eq!(recs[0].account_id, "acc1");
        assert_eq!(recs[0].owner_space, "user:u1");
    }
}
