//! Phase 2 of a session commit: the `session-commit` job (payload
//! `{"session": URI, "archive": N}`, idempotency key `session-commit:{session}:{N}`).
//!
//! 1. The archive is read; a missing one (the session was removed) ends the job `gone`, a
//!    `completed` one ends it at once (a rerun after completion adds nothing).
//! 2. Extraction — only with an LLM configured (`Config::extraction_off`): one chat call
//!    per window of the transcript ([`super::extract`]), each answer validated against the
//!    schema (`ce_session::extract`); each window's candidates are **saved on the archive**
//!    as it completes, so a rerun after a crash resumes at the next window and merges the
//!    saved candidates instead of asking the model again (model output may differ between
//!    runs). Without an LLM nothing is extracted and the diff says so.
//! 3. The summary: when sessions are derived (`derive` consumer on), the derive consumer
//!    writes the archive's L0/L1 like any node's; otherwise the configured generator
//!    summarises it here and the layers are written with the completion.
//! 4. Under a TREE lock on the owner's memories (so two commits of one owner cannot both
//!    add the same fact) and an EXACT lock on the archive (so an `rm` of the session cannot
//!    interleave), the owner's memories are read from the source of truth (their facts and
//!    the candidates' are embedded through the embedder's cache, first before the locks),
//!    the merge is planned, and one transaction writes the memories, their `supersedes` links, the
//!    `memory_diffs/{N}` node and the archive's completion marker: a crash before it leaves
//!    nothing half-merged; after it, the marker makes a rerun a no-op.

use std::collections::BTreeSet;
use std::time::Duration;

use ce_core::{
    Classify as _, Clock as _, ContextNode, CoreError, CtxUri, ErrorCode, Meta, SystemClock,
};
use ce_derive::{Budget, DeriveInput, Extractive, Generator as _};
use ce_embed::{EmbedError, Embedder};
use ce_llm::{ChatClient, ChatConfig};
use ce_lock::LockRequest;
use ce_session::layout::{DIFF_OF, SESSION_COMMIT_JOB, SUPERSEDES, SessionLayout, archive_meta};
use ce_session::merge::{FactVectors, Sameness, Semantic};
use ce_session::{
    ArchiveState, Candidate, DiffCounts, ExtractionProgress, ExtractionState, Extractor,
    MemoryDiff, MemoryState, MergeContext, plan_merge,
};
use ce_store::{Job, JobSpec, LinkRequest, PutMode, PutRequest, WriteOp};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::extract::WindowsReport;
use super::{Sessions, subtree};
use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::jobs::{JobContext, JobHandler};

/// The input of a `session-commit` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCommitPayload {
    /// The session.
    pub session: CtxUri,
    /// The archive number.
    pub archive: u64,
}

impl SessionCommitPayload {
    /// The job to enqueue, keyed `session-commit:{session}:{archive}`.
    pub fn spec(&self, layout: &SessionLayout) -> JobSpec {
        JobSpec {
            job_type: SESSION_COMMIT_JOB.into(),
            payload: serde_json::json!(self),
            idempotency_key: Some(layout.job_key(self.archive)),
            run_at_ms: None,
            parent_job_id: None,
        }
    }

    fn parse(payload: &Value) -> Result<(Self, SessionLayout)> {
        let p =
            SessionCommitPayload::deserialize(payload).map_err(|e| CoreError::InvalidField {
                field: "payload",
                reason: format!("not a session-commit payload {{\"session\", \"archive\"}}: {e}"),
            })?;
        let layout = SessionLayout::of(&p.session)?;
        if p.archive == 0 {
            return Err(CoreError::InvalidField {
                field: "payload",
                reason: "archive numbers start at 1".into(),
            }
            .into());
        }
        Ok((p, layout))
    }
}

/// How Phase 2 ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase2Outcome {
    /// Summary, memories, diff and the completion marker written.
    Completed,
    /// The archive was completed by an earlier run: nothing written.
    AlreadyCompleted,
    /// The archive is gone (its session was removed): nothing to do.
    Gone,
}

