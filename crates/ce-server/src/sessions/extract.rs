//! Step 2 of Phase 2: windowed extraction (docs/sessions.md, "Phase 2").
//!
//! The archive's transcript is cut at message boundaries into windows that fit the input
//! limit (`ce_session::extract::windows`); each window is one chat call that is shown the
//! owner's most relevant memories and the candidates of the earlier windows (so the model
//! reuses their keys). Each window's validated candidates are saved on the archive with the
//! progress (`archive_extraction_progress`) as soon as they are validated, so a rerun after
//! a crash resumes at the next window: no second call for a finished window, and since
//! nothing is merged before the last window, model output that differs between runs cannot
//! duplicate a memory. At most `sessions.max_windows` windows are extracted; the messages
//! beyond are left out, and the archive's note, the diff and the report say so.

use std::collections::BTreeMap;

use ce_core::{Classify as _, ContextNode, ErrorCode, Meta};
use ce_session::extract::{window_chars, windows};
use ce_session::layout::{SessionLayout, archive_meta};
use ce_session::merge::by_relevance;
use ce_session::{
    Candidate, ExtractionProgress, ExtractionState, MemoryState, Shown, transcript_blocks,
};
use ce_store::{PutMode, PutRequest};
use serde::{Deserialize, Serialize};

use super::Sessions;
use super::phase2::{Phase2Report, archived_ids, candidates_of, owner_memories};
use crate::error::{Result, ServerError};
use crate::jobs::JobContext;

/// Saves of one window's progress tried before a run gives up on an archive that keeps
/// changing under it (each retry follows a change that was not another run's progress).
const SAVE_ATTEMPTS: u32 = 4;

/// The windows of an archive's extraction, as the Phase 2 report states them.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct WindowsReport {
    /// Windows the archive's transcript is cut into.
    pub total: u32,
    /// Windows extracted, by this run and earlier ones.
    pub extracted: u32,
    /// Windows this run extracted (the others were saved by an earlier run).
    pub this_run: u32,
    /// Windows left out: beyond `sessions.max_windows`.
    pub left_out: u32,
    /// Messages of the left-out windows.
    pub left_out_messages: u64,
}

/// What windowed extraction produced.
pub(super) struct Extracted {
    /// Every window's validated candidates, in window order.
    pub candidates: Vec<Candidate>,
    /// What was left out, when windows were (the archive's note).
    pub note: Option<String>,
}

/// `shown` for one window: the owner's current memories, each slot overridden by the latest
/// candidate of an earlier window, most relevant to `text` first.
fn shown_for<'a>(
    current: &'a [MemoryState],
    earlier: &'a [Candidate],
    text: &str,
) -> Vec<Shown<'a>> {
    let mut slots: BTreeMap<(&str, &str), Shown<'a>> = BTreeMap::new();
    for s in current
        .iter()
        .map(Shown::from)
        .chain(earlier.iter().map(Shown::from))
    {
        slots.insert((s.category, s.key), s);
    }
    let all: Vec<Shown<'a>> = slots.into_values().collect();
    by_relevance(&all, text)
}

