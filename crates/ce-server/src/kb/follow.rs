//! Following an entry's work to its end (`ce kb add` / `rm-items` / `reindex` without
//! `--no-wait`): it is done when the entry's jobs have ended and every item of its roots'
//! subtrees is terminal (or gone). Locally the follower does the work itself meanwhile —
//! claims the due jobs and settles the items on one thread while another drains the
//! deliveries, as `ce serve` would; whatever it leaves (it was interrupted, or the consumers
//! cannot index) is durable and continues in `ce serve` / `ce worker`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ce_store::ItemStatus;
use ce_store::kb::subtree_of;
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::Result;

/// How long a local follow runs jobs between two reads of its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Where an entry's work stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbProgress {
    /// Items of the followed subtrees that are completed or failed.
    pub done: u64,
    /// Items of the followed subtrees.
    pub total: u64,
    /// Of them, failed.
    pub failed: u64,
    /// Items by status.
    pub by_status: BTreeMap<ItemStatus, u64>,
    /// The entry's jobs not ended yet.
    pub jobs_open: u64,
    /// Whether everything has ended.
    pub finished: bool,
}

/// How a local follow ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KbFollowed {
    /// The last progress.
    pub progress: KbProgress,
    /// Why it stopped before the end (the rest continues in `ce serve` / `ce worker`).
    pub waiting: Option<String>,
}

impl Engine {
    /// The progress of `roots`' subtrees in `base` and of `jobs`.
    pub fn kb_progress(&self, base: &str, roots: &[String], jobs: &[String]) -> Result<KbProgress> {
        let all = self.store().kb_items(base)?;
        let mut p = KbProgress::default();
        for r in roots {
            for i in subtree_of(&all, r) {
                p.total += 1;
                *p.by_status.entry(i.status).or_default() += 1;
                if i.status.is_terminal() {
                    p.done += 1;
                }
                if i.status == ItemStatus::Failed {
                    p.failed += 1;
                }
            }
        }
        for j in jobs {
            match self.job(j) {
                Ok(job) if !job.state.is_terminal() => p.jobs_open += 1,
                Ok(_) => {}
                // A job of a removed base may be gone with nothing left to wait for.
                Err(_) => {}
            }
        }
        p.finished = p.jobs_open == 0 && p.done == p.total;
        Ok(p)
    }

    /// Does the work of `roots` / `jobs` here until it has ended, calling `on_change` at each
    /// change of progress; stops early (with the reason) when the deliveries cannot be
    /// drained here (no consumer ready) while items wait for them.
    ///
    /// The two stages overlap, as in `ce serve`: this thread runs the jobs (read, parse,
    /// chunk, commit) and settles items, while a second one drains the deliveries those
    /// commits append — so the embedder works while files are parsed, and items complete
    /// from the first minutes of a large add instead of all at the end.
    pub fn kb_follow(
        &self,
        base: &str,
        roots: &[String],
        jobs: &[String],
        on_change: &dyn Fn(&KbProgress),
    ) -> Result<KbFollowed> {
        let drainer = Drainer::default();
        std::thread::scope(|s| {
            let handle = s.spawn(|| drainer.run(self));
            let out = self.follow_jobs(base, roots, jobs, on_change, &drainer);
            drainer.stop.store(true, Ordering::Release);
            // A panic in the drainer is reported as such; its work is durable.
            let joined = handle.join();
            match (out, joined) {
                (Ok(f), Err(_)) => Err(crate::error::ServerError::Internal(format!(
                    "the drain thread panicked (progress {} / {} items)",
                    f.progress.done, f.progress.total
                ))),
                (out, _) => out,
            }
        })
    }

