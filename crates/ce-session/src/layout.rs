//! Where a session's parts live in the tree, and the meta keys they carry (docs/sessions.md,
//! "Layout").
//!
//! ```text
//! ctx://{account}/users/{user}/sessions/{session}          the session (meta: counters, markers)
//!   …/messages/{message_id}                                one live message per node
//!   …/archives/{nnnnnn}                                    one archive per commit (L2: transcript)
//!   …/memory_diffs/{nnnnnn}                                the audit diff of that commit's Phase 2
//! ctx://{account}/users/{user}/memories/{category}/{key}   the owner's memories
//! ```
//!
//! `agents/{agent}/…` works the same way. A message node is named by the client's message id
//! (so a retried append finds it in one read) or, without one, by `m` and its sequence number;
//! its order is its `session_seq` meta value, so an append writes one message node and the
//! session's counters, never the history.

use ce_core::{CoreError, CtxUri};

/// Meta keys of a session node.
pub mod session_meta {
    /// Marks the node as a session (`true`).
    pub const SESSION: &str = "session";
    /// The sequence number the next message gets (starts at 1).
    pub const NEXT_SEQ: &str = "session_next_seq";
    /// The number the next archive gets (starts at 1).
    pub const NEXT_ARCHIVE: &str = "session_next_archive";
    /// The phase-1-ready marker: the last archive whose Phase 1 committed.
    pub const PHASE1_READY: &str = "session_phase1_ready";
    /// Messages archived so far.
    pub const ARCHIVED_MESSAGES: &str = "session_archived_messages";
}

/// Meta keys of a message node.
pub mod message_meta {
    /// `user`, `assistant`, `system` or `tool`.
    pub const ROLE: &str = "session_role";
    /// Its order in the session.
    pub const SEQ: &str = "session_seq";
    /// The message id (the node's name).
    pub const MESSAGE_ID: &str = "session_message_id";
    /// When it was said, in milliseconds since the epoch.
    pub const TIME_MS: &str = "session_time_ms";
    /// Tool calls or other structured parts, as the client sent them.
    pub const PARTS: &str = "session_parts";
}

/// Meta keys of an archive node.
pub mod archive_meta {
    /// Its number.
    pub const NUMBER: &str = "archive_number";
    /// The ids of the archived messages, in order.
    pub const MESSAGE_IDS: &str = "archive_message_ids";
    /// Sequence numbers of its first and last message.
    pub const FIRST_SEQ: &str = "archive_first_seq";
    /// See [`FIRST_SEQ`].
    pub const LAST_SEQ: &str = "archive_last_seq";
    /// [`crate::ArchiveState`].
    pub const STATE: &str = "archive_state";
    /// [`crate::ExtractionState`].
    pub const EXTRACTION: &str = "archive_extraction";
    /// The validated candidates of the extraction, in window order (saved window by window
    /// before the merge, so a rerun after a crash merges the same candidates instead of
    /// asking the model again).
    pub const CANDIDATES: &str = "archive_candidates";
    /// How far a windowed extraction got ([`crate::ExtractionProgress`]): saved with each
    /// window's candidates, so a rerun resumes at the next window.
    pub const PROGRESS: &str = "archive_extraction_progress";
    /// Why extraction is off, or what it left out (windows beyond `sessions.max_windows`).
    pub const EXTRACTION_NOTE: &str = "archive_extraction_note";
    /// The URI of the commit's memory diff.
    pub const DIFF: &str = "archive_diff";
    /// Which generator summarised it (when Phase 2 wrote the summary itself).
    pub const SUMMARY: &str = "archive_summary";
    /// The id of the Phase 2 job.
    pub const JOB: &str = "archive_job_key";
}

/// How many of a session's newest archives an append with a client message id looks in
/// before appending: a retried append whose message was archived meanwhile is recognised
/// when one of these holds it (older archives are not read, so each new message costs at
/// most this many metadata reads).
pub const RETRY_ARCHIVES: u64 = 4;

