//! The row primitives of the job queue ([`JobTx`]) that each dialect implements with its own
//! SQL, and the stored form of a job both dialects read and write. What a transition means
//! is decided once, in [`super::machine`].

use ce_core::Millis;

use super::{Job, JobCount, JobFilter, JobState};
use crate::error::{Result, StoreError};

/// The columns of `jobs` in the order of [`JobColumns`]' fields; `id` first, so that an
/// update binds the same parameters as an insert ([`update_sql`]).
pub(crate) const JOB_COLUMNS: &str = "id, job_type, payload, idempotency_key, state, attempts, \
     run_at, claimed_by, claim_token, claimed_until, parent_job_id, progress, cancel_requested, \
     error_code, last_error, created_at, updated_at, started_at, finished_at";

/// The stored states that hold an idempotency key and can run again: the predicate of the
/// partial indexes `jobs_live_key` and `jobs_runnable`, written identically in every query
/// that must use them.
pub(crate) const LIVE_STATES_SQL: &str = "state IN ('pending', 'delayed', 'failed', 'running')";

/// `UPDATE jobs SET <every column but id> WHERE id = <first parameter>`, with the dialect's
/// placeholder for parameter `n` (1-based, in [`JOB_COLUMNS`] order).
pub(crate) fn update_sql(placeholder: fn(usize) -> String) -> String {
    let sets: Vec<String> = JOB_COLUMNS
        .split(", ")
        .enumerate()
        .skip(1)
        .map(|(i, c)| format!("{c} = {}", placeholder(i + 1)))
        .collect();
    format!(
        "UPDATE jobs SET {} WHERE id = {}",
        sets.join(", "),
        placeholder(1)
    )
}

/// The `SELECT` of [`JobTx::list_jobs`] with the dialect's placeholders, and the text values
/// of its parameters; the limit is the parameter after them. Only the filters given appear
/// in the statement, so each combination is planned (and cached) with the index that serves
/// it.
pub(crate) fn list_query(
    filter: &JobFilter,
    placeholder: fn(usize) -> String,
) -> (String, Vec<&str>) {
    let given: Vec<(&str, &str)> = [
        ("state", filter.state.map(JobState::as_str)),
        ("job_type", filter.job_type.as_deref()),
        ("parent_job_id", filter.parent_job_id.as_deref()),
    ]
    .into_iter()
    .filter_map(|(col, v)| v.map(|v| (col, v)))
    .collect();
    let conds: Vec<String> = given
        .iter()
        .enumerate()
        .map(|(i, (col, _))| format!("{col} = {}", placeholder(i + 1)))
        .collect();
    let filter_sql = if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs {filter_sql} ORDER BY id DESC LIMIT {}",
        placeholder(given.len() + 1)
    );
    (sql, given.into_iter().map(|(_, v)| v).collect())
}

/// A job as stored: the public [`Job`] and the token of the claim that holds or last held
/// it (never shown: only the live claim may present it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredJob {
    /// The job.
    pub(crate) job: Job,
    /// The claim token.
    pub(crate) token: Option<String>,
}

/// The columns of one `jobs` row as the dialects bind and read them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobColumns {
    pub(crate) id: String,
    pub(crate) job_type: String,
    pub(crate) payload: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) state: String,
    pub(crate) attempts: i64,
    pub(crate) run_at: Option<i64>,
    pub(crate) claimed_by: Option<String>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_until: Option<i64>,
    pub(crate) parent_job_id: Option<String>,
    pub(crate) progress: Option<String>,
    pub(crate) cancel_requested: bool,
    pub(crate) error_code: Option<String>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
}

/// Typed reads of one result row, whatever the dialect's row type.
pub(crate) trait ColumnReader {
    /// A `TEXT NOT NULL` column.
    fn text(&self, i: usize) -> Result<String>;
    /// A nullable `TEXT` column.
    fn text_opt(&self, i: usize) -> Result<Option<String>>;
    /// An integer column.
    fn int(&self, i: usize) -> Result<i64>;
    /// A nullable integer column.
    fn int_opt(&self, i: usize) -> Result<Option<i64>>;
    /// A boolean column.
    fn flag(&self, i: usize) -> Result<bool>;
}