impl Sessions<'_> {
    /// Runs (or resumes) the extraction of `archive` and returns its candidates once every
    /// window is saved; `archive.version` follows the saves.
    pub(super) fn extract_windows(
        &self,
        layout: &SessionLayout,
        archive: &mut ContextNode,
        ctx: &JobContext<'_>,
        report: &mut Phase2Report,
    ) -> Result<Extracted> {
        let corrupt = |message: String| ServerError::Failed {
            context: format!("reading the extraction progress of {}", archive.uri),
            code: ErrorCode::Corrupt,
            retryable: false,
            message,
        };
        let mut progress = ExtractionProgress::of(&archive.meta).map_err(corrupt)?;
        let mut candidates = candidates_of(archive)?;
        let ids = archived_ids(&archive.meta);
        let content = archive.layers.content.clone();
        let blocks = transcript_blocks(&content, &ids);
        let l = &self.config.derive.llm;
        let planned = windows(&blocks, progress.messages, window_chars(l.max_input_chars));
        let done = progress.windows as usize;
        let total = done + planned.len();
        let allowed = (self.config.sessions.max_windows as usize).saturating_sub(done);
        let (run, left_out) = planned.split_at(planned.len().min(allowed));
        let left_out_messages: usize = left_out.iter().map(|r| r.len()).sum();
        let note = left_out.first().map(|first| {
            format!(
                "windows 1-{} of {total} extracted; the {left_out_messages} messages from {} on \
                 were left out (sessions.max_windows = {})",
                done + run.len(),
                blocks[first.start].0,
                self.config.sessions.max_windows
            )
        });
        report.windows = WindowsReport {
            total: total as u32,
            extracted: progress.windows,
            this_run: 0,
            left_out: left_out.len() as u32,
            left_out_messages: left_out_messages as u64,
        };
        let with_note = |head: String| match &note {
            Some(n) => format!("{head}; {n}"),
            None => head,
        };
        let finished = |p: ExtractionProgress| ExtractionProgress {
            left_out_windows: left_out.len() as u32,
            left_out_messages: left_out_messages as u64,
            ..p
        };
        if run.is_empty() {
            // Nothing (more) to ask: the windows left are all left out.
            let summary = with_note(format!(
                "{} window(s), {} call(s)",
                progress.windows, progress.calls
            ));
            let next = finished(progress);
            self.save_window(archive, &progress, &next, &candidates, Some(summary))?;
            return Ok(Extracted { candidates, note });
        }
        let current: Vec<MemoryState> = owner_memories(self, layout)?
            .into_iter()
            .filter(MemoryState::is_current)
            .collect();
        let extractor = self.extractor()?;
        for (k, range) in run.iter().enumerate() {
            let window = &blocks[range.clone()];
            let text: Vec<&str> = window.iter().map(|(_, b)| *b).collect();
            let shown = shown_for(&current, &candidates, &text.join("\n\n"));
            let number = progress.windows as usize + 1;
            let x = extractor.extract(window, (number, total), &shown)?;
            report.calls += x.calls;
            report.tokens_in += x.tokens_in;
            report.tokens_out += x.tokens_out;
            let last = k + 1 == run.len();
            let mut next = ExtractionProgress {
                messages: range.end,
                windows: progress.windows + 1,
                calls: progress.calls + x.calls,
                tokens_in: progress.tokens_in + x.tokens_in,
                tokens_out: progress.tokens_out + x.tokens_out,
                ..ExtractionProgress::default()
            };
            if last {
                next = finished(next);
            }
            let mut all = candidates.clone();
            all.extend(x.candidates);
            let summary = last.then(|| {
                with_note(format!(
                    "{}: {} window(s), {} call(s)",
                    x.model, next.windows, next.calls
                ))
            });
            self.save_window(archive, &progress, &next, &all, summary)?;
            candidates = all;
            progress = next;
            report.windows.extracted = progress.windows;
            report.windows.this_run += 1;
            if !last {
                ce_core::failpoint::hit("session.phase2.between_windows");
                ctx.checkpoint()?;
            }
        }
        Ok(Extracted { candidates, note })
    }

    /// Saves `candidates` and `next` on the archive, and when `finished` (the note) marks
    /// the extraction `extracted` — provided the saved progress is still `from`. The write
    /// is fenced by the archive's version; when the archive changed for another reason (the
    /// derive consumer writing its L0 / L1) the save is repeated on the new version, so a
    /// finished window is not lost to it. Progress saved by another run fails this one
    /// (retryable: the next run resumes from what that one saved).
    fn save_window(
        &self,
        archive: &mut ContextNode,
        from: &ExtractionProgress,
        next: &ExtractionProgress,
        candidates: &[Candidate],
        finished: Option<String>,
    ) -> Result<()> {
        let mut meta = Meta::new();
        let encode = |e: serde_json::Error| ServerError::Internal(format!("encoding: {e}"));
        meta.insert(
            archive_meta::PROGRESS.into(),
            serde_json::to_value(next).map_err(encode)?,
        );
        meta.insert(
            archive_meta::CANDIDATES.into(),
            serde_json::to_value(candidates).map_err(encode)?,
        );
        if let Some(note) = finished {
            meta.insert(
                archive_meta::EXTRACTION.into(),
                ExtractionState::Extracted.as_str().into(),
            );
            meta.insert(archive_meta::EXTRACTION_NOTE.into(), note.into());
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let put = self.store.put(
                &archive.uri,
                PutRequest {
                    mode: PutMode::Merge,
                    meta: meta.clone(),
                    expect_version: Some(archive.version),
                    ..PutRequest::default()
                },
            );
            let e = match put {
                Ok(out) => {
                    archive.version = out.version;
                    return Ok(());
                }
                Err(e) if e.code() == ErrorCode::VersionConflict && attempt < SAVE_ATTEMPTS => e,
                Err(e) => return Err(e.into()),
            };
            let Some(now) = self.store.read_node(&archive.uri)? else {
                return Err(e.into());
            };
            let theirs = ExtractionProgress::of(&now.meta).ok();
            if theirs.as_ref() != Some(from)
                || ExtractionState::of(&now.meta) != ExtractionState::Pending
            {
                return Err(e.into());
            }
            archive.version = now.version;
        }
    }
}
