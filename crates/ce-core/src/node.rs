//! Nodes of the context tree and their attributes.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::error::CoreError;
use crate::hash::sha256_tagged;
use crate::provenance::Provenance;
use crate::uri::CtxUri;

/// User metadata of a node: a JSON object (flat scalar values are filterable).
pub type Meta = BTreeMap<String, serde_json::Value>;

/// One of the three text layers of a node.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(try_from = "u8", into = "u8")]
#[schemars(extend("enum" = [0, 1, 2]))]
pub enum Level {
    /// L0, the abstract: one or two sentences.
    L0,
    /// L1, the overview: a paragraph or an outline.
    L1,
    /// L2, the full content.
    L2,
}

impl Level {
    /// All levels, in order.
    pub const ALL: [Level; 3] = [Level::L0, Level::L1, Level::L2];

    /// The level as its number.
    pub fn as_u8(self) -> u8 {
        match self {
            Level::L0 => 0,
            Level::L1 => 1,
            Level::L2 => 2,
        }
    }

    /// The file of the node layout (spec §2.2) that holds this level.
    pub fn file_name(self) -> &'static str {
        match self {
            Level::L0 => ".abstract.md",
            Level::L1 => ".overview.md",
            Level::L2 => "content.md",
        }
    }

    /// Parses a level number; anything but 0, 1 or 2 is [`CoreError::InvalidLevel`].
    pub fn from_i64(level: i64) -> Result<Self, CoreError> {
        match level {
            0 => Ok(Level::L0),
            1 => Ok(Level::L1),
            2 => Ok(Level::L2),
            _ => Err(CoreError::InvalidLevel { level }),
        }
    }
}

impl TryFrom<u8> for Level {
    type Error = CoreError;
    fn try_from(v: u8) -> Result<Self, CoreError> {
        Level::from_i64(i64::from(v))
    }
}

impl From<Level> for u8 {
    fn from(l: Level) -> u8 {
        l.as_u8()
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_u8())
    }
}

/// What kind of context a node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextType {
    /// Something an agent remembers about a user, an entity or an event.
    Memory,
    /// A document, code, a web page.
    Resource,
    /// A capability an agent can use.
    Skill,
    /// A conversation or task session.
    Session,
}

impl ContextType {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextType::Memory => "memory",
            ContextType::Resource => "resource",
            ContextType::Skill => "skill",
            ContextType::Session => "session",
        }
    }
}

impl FromStr for ContextType {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s {
            "memory" => Ok(ContextType::Memory),
            "resource" => Ok(ContextType::Resource),
            "skill" => Ok(ContextType::Skill),
            "session" => Ok(ContextType::Session),
            other => Err(CoreError::InvalidField {
                field: "context_type",
                reason: format!("{other:?} is not one of memory, resource, skill, session"),
            }),
        }
    }
}

impl fmt::Display for ContextType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a node sits in the tree, as listings show it: derived from its URI and children,
/// never stored. A node's [`ContextType`] is a separate, stored attribute (a filter key): an
/// account or a container created as a missing ancestor keeps its path default
/// ([`PathDefaults`], `resource` outside a type folder), which is why listings show the kind
/// beside it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A top-level node (`ctx://{account}`).
    Account,
    /// A node with children.
    Container,
    /// A node without children.
    #[default]
    Leaf,
}

impl NodeKind {
    /// The kind of the node at `uri` with `children` direct children.
    pub fn of(uri: &CtxUri, children: u64) -> Self {
        match (uri.depth(), children) {
            (1, _) => NodeKind::Account,
            (_, 0) => NodeKind::Leaf,
            _ => NodeKind::Container,
        }
    }

    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Account => "account",
            NodeKind::Container => "container",
            NodeKind::Leaf => "leaf",
        }
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose context a node is: `user:{id}`, `agent:{id}` or `shared`.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(extend("pattern" = "^(shared|(user|agent):[^\\s/]+)$"))]
pub enum OwnerSpace {
    /// A user's own context.
    User(String),
    /// An agent's own context.
    Agent(String),
    /// Context shared across the account.
    Shared,
}