/// Meta keys of a memory node.
pub mod memory_meta {
    /// The memory's slot within its category (the model's `key`).
    pub const KEY: &str = "memory_key";
    /// `current` or `superseded`.
    pub const STATUS: &str = "memory_status";
    /// The model's confidence, 0..=1.
    pub const CONFIDENCE: &str = "memory_confidence";
    /// The archive the memory (or its last update) came from.
    pub const SOURCE_ARCHIVE: &str = "memory_source_archive";
    /// Every archive that stated it.
    pub const SOURCES: &str = "memory_sources";
    /// The ids of the messages that are its evidence.
    pub const SOURCE_MESSAGES: &str = "memory_source_messages";
    /// The extracted candidates merged into it, as `{archive}#{candidate index}` (what makes a
    /// repeated merge of the same candidates a no-op).
    pub const MERGED_FROM: &str = "memory_merged_from";
    /// Since when it holds, in milliseconds since the epoch.
    pub const VALID_FROM: &str = "memory_valid_from";
    /// Until when it held (set when superseded).
    pub const VALID_UNTIL: &str = "memory_valid_until";
    /// The URI of the memory that superseded it.
    pub const SUPERSEDED_BY: &str = "memory_superseded_by";
    /// Status value of a current memory.
    pub const CURRENT: &str = "current";
    /// Status value of a superseded memory.
    pub const SUPERSEDED: &str = "superseded";
}

/// The relation type from a memory to the one it replaced.
pub const SUPERSEDES: &str = "supersedes";

/// The relation type from a memory diff to the archive it came from.
pub const DIFF_OF: &str = "memory_diff_of";

/// The job type of Phase 2.
pub const SESSION_COMMIT_JOB: &str = "session-commit";

/// The memory categories (`…/memories/{category}/…`).
pub const CATEGORIES: [&str; 6] = [
    "profile",
    "preferences",
    "entities",
    "events",
    "cases",
    "patterns",
];

/// The longest client message id.
pub const MAX_MESSAGE_ID: usize = 128;

/// A session's URI and the URIs of its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLayout {
    session: CtxUri,
    owner: CtxUri,
}

fn not_a_session(uri: &str, why: &str) -> CoreError {
    CoreError::InvalidField {
        field: "session",
        reason: format!(
            "{uri} is not a session URI ({why}); expected ctx://ACCOUNT/users/USER/sessions/ID \
             or ctx://ACCOUNT/agents/AGENT/sessions/ID"
        ),
    }
}

fn join(base: &CtxUri, seg: &str) -> Result<CtxUri, CoreError> {
    base.join(seg).map_err(CoreError::from)
}

impl SessionLayout {
    /// The layout of the session at `uri`: `ctx://A/users/U/sessions/S` or
    /// `ctx://A/agents/G/sessions/S`; anything else is `invalid_field`.
    pub fn of(uri: &CtxUri) -> Result<Self, CoreError> {
        let segs: Vec<&str> = uri.segments().collect();
        match segs.as_slice() {
            [_, "users" | "agents", _, "sessions", _] => {}
            [_, "users" | "agents", _, "sessions", _, ..] => {
                return Err(not_a_session(uri.as_str(), "it lies inside a session"));
            }
            _ => return Err(not_a_session(uri.as_str(), "wrong shape")),
        }
        let owner = uri
            .parent()
            .and_then(|p| p.parent())
            .ok_or_else(|| not_a_session(uri.as_str(), "no owner"))?;
        Ok(SessionLayout {
            session: uri.clone(),
            owner,
        })
    }

    /// The owner folder of `uri` (`ctx://A/users/U` or `ctx://A/agents/G`), when `uri` is one.
    pub fn owner_of(uri: &CtxUri) -> Option<CtxUri> {
        let segs: Vec<&str> = uri.segments().collect();
        matches!(segs.as_slice(), [_, "users" | "agents", _]).then(|| uri.clone())
    }

    /// The session node.
    pub fn session(&self) -> &CtxUri {
        &self.session
    }

    /// The session's id (its last segment).
    pub fn id(&self) -> &str {
        self.session.name()
    }

    /// The owner folder (`ctx://A/users/U`).
    pub fn owner(&self) -> &CtxUri {
        &self.owner
    }

    /// The folder of live messages.
    pub fn messages(&self) -> CtxUri {
        join(&self.session, "messages").expect("a fixed segment joins")
    }

    /// The message node of `id` (checked with [`check_message_id`]).
    pub fn message(&self, id: &str) -> Result<CtxUri, CoreError> {
        join(&self.messages(), id)
    }

    /// The folder of archives.
    pub fn archives(&self) -> CtxUri {
        join(&self.session, "archives").expect("a fixed segment joins")
    }

    /// Archive `n`.
    pub fn archive(&self, n: u64) -> CtxUri {
        join(&self.archives(), &format!("{n:06}")).expect("digits join")
    }

    /// The folder of memory diffs.
    pub fn diffs(&self) -> CtxUri {
        join(&self.session, "memory_diffs").expect("a fixed segment joins")
    }