/// Implements [`ColumnReader`] for a dialect's row type `$row` whose generic getter
/// `$get(i)` fails with an error the store converts.
macro_rules! impl_column_reader {
    ($row:ty, $get:ident) => {
        impl $crate::jobs::rows::ColumnReader for $row {
            fn text(&self, i: usize) -> $crate::Result<String> {
                Ok(self.$get(i)?)
            }

            fn text_opt(&self, i: usize) -> $crate::Result<Option<String>> {
                Ok(self.$get(i)?)
            }

            fn int(&self, i: usize) -> $crate::Result<i64> {
                Ok(self.$get(i)?)
            }

            fn int_opt(&self, i: usize) -> $crate::Result<Option<i64>> {
                Ok(self.$get(i)?)
            }

            fn flag(&self, i: usize) -> $crate::Result<bool> {
                Ok(self.$get(i)?)
            }
        }
    };
}
pub(crate) use impl_column_reader;

/// The parameters of a statement over [`JOB_COLUMNS`] (insert, update), from a
/// [`JobColumns`] value, as an array the caller types with its dialect's `ToSql`.
macro_rules! job_params {
    ($c:ident) => {
        [
            &$c.id,
            &$c.job_type,
            &$c.payload,
            &$c.idempotency_key,
            &$c.state,
            &$c.attempts,
            &$c.run_at,
            &$c.claimed_by,
            &$c.claim_token,
            &$c.claimed_until,
            &$c.parent_job_id,
            &$c.progress,
            &$c.cancel_requested,
            &$c.error_code,
            &$c.last_error,
            &$c.created_at,
            &$c.updated_at,
            &$c.started_at,
            &$c.finished_at,
        ]
    };
}
pub(crate) use job_params;

impl JobColumns {
    /// The columns of a `SELECT {JOB_COLUMNS}` row.
    pub(crate) fn read(r: &impl ColumnReader) -> Result<JobColumns> {
        Ok(JobColumns {
            id: r.text(0)?,
            job_type: r.text(1)?,
            payload: r.text(2)?,
            idempotency_key: r.text_opt(3)?,
            state: r.text(4)?,
            attempts: r.int(5)?,
            run_at: r.int_opt(6)?,
            claimed_by: r.text_opt(7)?,
            claim_token: r.text_opt(8)?,
            claimed_until: r.int_opt(9)?,
            parent_job_id: r.text_opt(10)?,
            progress: r.text_opt(11)?,
            cancel_requested: r.flag(12)?,
            error_code: r.text_opt(13)?,
            last_error: r.text_opt(14)?,
            created_at: r.int(15)?,
            updated_at: r.int(16)?,
            started_at: r.int_opt(17)?,
            finished_at: r.int_opt(18)?,
        })
    }

    /// The columns of `j`.
    pub(crate) fn of(j: &StoredJob) -> Result<JobColumns> {
        let job = &j.job;
        Ok(JobColumns {
            id: job.id.clone(),
            job_type: job.job_type.clone(),
            payload: serde_json::to_string(&job.payload)?,
            idempotency_key: job.idempotency_key.clone(),
            state: job.state.as_str().to_owned(),
            attempts: i64::from(job.attempts),
            run_at: job.run_at_ms,
            claimed_by: job.claimed_by.clone(),
            claim_token: j.token.clone(),
            claimed_until: job.claimed_until_ms,
            parent_job_id: job.parent_job_id.clone(),
            progress: job
                .progress
                .as_ref()
                .map(serde_json::to_string)
                .transpose()?,
            cancel_requested: job.cancel_requested,
            error_code: job.error_code.clone(),
            last_error: job.last_error.clone(),
            created_at: job.created_at_ms,
            updated_at: job.updated_at_ms,
            started_at: job.started_at_ms,
            finished_at: job.finished_at_ms,
        })
    }