impl FromStr for OwnerSpace {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let bad = |why: &str| CoreError::InvalidField {
            field: "owner_space",
            reason: format!("{s:?} {why}; expected user:ID, agent:ID or shared"),
        };
        let id_ok = |id: &str| {
            !id.is_empty()
                && !id
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace() || c == '/')
        };
        match s.split_once(':') {
            None if s == "shared" => Ok(OwnerSpace::Shared),
            Some(("user", id)) if id_ok(id) => Ok(OwnerSpace::User(id.to_owned())),
            Some(("agent", id)) if id_ok(id) => Ok(OwnerSpace::Agent(id.to_owned())),
            Some(("user" | "agent", _)) => Err(bad("has an empty or malformed id")),
            _ => Err(bad("is not an owner space")),
        }
    }
}

impl fmt::Display for OwnerSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerSpace::User(u) => write!(f, "user:{u}"),
            OwnerSpace::Agent(a) => write!(f, "agent:{a}"),
            OwnerSpace::Shared => f.write_str("shared"),
        }
    }
}

impl TryFrom<String> for OwnerSpace {
    type Error = CoreError;
    fn try_from(s: String) -> Result<Self, CoreError> {
        s.parse()
    }
}

impl From<OwnerSpace> for String {
    fn from(o: OwnerSpace) -> String {
        o.to_string()
    }
}

/// Attributes derived from a URI when the writer does not set them (DESIGN.md decision 14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathDefaults {
    /// `memories/` → memory, `resources/` → resource, `skills/` → skill, `sessions/` →
    /// session, anything else → resource.
    pub context_type: ContextType,
    /// The segment after the type folder (`memories/preferences/x` → `preferences`), else "".
    pub category: String,
    /// `users/{u}/…` → `user:{u}`, `agents/{a}/…` → `agent:{a}`, else `shared`.
    pub owner_space: OwnerSpace,
}

impl PathDefaults {
    /// Derives the defaults of `uri`.
    pub fn of(uri: &CtxUri) -> Self {
        let segs: Vec<&str> = uri.segments().skip(1).collect();
        let owner_space = match segs.as_slice() {
            ["users", u, ..] => OwnerSpace::User((*u).to_owned()),
            ["agents", a, ..] => OwnerSpace::Agent((*a).to_owned()),
            _ => OwnerSpace::Shared,
        };
        let mut context_type = ContextType::Resource;
        let mut category = String::new();
        for (i, s) in segs.iter().enumerate() {
            let t = match *s {
                "memories" => ContextType::Memory,
                "resources" => ContextType::Resource,
                "skills" => ContextType::Skill,
                "sessions" => ContextType::Session,
                _ => continue,
            };
            context_type = t;
            // A category is a folder between the type folder and the node itself.
            if i + 2 < segs.len() {
                category = segs[i + 1].to_owned();
            }
            break;
        }
        PathDefaults {
            context_type,
            category,
            owner_space,
        }
    }
}

/// The three text layers of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layers {
    /// L0 (`.abstract.md`).
    #[serde(rename = "abstract")]
    pub abstract_text: String,
    /// L1 (`.overview.md`).
    pub overview: String,
    /// L2 (`content.md`).
    pub content: String,
}

impl Layers {
    /// The text stored for `level` (no fallback).
    pub fn get(&self, level: Level) -> &str {
        match level {
            Level::L0 => &self.abstract_text,
            Level::L1 => &self.overview,
            Level::L2 => &self.content,
        }
    }

    /// Whether all three layers are empty.
    pub fn is_empty(&self) -> bool {
        self.abstract_text.is_empty() && self.overview.is_empty() && self.content.is_empty()
    }

    /// The node content hash: sha256 over the three layers, length-prefixed so that moving
    /// text between layers changes it.
    pub fn content_hash(&self) -> String {
        let mut buf = String::new();
        for level in Level::ALL {
            let t = self.get(level);
            buf.push_str(&t.len().to_string());
            buf.push(':');
            buf.push_str(t);
        }
        sha256_tagged(&buf)
    }
}

