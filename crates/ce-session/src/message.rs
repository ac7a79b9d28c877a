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

/// The blocks of a [`transcript`] whose messages are `ids` (all of them, in order — a block
/// ends where the next one's header begins): each message's id and its block,
/// `[id] role: content`. Blocks are found by their ids' headers in order, so a
/// message whose content holds a blank line, brackets or an earlier message's header stays
/// one block (one quoting the header of a later message of the archive is cut there); an id
/// whose header is missing gets no block.
pub fn transcript_blocks<'t>(transcript: &'t str, ids: &[String]) -> Vec<(&'t str, &'t str)> {
    // Where each id's header starts, in order (the first at the start, the others after a
    // blank line).
    let mut starts: Vec<(usize, &str)> = Vec::with_capacity(ids.len());
    let mut from = 0;
    for id in ids {
        let header = format!("[{id}] ");
        let at = if starts.is_empty() && transcript[from..].starts_with(&header) {
            Some(from)
        } else {
            transcript[from..]
                .find(&format!("\n\n{header}"))
                .map(|i| from + i + 2)
        };
        if let Some(at) = at {
            starts.push((at, id.as_str()));
            from = at + header.len();
        }
    }
    let mut out = Vec::with_capacity(starts.len());
    for (i, (at, id)) in starts.iter().enumerate() {
        let end = starts
            .get(i + 1)
            .map_or(transcript.len(), |(next, _)| next - 2);
        let id = &transcript[at + 1..at + 1 + id.len()];
        out.push((id, &transcript[*at..end]));
    }
    out
}

/// The text of each message of a [`transcript`] (`role: content`) by id — `ids` are all its
/// messages' ids, in order ([`transcript_blocks`]): the evidence excerpts of the memories
/// extracted from it.
pub fn transcript_texts(
    transcript: &str,
    ids: &[String],
) -> std::collections::BTreeMap<String, String> {
    transcript_blocks(transcript, ids)
        .into_iter()
        .map(|(id, block)| (id.to_owned(), block[id.len() + 3..].to_owned()))
        .collect()
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

/// How far an archive's windowed extraction got, saved on the archive with each window's
/// candidates (`archive_extraction_progress`): the next run starts at `messages`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct ExtractionProgress {
    /// Messages, from the archive's first, whose windows are extracted.
    pub messages: usize,
    /// Windows extracted.
    pub windows: u32,
    /// Chat calls made for them, over all runs.
    pub calls: u32,
    /// Tokens read by those calls, as the endpoint reported them.
    pub tokens_in: u64,
    /// Tokens written.
    pub tokens_out: u64,
    /// Windows left out (beyond `sessions.max_windows`), once the extraction finished.
    #[serde(default)]
    pub left_out_windows: u32,
    /// Their messages.
    #[serde(default)]
    pub left_out_messages: u64,
}

impl ExtractionProgress {
    /// The progress saved in `meta` (none yet: the default); an unreadable one is an error
    /// naming what is wrong.
    pub fn of(meta: &Meta) -> Result<Self, String> {
        match meta.get(archive_meta::PROGRESS) {
            None | Some(Value::Null) => Ok(Self::default()),
            Some(v) => Self::deserialize(v).map_err(|e| e.to_string()),
        }
    }
}

/// Where an archive's memory extraction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExtractionState {
    /// Not run yet, or some of its windows are still to extract ([`ExtractionProgress`]).
    Pending,
    /// No LLM is configured (or `sessions.extraction = "off"`): nothing is extracted.
    Off,
    /// Every window was extracted (or the rest left out past `sessions.max_windows`, and
    /// noted): the validated candidates are saved on the archive.
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
    }

    #[test]
    fn blocks_are_cut_at_the_headers_of_the_ids_in_order() {
        let m = |id: &str, content: &str| Message {
            id: id.into(),
            seq: 1,
            role: Role::User,
            content: content.into(),
            time_ms: 0,
            parts: None,
        };
        // Contents with a blank line and brackets, even a quoted header of an earlier message.
        let t = transcript(&[
            m("q1", "one\n\n[x] y"),
            m("q2", "two\n\n[q1] user: quoted"),
            m("q3", "three [x]"),
        ]);
        let ids: Vec<String> = ["q1", "q2", "q3"].map(String::from).to_vec();
        let blocks = transcript_blocks(&t, &ids);
        assert_eq!(
            blocks,
            [
                ("q1", "[q1] user: one\n\n[x] y"),
                ("q2", "[q2] user: two\n\n[q1] user: quoted"),
                ("q3", "[q3] user: three [x]"),
            ]
        );
        assert_eq!(transcript_texts(&t, &ids)["q3"], "user: three [x]");
    }
}