    /// The memory diff of archive `n`.
    pub fn diff(&self, n: u64) -> CtxUri {
        join(&self.diffs(), &format!("{n:06}")).expect("digits join")
    }

    /// The owner's memories folder.
    pub fn memories(&self) -> CtxUri {
        join(&self.owner, "memories").expect("a fixed segment joins")
    }

    /// The idempotency key of archive `n`'s Phase 2 job.
    pub fn job_key(&self, n: u64) -> String {
        format!("{SESSION_COMMIT_JOB}:{}:{n}", self.session)
    }
}

/// The generated id of the message with sequence number `seq`.
pub fn generated_message_id(seq: u64) -> String {
    format!("m{seq:06}")
}

/// Checks a client message id: 1 to [`MAX_MESSAGE_ID`] of `[A-Za-z0-9._-]`, not starting
/// with `.`, and not of the generated form `m` + digits.
pub fn check_message_id(id: &str) -> Result<(), CoreError> {
    let bad = |reason: String| CoreError::InvalidField {
        field: "id",
        reason: format!("message id {id:?} {reason}"),
    };
    if id.is_empty() || id.len() > MAX_MESSAGE_ID {
        return Err(bad(format!("must be 1 to {MAX_MESSAGE_ID} characters")));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        || id.starts_with('.')
    {
        return Err(bad(
            "may hold only letters, digits, '.', '_' and '-' and must not start with '.'".into(),
        ));
    }
    if id.len() > 1 && id.starts_with('m') && id[1..].chars().all(|c| c.is_ascii_digit()) {
        return Err(bad(
            "has the form of a generated id (m + digits); choose another".into(),
        ));
    }
    Ok(())
}

/// Checks a memory category.
pub fn check_category(c: &str) -> Result<(), String> {
    if CATEGORIES.contains(&c) {
        Ok(())
    } else {
        Err(format!("{c:?} is not one of {}", CATEGORIES.join(", ")))
    }
}

/// Checks a memory key: 1 to 64 of `[a-z0-9_-]`, starting with a letter or digit.
pub fn check_memory_key(k: &str) -> Result<(), String> {
    let ok = !k.is_empty()
        && k.len() <= 64
        && k.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{k:?} must be 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    #[test]
    fn a_session_lays_out_its_parts_under_itself_and_memories_under_its_owner() {
        let l = SessionLayout::of(&u("ctx://acme/users/alice/sessions/s1")).expect("session");
        assert_eq!(l.owner().as_str(), "ctx://acme/users/alice");
        assert_eq!(
            l.message("q1").expect("id").as_str(),
            "ctx://acme/users/alice/sessions/s1/messages/q1"
        );
        assert_eq!(
            l.archive(3).as_str(),
            "ctx://acme/users/alice/sessions/s1/archives/000003"
        );
        assert_eq!(
            l.diff(3).as_str(),
            "ctx://acme/users/alice/sessions/s1/memory_diffs/000003"
        );
        assert_eq!(l.memories().as_str(), "ctx://acme/users/alice/memories");
        let a = SessionLayout::of(&u("ctx://acme/agents/bot/sessions/t")).expect("agent");
        assert_eq!(a.memories().as_str(), "ctx://acme/agents/bot/memories");
        for bad in [
            "ctx://acme/users/alice",
            "ctx://acme/users/alice/sessions",
            "ctx://acme/resources/sessions/x",
            "ctx://acme/users/alice/sessions/s1/messages",
        ] {
            let e = SessionLayout::of(&u(bad)).expect_err(bad);
            assert!(e.to_string().contains("not a session URI"), "{e}");
        }
    }

    #[test]
    fn message_ids_are_checked_and_cannot_take_a_generated_name() {
        for ok in ["q1", "msg-7", "a.b_c", "m", "m1x"] {
            check_message_id(ok).expect(ok);
        }
        for bad in ["", ".x", "a/b", "a b", "m000001", "m12", &"x".repeat(129)] {
            check_message_id(bad).expect_err(bad);
        }
        assert_eq!(generated_message_id(7), "m000007");
        assert!(check_message_id(&generated_message_id(7)).is_err());
    }

    #[test]
    fn categories_and_keys_are_checked() {
        check_category("preferences").expect("category");
        assert!(check_category("hobbies").is_err());
        check_memory_key("editor").expect("key");
        check_memory_key("home_city-2").expect("key");
        for bad in ["", "Editor", "-x", "a b", &"k".repeat(65)] {
            assert!(check_memory_key(bad).is_err(), "{bad}");
        }
    }
}
