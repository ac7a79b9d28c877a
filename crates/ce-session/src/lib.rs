//! Sessions and memory (DESIGN.md §9; docs/sessions.md): what a session is in the tree, the
//! state of its two-phase commit, memory extraction and the merge rule — the logic, with no
//! I/O of its own besides the chat endpoint it is given. The engine (`ce-server`'s
//! `sessions` module and its `session-commit` job) reads and writes through the store and
//! its path locks.
//!
//! ```text
//! append ─► messages/{id}         commit Phase 1 (EXACT lock on the session, one transaction):
//!                                   archives/{n} + rm archived messages + counters + job
//! Phase 2 (the job): summary ─► Extractor, one call per window (LLM, schema-validated;
//!                    each window saved on the archive)
//!                    ─► plan_merge (add / update / supersede / noop) ─► memories + memory_diffs/{n}
//! ```
//!
//! - [`layout`]: URIs and meta keys
//! - [`message`]: messages, transcripts, archive and extraction states
//! - [`extract`]: the extraction prompt, its answer schema and the [`Extractor`]
//! - [`merge`]: the merge rule and its invariants
//! - [`diff`]: the audit diff

pub mod diff;
pub mod error;
pub mod extract;
pub mod layout;
pub mod merge;
pub mod message;

pub use diff::{DiffCounts, MemoryDiff};
pub use error::SessionError;
pub use extract::{Candidate, Change, Extraction, Extractor, Shown};
pub use layout::{CATEGORIES, SESSION_COMMIT_JOB, SUPERSEDES, SessionLayout};
pub use merge::{
    DiffEntry, MemoryState, MergeContext, MergeOp, MergePlan, Sameness, plan_merge, similarity,
};
pub use message::{
    ArchiveState, ExtractionProgress, ExtractionState, Message, Role, transcript,
    transcript_blocks, transcript_texts,
};