/// The result of a `session-commit` job (its `progress` once completed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Phase2Report {
    /// The archive.
    pub archive: CtxUri,
    /// How it ended.
    pub outcome: Phase2Outcome,
    /// Where extraction is.
    pub extraction: ExtractionState,
    /// Why extraction is off, or what it left out, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the merge did.
    pub counts: DiffCounts,
    /// The memory diff node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<CtxUri>,
    /// Chat calls this run made for extraction (0 when it reused saved candidates; windows
    /// an earlier run saved are not asked again).
    pub calls: u32,
    /// Tokens read by those calls, as the endpoint reported them.
    pub tokens_in: u64,
    /// Tokens written.
    pub tokens_out: u64,
    /// Who wrote the archive's summary: `derive consumer` or a generator identity.
    pub summary: String,
    /// The extraction's windows (all zero when extraction is off).
    pub windows: WindowsReport,
    /// The rule that decided which memories say the same (see [`MemoryDiff::sameness`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sameness: Option<String>,
}

/// Runs `session-commit` jobs.
pub struct SessionCommitJob;

impl JobHandler for SessionCommitJob {
    fn job_type(&self) -> &'static str {
        SESSION_COMMIT_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        SessionCommitPayload::parse(payload).map(drop)
    }

    fn runs_on(&self, _engine: &Engine) -> bool {
        true
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let (p, layout) = SessionCommitPayload::parse(&job.payload)?;
        let report = engine
            .sessions()
            .phase2(&layout, p.archive, ctx)
            .map_err(rerun_after_a_newer_archive)?;
        let v = serde_json::to_value(&report)
            .map_err(|e| ServerError::Internal(format!("encoding the phase 2 report: {e}")))?;
        Ok(Some(v))
    }
}

/// A version conflict on the archive means it changed while this run read it — the
/// derive consumer writing its L0 / L1 back, or another run of the job. The run is
/// retryable: the next one starts from the archive's saved state (its candidates included),
/// so it repeats no model call and writes nothing twice.
fn rerun_after_a_newer_archive(e: ServerError) -> ServerError {
    if e.code() != ErrorCode::VersionConflict {
        return e;
    }
    ServerError::Failed {
        context: "phase 2 of the session commit (the archive changed meanwhile; it runs again)"
            .into(),
        code: ErrorCode::VersionConflict,
        retryable: true,
        message: e.to_string(),
    }
}

/// The owner's memories as the source holds them, current and superseded.
pub(super) fn owner_memories(s: &Sessions<'_>, layout: &SessionLayout) -> Result<Vec<MemoryState>> {
    let root = layout.memories();
    Ok(subtree(s, &root)?
        .iter()
        .filter_map(|n| MemoryState::from_node(&root, n))
        .collect())
}

pub(super) fn candidates_of(archive: &ContextNode) -> Result<Vec<Candidate>> {
    let raw = archive
        .meta
        .get(archive_meta::CANDIDATES)
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    Vec::<Candidate>::deserialize(raw).map_err(|e| ServerError::Failed {
        context: format!("reading the saved candidates of {}", archive.uri),
        code: ErrorCode::Corrupt,
        retryable: false,
        message: e.to_string(),
    })
}

