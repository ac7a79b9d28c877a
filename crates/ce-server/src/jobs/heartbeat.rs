//! The lease kept beside a running handler: a thread renews the claim every
//! `[jobs].heartbeat_seconds`, sending the progress the handler last reported, and records
//! what the answer says (a cancel was asked for) or that the claim is gone (the lease ended
//! and another runner took the job). The handler reads both at its checkpoints through its
//! [`JobContext`]; the heartbeat never interrupts it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ce_core::{Classify as _, ErrorCode};
use ce_store::{JobClaim, JobStore};
use serde_json::Value;
use tracing::{debug, warn};

use super::JobStop;
use crate::error::{Result, ServerError};
use crate::flag::Flag;

/// What the heartbeat and the handler of one job share.
#[derive(Default)]
pub(super) struct Beat {
    /// The progress reported since the last heartbeat.
    progress: Mutex<Option<Value>>,
    cancel_requested: AtomicBool,
    lost: AtomicBool,
    stopped: Flag,
}

impl Beat {
    /// Renews `claim` every `every` until [`Beat::stop`], or until the claim is gone.
    pub(super) fn keep(&self, jobs: &dyn JobStore, claim: &JobClaim, every: Duration) {
        loop {
            if self.stopped.wait(every) {
                return;
            }
            let progress = self
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            match jobs.heartbeat(claim, progress) {
                Ok(h) => {
                    debug!(job_id = %claim.job_id, cancel = h.cancel_requested, "job heartbeat");
                    if h.cancel_requested {
                        self.cancel_requested.store(true, Ordering::SeqCst);
                    }
                }
                Err(e) if matches!(e.code(), ErrorCode::ClaimConflict | ErrorCode::NotFound) => {
                    warn!(job_id = %claim.job_id, error = %e, "job lease lost");
                    self.lost.store(true, Ordering::SeqCst);
                    return;
                }
                // The lease may still hold: the next heartbeat tries again.
                Err(e) => warn!(job_id = %claim.job_id, error = %e, "job heartbeat failed"),
            }
        }
    }

    /// Ends [`Beat::keep`].
    pub(super) fn stop(&self) {
        self.stopped.set();
    }

    /// Why the handler should stop, if it should: a lost lease first (nothing it does can
    /// be acknowledged any more), then a cancel.
    pub(super) fn stop_reason(&self) -> Option<JobStop> {
        if self.lost.load(Ordering::SeqCst) {
            Some(JobStop::LeaseLost)
        } else if self.cancel_requested.load(Ordering::SeqCst) {
            Some(JobStop::Cancelled)
        } else {
            None
        }
    }
}

/// A running handler's view of its job's lease.
pub struct JobContext<'a> {
    job_id: &'a str,
    beat: &'a Beat,
}

impl<'a> JobContext<'a> {
    pub(super) fn new(job_id: &'a str, beat: &'a Beat) -> Self {
        JobContext { job_id, beat }
    }

    /// Records progress (e.g. `{"stage": "requeue", "done": 10}`), stored with the next
    /// heartbeat (best effort: a newer report replaces one not yet sent).
    pub fn report(&self, progress: Value) {
        *self
            .beat
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(progress);
    }

    /// A point where the handler may stop: `JobStopped` when the last heartbeat said a
    /// cancel was asked for, or found the lease lost.
    pub fn checkpoint(&self) -> Result<()> {
        match self.beat.stop_reason() {
            Some(stop) => Err(ServerError::JobStopped {
                job_id: self.job_id.to_owned(),
                stop,
            }),
            None => Ok(()),
        }
    }
}
