//! Phase 1 of a session commit (spec "session.commit()", Phase 1): under the session's
//! EXACT lock and without a model call, the messages beyond the keep-last policy are
//! archived. Everything Phase 1 writes commits in one transaction — the archive (its
//! transcript and metadata, state `ready`), the removal of the archived message nodes, the
//! session's counters with the phase-1-ready marker, and the `session-commit` job — so there
//! is no partial archive to recover and no archive without its job (stronger than the spec,
//! which publishes in steps and checks the archive state on recovery; DESIGN.md §7).

use ce_core::{CtxUri, Meta};
use ce_lock::LockRequest;
use ce_session::layout::{SessionLayout, archive_meta, session_meta};
use ce_session::{ArchiveState, ExtractionState, transcript};
use ce_store::{PutMode, PutRequest, WriteOp};
use serde::{Deserialize, Serialize};

use super::Sessions;
use super::phase2::SessionCommitPayload;
use super::{live_messages, meta_u64, read_session};
use crate::error::Result;

/// Whether a commit archived anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommitStatus {
    /// An archive was written and its Phase 2 job enqueued.
    Committed,
    /// Nothing to archive (no message beyond the keep-last policy).
    Skipped,
}

/// What Phase 1 did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CommitOutcome {
    /// The session.
    pub session: CtxUri,
    /// Committed or skipped.
    pub status: CommitStatus,
    /// The archive written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<CtxUri>,
    /// Its number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    /// The Phase 2 job (`ce jobs show ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Messages archived.
    pub archived: u64,
    /// Messages left live (`sessions.keep_last`).
    pub kept: u64,
    /// Whether Phase 2 will extract memories, or why not.
    pub extraction: String,
}

impl Sessions<'_> {
    /// Phase 1 of a commit of the session at `uri` (see the module docs); then the job runner
    /// is woken for Phase 2.
    pub fn commit(&self, uri: &CtxUri) -> Result<CommitOutcome> {
        let layout = SessionLayout::of(uri)?;
        let extraction = match self.config.extraction_off() {
            None => "on".to_owned(),
            Some(why) => format!("off: {why}"),
        };
        let keep = self.config.sessions.keep_last as usize;
        let lock = [LockRequest::exact(layout.session().clone())];
        let out = self.guarded().with_locks(&lock, |fences| {
            ce_core::failpoint::hit("session.phase1.after_lock");
            let session = read_session(self, &layout)?;
            let messages = live_messages(self, &layout)?;
            let cut = messages.len().saturating_sub(keep);
            let (archived, kept) = messages.split_at(cut);
            if archived.is_empty() {
                return Ok(CommitOutcome {
                    session: layout.session().clone(),
                    status: CommitStatus::Skipped,
                    archive: None,
                    number: None,
                    job_id: None,
                    archived: 0,
                    kept: kept.len() as u64,
                    extraction: extraction.clone(),
                });
            }
            let n = meta_u64(&session.meta, session_meta::NEXT_ARCHIVE, 1);
            let archive = layout.archive(n);
            let ids: Vec<String> = archived.iter().map(|m| m.id.clone()).collect();
            let mut meta = Meta::new();
            meta.insert(archive_meta::NUMBER.into(), n.into());
            meta.insert(archive_meta::MESSAGE_IDS.into(), ids.into());
            meta.insert(archive_meta::FIRST_SEQ.into(), archived[0].seq.into());
            meta.insert(
                archive_meta::LAST_SEQ.into(),
                archived[archived.len() - 1].seq.into(),
            );
            meta.insert(
                archive_meta::STATE.into(),
                ArchiveState::Ready.as_str().into(),
            );
            meta.insert(
                archive_meta::EXTRACTION.into(),
                ExtractionState::Pending.as_str().into(),
            );
            meta.insert(archive_meta::JOB.into(), layout.job_key(n).into());
            let mut ops = vec![WriteOp::Put {
                uri: archive.clone(),
                req: PutRequest {
                    mode: PutMode::Replace,
                    content: Some(transcript(archived)),
                    meta,
                    // A number is used once: its counter moves in this transaction.
                    expect_version: Some(0),
                    ..PutRequest::default()
                },
            }];
            for m in archived {
                ops.push(WriteOp::Rm {
                    uri: layout.message(&m.id)?,
                    recursive: false,
                    expect_version: None,
                    trace_id: None,
                });
            }
            let mut counters = Meta::new();
            counters.insert(session_meta::NEXT_ARCHIVE.into(), (n + 1).into());
            counters.insert(session_meta::PHASE1_READY.into(), n.into());
            counters.insert(
                session_meta::ARCHIVED_MESSAGES.into(),
                (meta_u64(&session.meta, session_meta::ARCHIVED_MESSAGES, 0)
                    + archived.len() as u64)
                    .into(),
            );
            ops.push(WriteOp::Put {
                uri: layout.session().clone(),
                req: PutRequest {
                    mode: PutMode::Merge,
                    meta: counters,
                    ..PutRequest::default()
                },
            });
            let payload = SessionCommitPayload {
                session: layout.session().clone(),
                archive: n,
            };
            ops.push(WriteOp::Enqueue(payload.spec(&layout)));
            let outcomes = self.store.apply_fenced(fences, ops)?;
            Ok(CommitOutcome {
                session: layout.session().clone(),
                status: CommitStatus::Committed,
                archive: Some(archive),
                number: Some(n),
                job_id: outcomes.last().and_then(|o| o.job_id.clone()),
                archived: archived.len() as u64,
                kept: kept.len() as u64,
                extraction: extraction.clone(),
            })
        })?;
        self.woke();
        Ok(out)
    }
}