/// A node of the source of truth, as `ContextFS.read_node` returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextNode {
    /// Canonical URI.
    pub uri: CtxUri,
    /// Parent URI (`ctx://` for an account node).
    pub parent_uri: CtxUri,
    /// Kind of context.
    pub context_type: ContextType,
    /// Category (may be empty).
    pub category: String,
    /// Owner space.
    pub owner_space: OwnerSpace,
    /// The three text layers.
    #[serde(flatten)]
    pub layers: Layers,
    /// User metadata.
    pub meta: Meta,
    /// Monotonic version of this URI; survives delete and re-create (never reused).
    pub version: u64,
    /// [`Layers::content_hash`] of the layers.
    pub content_hash: String,
    /// Version of the node's outgoing relations; bumps on link and unlink.
    pub relation_version: u64,
    /// Creation time.
    pub created_at_ms: Millis,
    /// Time of the last change.
    pub updated_at_ms: Millis,
    /// Trace id of the last change.
    pub trace_id: String,
    /// Where L0 and L1 came from (client, generator, pending).
    #[serde(default)]
    pub provenance: Provenance,
}

impl ContextNode {
    /// The account this node belongs to.
    pub fn account_id(&self) -> &str {
        self.uri.account_id()
    }
}

/// A typed edge between two nodes, owned by its `from` node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RelationEdge {
    /// Source node.
    pub from_uri: CtxUri,
    /// Target node.
    pub to_uri: CtxUri,
    /// Relation type, e.g. `references`.
    pub relation_type: String,
    /// Weight in [0, 1e6]; 1.0 by default.
    pub weight: f64,
    /// Why the edge exists (may be empty).
    pub reason: String,
}

/// Checks a relation type: non-empty, at most 64 bytes, no whitespace, `|` or control chars.
pub fn validate_relation_type(t: &str) -> Result<(), CoreError> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && !t
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '|');
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidField {
            field: "relation_type",
            reason: format!(
                "{t:?} must be 1-64 bytes without whitespace, '|' or control characters"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_is_account_at_the_top_else_container_with_children() {
        let u = |s: &str| CtxUri::parse(s).expect("uri");
        assert_eq!(NodeKind::of(&u("ctx://acc"), 0), NodeKind::Account);
        assert_eq!(NodeKind::of(&u("ctx://acc"), 3), NodeKind::Account);
        assert_eq!(NodeKind::of(&u("ctx://acc/docs"), 2), NodeKind::Container);
        assert_eq!(NodeKind::of(&u("ctx://acc/docs/a"), 0), NodeKind::Leaf);
        assert_eq!(
            serde_json::to_value(NodeKind::Container).expect("json"),
            "container"
        );
    }

    #[test]
    fn path_defaults_follow_the_layout() {
        let d = PathDefaults::of(
            &CtxUri::parse("ctx://acc1/users/u1/memories/preferences/theme").expect("uri"),
        );
        assert_eq!(d.context_type, ContextType::Memory);
        assert_eq!(d.category, "preferences");
        assert_eq!(d.owner_space, OwnerSpace::User("u1".into()));
        let d =
            PathDefaults::of(&CtxUri::parse("ctx://acc1/agents/bot/skills/search").expect("uri"));
        assert_eq!(d.context_type, ContextType::Skill);
        assert_eq!(d.category, "");
        assert_eq!(d.owner_space, OwnerSpace::Agent("bot".into()));
        let d = PathDefaults::of(&CtxUri::parse("ctx://acc1/docs/a").expect("uri"));
        assert_eq!(d.context_type, ContextType::Resource);
        assert_eq!(d.owner_space, OwnerSpace::Shared);
    }

    #[test]
    fn owner_space_parses_strictly() {
        assert_eq!(
            "user:u1".parse::<OwnerSpace>().ok(),
            Some(OwnerSpace::User("u1".into()))
        );
        assert_eq!(
            "shared".parse::<OwnerSpace>().ok(),
            Some(OwnerSpace::Shared)
        );
        for bad in ["user:", "admin:x", "agent:a b", "", "Shared"] {
            assert!(bad.parse::<OwnerSpace>().is_err(), "{bad}");
        }
    }

    #[test]
    fn level_rejects_out_of_range() {
        assert!(matches!(
            Level::from_i64(9),
            Err(CoreError::InvalidLevel { level: 9 })
        ));
        assert_eq!(Level::from_i64(2).ok(), Some(Level::L2));
    }

    #[test]
    fn content_hash_sees_moves_between_layers() {
        let a = Layers {
            abstract_text: "ab".into(),
            overview: "".into(),
            content: "".into(),
        };
        let b = Layers {
            abstract_text: "a".into(),
            overview: "b".into(),
            content: "".into(),
        };
        assert_ne!(a.content_hash(), b.content_hash());
    }
}
