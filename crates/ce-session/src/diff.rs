//! The audit record of one commit's Phase 2 (`memory_diff`), written as a node so it is
//! searchable and exportable: L0 the counts, L1 one line per change, L2 the whole diff as
//! JSON (every add / update / supersede with before and after, and the archive it came from).

use serde::{Deserialize, Serialize};

use crate::merge::{DiffEntry, MergeOp};
use crate::message::ExtractionState;

/// Counts of a diff.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct DiffCounts {
    /// Memories added.
    pub added: u64,
    /// Memories updated.
    pub updated: u64,
    /// Memories superseded (each by a new one).
    pub superseded: u64,
    /// Candidates that changed nothing.
    pub unchanged: u64,
}

/// One commit's memory diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemoryDiff {
    /// The session.
    pub session: String,
    /// The archive the changes came from.
    pub archive: String,
    /// Whether extraction ran (`merged`) or is `off`.
    pub extraction: ExtractionState,
    /// Why extraction is off, or what it left out (windows beyond `sessions.max_windows`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The model that extracted, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The rule that decided which memories say the same, with its signals and thresholds
    /// (and why the embedding signal is off, when it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sameness: Option<String>,
    /// Counts.
    pub counts: DiffCounts,
    /// The changes, in candidate order.
    pub entries: Vec<DiffEntry>,
    /// When Phase 2 wrote it.
    pub at_ms: i64,
}

impl MemoryDiff {
    /// A diff of `entries`.
    pub fn new(
        session: &str,
        archive: &str,
        extraction: ExtractionState,
        note: Option<String>,
        model: Option<String>,
        entries: Vec<DiffEntry>,
        at_ms: i64,
    ) -> Self {
        let mut counts = DiffCounts::default();
        for e in &entries {
            match e.op {
                MergeOp::Add => counts.added += 1,
                MergeOp::Update => counts.updated += 1,
                MergeOp::Supersede => counts.superseded += 1,
                MergeOp::Noop => counts.unchanged += 1,
            }
        }
        MemoryDiff {
            session: session.to_owned(),
            archive: archive.to_owned(),
            extraction,
            note,
            model,
            sameness: None,
            counts,
            entries,
            at_ms,
        }
    }

    /// L0: what the commit changed, in one sentence.
    pub fn abstract_text(&self) -> String {
        let name = self.archive.rsplit('/').next().unwrap_or(&self.archive);
        match self.extraction {
            ExtractionState::Off => format!(
                "Memory diff of archive {name} of {}: extraction is off ({}); no memory was \
                 extracted.",
                self.session,
                self.note.as_deref().unwrap_or("no LLM is configured")
            ),
            _ => {
                let c = self.counts;
                let partial = self
                    .note
                    .as_deref()
                    .map(|n| format!(" Extraction was partial: {n}."))
                    .unwrap_or_default();
                format!(
                    "Memory diff of archive {name} of {}: {} added, {} updated, {} superseded, \
                     {} unchanged.{partial}",
                    self.session, c.added, c.updated, c.superseded, c.unchanged
                )
            }
        }
    }

    /// L1: one line per change.
    pub fn overview(&self) -> String {
        let mut out = Vec::new();
        for e in &self.entries {
            let fact = |m: &Option<crate::MemoryState>| {
                m.as_ref().map(|m| m.fact.clone()).unwrap_or_default()
            };
            let line = match e.op {
                MergeOp::Add => format!("- add {}: {}", e.uri, fact(&e.after)),
                MergeOp::Update => format!(
                    "- update {}: {} (was: {})",
                    e.uri,
                    fact(&e.after),
                    fact(&e.before)
                ),
                MergeOp::Supersede => format!(
                    "- supersede {} by {}: {} (was: {})",
                    e.before.as_ref().map(|b| b.uri.as_str()).unwrap_or(""),
                    e.uri,
                    fact(&e.after),
                    fact(&e.before)
                ),
                MergeOp::Noop => format!("- unchanged {}: {}", e.uri, e.reason),
            };
            out.push(line);
        }
        if out.is_empty() {
            out.push(match self.extraction {
                ExtractionState::Off => "- extraction is off: nothing extracted".to_owned(),
                _ => "- the conversation held no memory to extract".to_owned(),
            });
        }
        out.join("\n")
    }
}