    /// The job side of [`Engine::kb_follow`].
    fn follow_jobs(
        &self,
        base: &str,
        roots: &[String],
        jobs: &[String],
        on_change: &dyn Fn(&KbProgress),
        drainer: &Drainer,
    ) -> Result<KbFollowed> {
        let poll = Duration::from_millis(self.config().jobs.poll_interval_ms.min(200));
        let mut last: Option<KbProgress> = None;
        let mut drained_seen = 0;
        loop {
            let p = self.kb_progress(base, roots, jobs)?;
            if last.as_ref() != Some(&p) {
                on_change(&p);
                last = Some(p.clone());
            }
            if p.finished {
                return Ok(KbFollowed {
                    progress: p,
                    waiting: None,
                });
            }
            // Jobs for up to PROGRESS_EVERY before the progress is read again: reading it
            // (every item of the base) after each claim would make following quadratic.
            let ran = if self.config().jobs.enabled {
                let until = Instant::now() + PROGRESS_EVERY;
                let mut ran = 0;
                loop {
                    let r = self.run_claimable_jobs()?.ran;
                    ran += r;
                    if r == 0 || Instant::now() >= until {
                        break ran;
                    }
                }
            } else {
                0
            };
            let settled = self.kb_settle()?;
            if ran > 0 {
                continue;
            }
            let embedding = p
                .by_status
                .get(&ItemStatus::Embedding)
                .copied()
                .unwrap_or(0);
            // What the drain thread did since the last look, and whether it is stuck.
            let (drained, failure) = drainer.since(&mut drained_seen);
            if let Some(e) = failure
                && embedding > 0
                && p.jobs_open == 0
                && drained == 0
            {
                return Ok(KbFollowed {
                    progress: p,
                    waiting: Some(format!(
                        "{embedding} items wait for the indexes, which cannot be updated \
                         here: {e}"
                    )),
                });
            }
            if !self.config().jobs.enabled && p.jobs_open > 0 && drained == 0 && settled == 0 {
                return Ok(KbFollowed {
                    progress: p,
                    waiting: Some("jobs.enabled is false: no job runs here".into()),
                });
            }
            if drained == 0 && settled == 0 {
                let readiness = self.readiness();
                if embedding > 0 && p.jobs_open == 0 && !readiness.ready {
                    // A consumer that cannot run here (no model, another model's index)
                    // would keep them embedding: say so rather than wait forever.
                    return Ok(KbFollowed {
                        progress: p,
                        waiting: Some(format!(
                            "{embedding} items wait for the indexes, which are not ready \
                             here: {}",
                            readiness.reasons.join("; ")
                        )),
                    });
                }
                std::thread::sleep(poll);
            }
        }
    }
}

/// The drain side of [`Engine::kb_follow`]: drains the outbox until told to stop, counting
/// what it claims as it goes and keeping the last failure (cleared by the next success).
#[derive(Default)]
struct Drainer {
    stop: AtomicBool,
    /// Deliveries claimed by the passes that have ended.
    ended: AtomicU64,
    /// Deliveries claimed so far by the pass under way.
    current: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl Drainer {
    fn run(&self, engine: &Engine) {
        let poll = Duration::from_millis(engine.config().index.worker.poll_interval_ms)
            .clamp(Duration::from_millis(20), Duration::from_millis(200));
        while !self.stop.load(Ordering::Acquire) {
            let pass = engine.drain(&|p| self.current.store(p.claimed, Ordering::Release));
            let claimed = match pass {
                Ok(r) => {
                    *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    r.progress.claimed
                }
                Err(e) => {
                    *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    0
                }
            };
            self.ended.fetch_add(claimed, Ordering::AcqRel);
            self.current.store(0, Ordering::Release);
            if claimed == 0 {
                std::thread::sleep(poll);
            }
        }
    }

    /// Deliveries claimed since `seen` (which is moved on), and the last pass's failure.
    fn since(&self, seen: &mut u64) -> (u64, Option<String>) {
        let now = self.ended.load(Ordering::Acquire) + self.current.load(Ordering::Acquire);
        // Between a pass's end and the reset of `current` a pass may be counted twice: the
        // count is a sign of work, never a total, and `seen` never moves back.
        let drained = now.saturating_sub(*seen);
        *seen = (*seen).max(now);
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (drained, failure)
    }
}
