//! Messages, archives and their states, read from and written to nodes' meta.

use std::fmt;
use std::str::FromStr;

use ce_core::{ContextNode, CoreError, Meta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::layout::{archive_meta, message_meta};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user.
    User,
    /// The agent.
    Assistant,
    /// Instructions.
    System,
    /// A tool's output.
    Tool,
}

impl Role {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
            Role::Tool => "tool",
        }
    }
}

impl FromStr for Role {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s {
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "system" => Ok(Role::System),
            "tool" => Ok(Role::Tool),
            other => Err(CoreError::InvalidField {
                field: "role",
                reason: format!("{other:?} is not one of user, assistant, system, tool"),
            }),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Message {
    /// Its id (the message node's name).
    pub id: String,
    /// Its order in the session.
    pub seq: u64,
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
    /// When, in milliseconds since the epoch.
    pub time_ms: i64,
    /// Tool calls or other parts, as the client sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Value>,
}

impl Message {
    /// The message a message node holds; `None` when the node is not one (no role or seq).
    pub fn from_node(node: &ContextNode) -> Option<Self> {
        let role = node.meta.get(message_meta::ROLE)?.as_str()?.parse().ok()?;
        let seq = node.meta.get(message_meta::SEQ)?.as_u64()?;
        Some(Message {
            id: node.uri.name().to_owned(),
            seq,
            role,
            content: node.layers.content.clone(),
            time_ms: node
                .meta
                .get(message_meta::TIME_MS)
                .and_then(Value::as_i64)
                .unwrap_or(node.created_at_ms),
            parts: node.meta.get(message_meta::PARTS).cloned(),
        })
    }

    /// The meta a message node carries.
    pub fn meta(&self) -> Meta {
        let mut m = Meta::new();
        m.insert(message_meta::ROLE.into(), self.role.as_str().into());
        m.insert(message_meta::SEQ.into(), self.seq.into());
        m.insert(message_meta::MESSAGE_ID.into(), self.id.clone().into());
        m.insert(message_meta::TIME_MS.into(), self.time_ms.into());
        if let Some(p) = &self.parts {
            m.insert(message_meta::PARTS.into(), p.clone());
        }
        m
    }
}

/// The transcript of `messages` (an archive's L2): one block per message,
/// `[id] role: content`, so extraction can cite message ids as evidence.
pub fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!("[{}] {}: {}", m.id, m.role, m.content.trim()));
    }
    out
}

/// The text of each message of a [`transcript`] whose id is one of `ids` (`role: content`),
/// by id: the evidence excerpts of the memories extracted from it.
pub fn transcript_texts(
    transcript: &str,
    ids: &[String],
) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for block in transcript.split("\n\n[") {
        let block = block.strip_prefix('[').unwrap_or(block);
        if let Some((id, rest)) = block.split_once("] ")
            && ids.iter().any(|i| i == id)
        {
            out.insert(id.to_owned(), rest.to_owned());
        }
    }
    out
}

/// Where an archive is in its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArchiveState {
    /// Phase 1 committed it; Phase 2 has not completed.
    Ready,
    /// Phase 2 completed: summary, memories and diff written.
    Completed,
}

impl ArchiveState {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ArchiveState::Ready => "ready",
            ArchiveState::Completed => "completed",
        }
    }

    /// The state in `meta`, if any.
    pub fn of(meta: &Meta) -> Option<Self> {
        match meta.get(archive_meta::STATE)?.as_str()? {
            "ready" => Some(ArchiveState::Ready),
            "completed" => Some(ArchiveState::Completed),
            _ => None,
        }
    }
}

/// Where an archive's memory extraction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExtractionState {
    /// Not run yet.
    Pending,
    /// No LLM is configured (or `sessions.extraction = "off"`): nothing is extracted.
    Off,
    /// The model answered; its validated candidates are saved on the archive.
    Extracted,
    /// The candidates were merged into the owner's memories.
    Merged,
}

impl ExtractionState {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExtractionState::Pending => "pending",
            ExtractionState::Off => "off",
            ExtractionState::Extracted => "extracted",
            ExtractionState::Merged => "merged",
        }
    }

    /// The state in `meta` (pending when absent).
    pub fn of(meta: &Meta) -> Self {
        match meta.get(archive_meta::EXTRACTION).and_then(Value::as_str) {
            Some("off") => ExtractionState::Off,
            Some("extracted") => ExtractionState::Extracted,
            Some("merged") => ExtractionState::Merged,
            _ => ExtractionState::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_transcripts_cite_message_ids() {
        assert_eq!("tool".parse::<Role>().expect("role"), Role::Tool);
        let e = "bot".parse::<Role>().expect_err("unknown");
        assert!(e.to_string().contains("user, assistant"), "{e}");
        let m = |id: &str, role, content: &str| Message {
            id: id.into(),
            seq: 1,
            role,
            content: content.into(),
            time_ms: 0,
            parts: None,
        };
        let t = transcript(&[
            m("q1", Role::User, "I use Helix.\n"),
            m("a1", Role::Assistant, "Noted."),
        ]);
        assert_eq!(t, "[q1] user: I use Helix.\n\n[a1] assistant: Noted.");
        let texts = transcript_texts(&t, &["q1".into(), "a1".into()]);
        assert_eq!(texts["q1"], "user: I use Helix.");
        assert_eq!(texts["a1"], "assistant: Noted.");
        assert!(!transcript_texts(&t, &["a1".into()]).contains_key("q1"));
    }
}