/// The ids of an archive's messages, in order, from its meta.
pub(super) fn archived_ids(meta: &Meta) -> Vec<String> {
    meta.get(archive_meta::MESSAGE_IDS)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl Sessions<'_> {
    pub(super) fn extractor(&self) -> Result<Extractor> {
        let l = &self.config.derive.llm;
        let api_key = std::env::var(&l.api_key_env).ok().filter(|k| !k.is_empty());
        let client = ChatClient::new(ChatConfig {
            base_url: l.base_url.clone(),
            api_key,
            model: l.model.clone(),
            temperature: l.temperature as f32,
            // A JSON list of memories is longer than a summary.
            max_tokens: l.max_tokens.max(2048),
        })
        .map_err(ce_session::SessionError::from)?;
        let s = &self.config.sessions;
        Ok(Extractor::new(
            client,
            Duration::from_secs(u64::from(s.timeout_seconds)),
            s.extraction_attempts,
            l.max_input_chars,
        ))
    }

    /// The merge's embedding signal: the embedder and the threshold, or why it is off.
    pub(crate) fn semantic(&self) -> std::result::Result<(&dyn Embedder, f64), String> {
        let threshold = self.config.sessions.semantic_threshold;
        if threshold == 0.0 {
            return Err("sessions.semantic_threshold = 0".into());
        }
        match self.embedder {
            Ok(e) => Ok((e, threshold)),
            Err(why) => Err(format!("no embedder: {why}")),
        }
    }

    /// The rule the merge applied, as the diff and the report state it.
    pub(crate) fn sameness_note(
        &self,
        semantic: &std::result::Result<(&dyn Embedder, f64), String>,
    ) -> String {
        let terms = self.config.sessions.similarity_threshold;
        match semantic {
            Ok((e, threshold)) => format!(
                "term overlap >= {terms} or embedding cosine >= {threshold} ({}), distinctive \
                 terms agreeing",
                e.identity()
            ),
            Err(why) => format!(
                "term overlap >= {terms}, distinctive terms agreeing; the embedding signal is \
                 off: {why}"
            ),
        }
    }

    /// Adds to `vectors` the embeddings of the facts of `memories` (current ones) and of
    /// `candidates` that it lacks, through the embedder (and its cache), in batches of
    /// `index.embedding.batch_size`.
    fn embed_facts(
        &self,
        embedder: &dyn Embedder,
        memories: &[MemoryState],
        candidates: &[Candidate],
        vectors: &mut FactVectors,
    ) -> Result<()> {
        let texts: BTreeSet<&str> = memories
            .iter()
            .filter(|m| m.is_current())
            .map(|m| m.fact.as_str())
            .chain(candidates.iter().map(|c| c.fact.as_str()))
            .filter(|t| !vectors.0.contains_key(*t))
            .collect();
        let texts: Vec<&str> = texts.into_iter().collect();
        let e = &self.config.index.embedding;
        let timeout = Duration::from_secs(u64::from(e.timeout_seconds));
        for chunk in texts.chunks(e.batch_size as usize) {
            let got = embedder.embed_texts(chunk, timeout)?;
            if got.len() != chunk.len() {
                return Err(EmbedError::InvalidResponse(format!(
                    "{} vectors for {} facts",
                    got.len(),
                    chunk.len()
                ))
                .into());
            }
            for (t, v) in chunk.iter().zip(got) {
                vectors.0.insert((*t).to_owned(), v);
            }
        }
        Ok(())
    }

    /// The archive's L0/L1 written by Phase 2 itself when sessions are not derived; `None`
    /// when the derive consumer writes them.
    fn summarise(&self, archive: &ContextNode) -> Result<(Option<(String, String)>, String)> {
        if self
            .config
            .derived_types()
            .contains(&ce_core::ContextType::Session)
        {
            return Ok((None, "derive consumer".into()));
        }
        let input = DeriveInput::Leaf {
            content: archive.layers.content.clone(),
        };
        let budget = Budget::from(self.config.projector);
        let timeout = Duration::from_secs(u64::from(self.config.derive.timeout_seconds));
        let generator = ce_derive::from_config(&self.config.derive)?;
        let derived = match generator
            .derive(std::slice::from_ref(&input), budget, timeout)
            .remove(0)
        {
            Ok(d) => (d, generator.identity().key()),
            Err(e) if e.is_retryable() => return Err(ServerError::Derive(e)),
            // A permanent refusal falls back to the extractive summary, as the consumer does.
            Err(_) => {
                let x = Extractive::default();
                (
                    x.derive(&[input], budget, timeout).remove(0)?,
                    x.identity().key(),
                )
            }
        };
        let (d, by) = derived;
        Ok((
            d.abstract_text
                .zip(d.overview)
                .filter(|(a, _)| !a.is_empty()),
            by,
        ))
    }

    /// Runs Phase 2 for archive `n` of `layout`'s session (see the module docs).
    pub fn phase2(
        &self,
        layout: &SessionLayout,
        n: u64,
        ctx: &JobContext<'_>,
    ) -> Result<Phase2Report> {
        let archive_uri = layout.archive(n);
        let mut report = Phase2Report {
            archive: archive_uri.clone(),
            outcome: Phase2Outcome::Gone,
            extraction: ExtractionState::Pending,
            note: None,
            counts: DiffCounts::default(),
            diff: None,
            calls: 0,
            tokens_in: 0,
            tokens_out: 0,
            summary: String::new(),
            windows: WindowsReport::default(),
            sameness: None,
        };
        let Some(mut archive) = self.store.read_node(&archive_uri)? else {
            return Ok(report);
        };
        match ArchiveState::of(&archive.meta) {
            Some(ArchiveState::Completed) => {
                report.outcome = Phase2Outcome::AlreadyCompleted;
                report.extraction = ExtractionState::of(&archive.meta);
                report.diff = Some(layout.diff(n));
                return Ok(report);
            }
            Some(ArchiveState::Ready) => {}
            None => {
                return Err(ServerError::Failed {
                    context: format!("phase 2 of {archive_uri}"),
                    code: ErrorCode::StateTransition,
                    retryable: false,
                    message: "the archive has no phase-1 state: it was not published by a commit"
                        .into(),
                });
            }
        }
        ctx.checkpoint()?;

        // Extraction, saved window by window before the merge.
        let off = self.config.extraction_off();
        let (extraction, candidates, partial) = match (ExtractionState::of(&archive.meta), &off) {
            (ExtractionState::Extracted, _) => {
                let p = ExtractionProgress::of(&archive.meta).unwrap_or_default();
                report.windows = WindowsReport {
                    total: p.windows + p.left_out_windows,
                    extracted: p.windows,
                    this_run: 0,
                    left_out: p.left_out_windows,
                    left_out_messages: p.left_out_messages,
                };
                let note = archive
                    .meta
                    .get(archive_meta::EXTRACTION_NOTE)
                    .and_then(Value::as_str)
                    .filter(|_| p.left_out_windows > 0)
                    .map(str::to_owned);
                (ExtractionState::Extracted, candidates_of(&archive)?, note)
            }
            (_, Some(why)) => {
                report.note = Some(why.clone());
                (ExtractionState::Off, Vec::new(), None)
            }
            (_, None) => {
                let x = self.extract_windows(layout, &mut archive, ctx, &mut report)?;
                ce_core::failpoint::hit("session.phase2.after_extract");
                (ExtractionState::Extracted, x.candidates, x.note)
            }
        };
        if partial.is_some() {
            report.note.clone_from(&partial);
        }
        ctx.checkpoint()?;
        let (summary, summary_by) = self.summarise(&archive)?;
        report.summary = summary_by.clone();
        ctx.checkpoint()?;

        // The merge and the completion, in one transaction under the owner's memories lock.
        // The archive's EXACT lock too: an `rm -r` of the session (TREE) waits for the merge,
        // or the merge, once it has the lock, finds the archive gone and writes nothing (its
        // diff would otherwise re-create the removed session's folders).
        let lock = [
            LockRequest::tree(layout.memories()),
            LockRequest::exact(archive_uri.clone()),
        ];
        let now = SystemClock.now_ms();
        let messages =
            ce_session::transcript_texts(&archive.layers.content, &archived_ids(&archive.meta));
        // The facts are embedded before the locks are taken (through the embedding cache, so
        // under the locks only memories written meanwhile are new to it).
        let semantic = self.semantic();
        let mut vectors = FactVectors::default();
        if let Ok((e, _)) = &semantic
            && !candidates.is_empty()
        {
            self.embed_facts(
                *e,
                &owner_memories(self, layout)?,
                &candidates,
                &mut vectors,
            )?;
        }
        let (diff, outcome) = self.guarded().with_locks(&lock, |fences| {
            let Some(current_archive) = self.store.read_node(&archive_uri)? else {
                return Ok((None, Phase2Outcome::Gone));
            };
            if ArchiveState::of(&current_archive.meta) == Some(ArchiveState::Completed) {
                return Ok((None, Phase2Outcome::AlreadyCompleted));
            }
            let memories = layout.memories();
            let existing = owner_memories(self, layout)?;
            if let Ok((e, _)) = &semantic
                && !candidates.is_empty()
            {
                self.embed_facts(*e, &existing, &candidates, &mut vectors)?;
            }
            let mctx = MergeContext {
                memories: &memories,
                archive: &archive_uri,
                now_ms: now,
                sameness: Sameness {
                    terms: self.config.sessions.similarity_threshold,
                    semantic: semantic.as_ref().ok().map(|(_, threshold)| Semantic {
                        similarity: &vectors,
                        threshold: *threshold,
                    }),
                },
                messages: &messages,
            };
            let plan = plan_merge(&mctx, existing, &candidates);
            let mut ops = Vec::new();
            for m in plan.writes.values() {
                ops.push(WriteOp::Put {
                    uri: m.uri.clone(),
                    req: PutRequest {
                        mode: PutMode::Merge,
                        abstract_text: Some(m.fact.clone()),
                        overview: Some(m.context.clone()),
                        content: Some(m.evidence.clone()),
                        meta: m.meta(),
                        ..PutRequest::default()
                    },
                });
            }
            for m in plan.writes.values() {
                if let Some(old) = &m.supersedes {
                    ops.push(WriteOp::SetRelations {
                        from: m.uri.clone(),
                        edges: vec![LinkRequest {
                            from: m.uri.clone(),
                            to: old.clone(),
                            relation_type: SUPERSEDES.into(),
                            weight: 1.0,
                            reason: format!("superseded by the commit of {archive_uri}"),
                            trace_id: None,
                        }],
                        trace_id: None,
                    });
                }
            }
            let mut diff = MemoryDiff::new(
                layout.session().as_str(),
                archive_uri.as_str(),
                if extraction == ExtractionState::Off {
                    ExtractionState::Off
                } else {
                    ExtractionState::Merged
                },
                off.clone().or_else(|| partial.clone()),
                (extraction != ExtractionState::Off).then(|| self.config.derive.llm.model.clone()),
                plan.entries,
                now,
            );
            if extraction != ExtractionState::Off {
                diff.sameness = Some(self.sameness_note(&semantic));
            }
            let diff_uri = layout.diff(n);
            let mut dmeta = Meta::new();
            dmeta.insert("memory_diff".into(), true.into());
            dmeta.insert("memory_diff_archive".into(), archive_uri.as_str().into());
            dmeta.insert(
                "memory_diff_extraction".into(),
                diff.extraction.as_str().into(),
            );
            ops.push(WriteOp::Put {
                uri: diff_uri.clone(),
                req: PutRequest {
                    mode: PutMode::Replace,
                    abstract_text: Some(diff.abstract_text()),
                    overview: Some(diff.overview()),
                    content: Some(serde_json::to_string_pretty(&diff).map_err(|e| {
                        ServerError::Internal(format!("encoding the memory diff: {e}"))
                    })?),
                    meta: dmeta,
                    ..PutRequest::default()
                },
            });
            ops.push(WriteOp::SetRelations {
                from: diff_uri.clone(),
                edges: vec![LinkRequest {
                    from: diff_uri.clone(),
                    to: archive_uri.clone(),
                    relation_type: DIFF_OF.into(),
                    weight: 1.0,
                    reason: "the memory changes of this archive's commit".into(),
                    trace_id: None,
                }],
                trace_id: None,
            });
            let mut ameta = Meta::new();
            ameta.insert(
                archive_meta::STATE.into(),
                ArchiveState::Completed.as_str().into(),
            );
            ameta.insert(
                archive_meta::EXTRACTION.into(),
                diff.extraction.as_str().into(),
            );
            ameta.insert(archive_meta::DIFF.into(), diff_uri.as_str().into());
            ameta.insert(archive_meta::SUMMARY.into(), summary_by.clone().into());
            if let Some(why) = &off {
                ameta.insert(archive_meta::EXTRACTION_NOTE.into(), why.clone().into());
            }
            let (l0, l1) = summary.clone().unzip();
            ops.push(WriteOp::Put {
                uri: archive_uri.clone(),
                req: PutRequest {
                    mode: PutMode::Merge,
                    abstract_text: l0,
                    overview: l1,
                    meta: ameta,
                    expect_version: Some(current_archive.version),
                    ..PutRequest::default()
                },
            });
            ce_core::failpoint::hit("session.phase2.before_commit");
            self.store.apply_fenced(fences, ops)?;
            Ok((Some(diff), Phase2Outcome::Completed))
        })?;
        self.woke();
        report.outcome = outcome;
        if let Some(d) = diff {
            report.sameness = d.sameness;
            report.extraction = d.extraction;
            report.counts = d.counts;
            report.diff = Some(layout.diff(n));
        }
        Ok(report)
    }
}