    /// The job these columns store; a value that does not decode is corruption.
    pub(crate) fn decode(self) -> Result<StoredJob> {
        let corrupt = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("job {:?}: bad {what}: {e}", self.id))
        };
        let state: JobState = self.state.parse().map_err(|e| corrupt("state", &e))?;
        let payload = serde_json::from_str(&self.payload).map_err(|e| corrupt("payload", &e))?;
        let progress = self
            .progress
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt("progress", &e))?;
        let attempts = u32::try_from(self.attempts).map_err(|e| corrupt("attempts", &e))?;
        Ok(StoredJob {
            token: self.claim_token,
            job: Job {
                id: self.id,
                job_type: self.job_type,
                payload,
                idempotency_key: self.idempotency_key,
                state,
                attempts,
                run_at_ms: self.run_at,
                claimed_by: self.claimed_by,
                claimed_until_ms: self.claimed_until,
                parent_job_id: self.parent_job_id,
                progress,
                cancel_requested: self.cancel_requested,
                error_code: self.error_code,
                last_error: self.last_error,
                created_at_ms: self.created_at,
                updated_at_ms: self.updated_at,
                started_at_ms: self.started_at,
                finished_at_ms: self.finished_at,
            },
        })
    }
}

/// The row operations of the job queue inside one open transaction. Reads see the
/// transaction's snapshot; [`JobTx::lock_job`] and [`JobTx::claim_candidates`] also lock
/// the rows they return until commit where the dialect has row locks (PostgreSQL), so a
/// transition serializes with every other transition of the same job.
pub(crate) trait JobTx {
    /// Inserts `job`; `false` (nothing written) when a non-terminal job already holds its
    /// idempotency key — the unique index `jobs_live_key` decides, also against a
    /// concurrent insert (which it waits for).
    fn insert_job(&mut self, job: &StoredJob) -> Result<bool>;
    /// The non-terminal job holding `key`.
    fn job_by_key(&mut self, key: &str) -> Result<Option<StoredJob>>;
    /// The keys in `[from, to)` that non-terminal jobs hold (a range of `jobs_live_key`).
    fn live_keys(&mut self, from: &str, to: &str) -> Result<Vec<String>>;
    /// One job, unlocked.
    fn job(&mut self, id: &str) -> Result<Option<StoredJob>>;
    /// One job, locked for a transition.
    fn lock_job(&mut self, id: &str) -> Result<Option<StoredJob>>;
    /// Writes every column of `job` but its id.
    fn update_job(&mut self, job: &StoredJob) -> Result<()>;
    /// Serializes the claims of `job_type` until commit (the count of running jobs and the
    /// claims that follow it are one step for concurrent claimers).
    fn lock_type(&mut self, job_type: &str) -> Result<()>;
    /// Running jobs of `job_type` whose lease has not ended at `now`.
    fn running_count(&mut self, job_type: &str, now: Millis) -> Result<u64>;
    /// Up to `limit` jobs of `job_type` runnable at `now` (a live state and `run_at <= now`),
    /// by `(run_at, id)`, locked; rows another transaction holds locked are skipped.
    fn claim_candidates(
        &mut self,
        job_type: &str,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<StoredJob>>;
    /// The jobs `filter` selects, newest (largest id) first.
    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<StoredJob>>;
    /// Counts by type and state, in (type, state name) order.
    fn job_counts(&mut self) -> Result<Vec<JobCount>>;
}

/// One `GROUP BY job_type, state` row of [`JobTx::job_counts`].
pub(crate) fn job_count(job_type: String, state: &str, count: i64) -> Result<JobCount> {
    Ok(JobCount {
        state: state
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("jobs of type {job_type:?}: {e}")))?,
        job_type,
        count: u64::try_from(count).unwrap_or(0),
    })
}
