//! The job queue's row operations on PostgreSQL ([`JobTx`]); the transitions are
//! `crate::jobs::machine`'s, the SQL mirrors `sqlite/jobs.rs`.
//!
//! Concurrency (the writer of SQLite serializes all of this for free):
//! - A transition locks its job row `FOR UPDATE` before the fence looks at it, so it
//!   serializes with every other transition and claim of that job.
//! - A claim takes, per job type and in name order, the transaction-scoped advisory lock
//!   `(JOB_TYPE_LOCK, hashtext(type))` before it counts the type's running jobs, and holds it
//!   to commit: concurrent claimers of one type take turns between count and claim, so a
//!   type never runs above its concurrency. (A lock row per type would do the same but
//!   needs the row to exist; the advisory lock needs nothing.) Candidates are picked
//!   `FOR UPDATE SKIP LOCKED`: a job that a transition holds is skipped, not waited for, and
//!   one a claim took meanwhile no longer matches once that claim committed — no two live
//!   claims ever hold one job.
//! - An insert whose idempotency key a non-terminal job holds does nothing (`ON CONFLICT
//!   DO NOTHING` on the partial unique index, which waits for a concurrent inserter of the
//!   key to commit or roll back); the enqueue then reads the holder.

use std::sync::LazyLock;

use ce_core::Millis;
use postgres::Row;

use super::rows::PgTx;
use super::{PgStore, Tx, WriteKind};
use crate::error::Result;
use crate::jobs::rows::{
    JOB_COLUMNS, JobColumns, JobTx, LIVE_STATES_SQL, StoredJob, job_count, job_params, list_query,
    update_sql,
};
use crate::jobs::{JobCount, JobFilter, JobState};

/// First key of the advisory locks that serialize the claims of one job type ("cejb");
/// two-key advisory locks never collide with the one-key locks of source writes and
/// migrations.
const JOB_TYPE_LOCK: i32 = 0x63_65_6a_62;

/// PostgreSQL's parameter `n`.
fn placeholder(n: usize) -> String {
    format!("${n}")
}

static UPDATE_SQL: LazyLock<String> = LazyLock::new(|| update_sql(placeholder));

static INSERT_SQL: LazyLock<String> = LazyLock::new(|| {
    let values: Vec<String> = (1..=19).map(placeholder).collect();
    format!(
        "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({})
         ON CONFLICT (idempotency_key) WHERE {LIVE_STATES_SQL} DO NOTHING",
        values.join(", ")
    )
});

/// Runnable jobs of `$1` at `$2`, oldest `$3` first, along the partial index
/// `jobs_runnable`; rows other transactions hold are skipped.
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {JOB_COLUMNS} FROM jobs
         WHERE job_type = $1 AND {LIVE_STATES_SQL} AND run_at <= $2
         ORDER BY run_at, id LIMIT $3
         FOR UPDATE SKIP LOCKED"
    )
});

crate::jobs::rows::impl_column_reader!(Row, try_get);

fn job_from_row(r: &Row) -> Result<StoredJob> {
    JobColumns::read(r)?.decode()
}

/// The job `sql` selects by its one parameter `arg`.
fn one(tx: &mut Tx<'_>, sql: &str, arg: &str) -> Result<Option<StoredJob>> {
    tx.query_opt(sql, &[&arg])?
        .map(|r| job_from_row(&r))
        .transpose()
}

/// A job that can be claimed now (enqueued, or retried by an operator) wakes the runners of
/// every process at commit, through the outbox's channel that their engines listen on;
/// delayed jobs and backoffs are found by the runners' polling.
fn wake_if_runnable(tx: &mut Tx<'_>, job: &StoredJob) {
    if job.job.state == JobState::Pending {
        tx.appended();
    }
}

/// Runs `sql` with the columns of `job` as parameters 1 to 19.
fn execute_with(tx: &mut Tx<'_>, sql: &str, job: &StoredJob) -> Result<u64> {
    let c = JobColumns::of(job)?;
    let params: [&(dyn postgres::types::ToSql + Sync); 19] = job_params!(c);
    tx.execute(sql, &params)
}

impl JobTx for PgTx<'_, '_> {
    fn insert_job(&mut self, job: &StoredJob) -> Result<bool> {
        let inserted = execute_with(self.tx, &INSERT_SQL, job)? == 1;
        if inserted {
            wake_if_runnable(self.tx, job);
        }
        Ok(inserted)
    }

    fn job_by_key(&mut self, key: &str) -> Result<Option<StoredJob>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = $1 AND {LIVE_STATES_SQL}"
        );
        one(self.tx, &sql, key)
    }

    fn live_keys(&mut self, from: &str, to: &str) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT idempotency_key FROM jobs
             WHERE idempotency_key >= $1 AND idempotency_key < $2 AND {LIVE_STATES_SQL}"
        );
        Ok(self
            .tx
            .query(&sql, &[&from, &to])?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()?)
    }

    fn job(&mut self, id: &str) -> Result<Option<StoredJob>> {
        one(
            self.tx,
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
            id,
        )
    }

    fn lock_job(&mut self, id: &str) -> Result<Option<StoredJob>> {
        one(
            self.tx,
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 FOR UPDATE"),
            id,
        )
    }

    fn update_job(&mut self, job: &StoredJob) -> Result<()> {
        execute_with(self.tx, &UPDATE_SQL, job)?;
        wake_if_runnable(self.tx, job);
        Ok(())
    }

    fn lock_type(&mut self, job_type: &str) -> Result<()> {
        self.tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&JOB_TYPE_LOCK, &job_type],
        )?;
        Ok(())
    }

    fn running_count(&mut self, job_type: &str, now: Millis) -> Result<u64> {
        let n: i64 = self
            .tx
            .query_one(
                "SELECT count(*) FROM jobs
                 WHERE job_type = $1 AND state = 'running' AND run_at > $2",
                &[&job_type, &now],
            )?
            .try_get(0)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn claim_candidates(
        &mut self,
        job_type: &str,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<StoredJob>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.tx
            .query(&CLAIM_SQL, &[&job_type, &now, &limit])?
            .iter()
            .map(job_from_row)
            .collect()
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<StoredJob>> {
        let (sql, values) = list_query(filter, placeholder);
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let mut args: Vec<&(dyn postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v as &(dyn postgres::types::ToSql + Sync))
            .collect();
        args.push(&limit);
        self.tx
            .query(&sql, &args)?
            .iter()
            .map(job_from_row)
            .collect()
    }

    fn job_counts(&mut self) -> Result<Vec<JobCount>> {
        self.tx
            .query(
                "SELECT job_type, state, count(*) FROM jobs
                 GROUP BY job_type, state ORDER BY job_type, state",
                &[],
            )?
            .iter()
            .map(|r| job_count(r.try_get(0)?, r.try_get::<_, &str>(1)?, r.try_get(2)?))
            .collect()
    }
}

impl PgStore {
    /// A job write transaction: bookkeeping, with a synchronous commit when `durable`.
    fn write_jobs<T>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut dyn JobTx, Millis) -> Result<T>,
    ) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.write(WriteKind::Bookkeeping, |tx, now| {
            if durable {
                tx.batch("SET LOCAL synchronous_commit = on")?;
            }
            f(&mut PgTx::new(tx, consumers), now)
        })
    }

    /// A read snapshot of the job queue.
    fn read_jobs<T>(&self, f: impl FnOnce(&mut dyn JobTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|tx| f(&mut PgTx::new(tx, consumers)))
    }
}

crate::jobs::machine::impl_job_store!(PgStore);

#[cfg(test)]
mod tests {
    use ce_core::Config;
    use ce_testkit::pg::TestDb;

    use super::{CLAIM_SQL, PgStore, WriteKind};

    /// An enqueue wakes the listeners of every process after its commit (the runners wait
    /// on the outbox's channel), so a job enqueued elsewhere starts without a poll.
    #[test]
    fn an_enqueue_notifies_after_commit() {
        use std::time::Duration;

        use postgres::fallible_iterator::FallibleIterator as _;

        use crate::jobs::{JobSpec, JobStore as _};

        let db = TestDb::create("jobs_notify");
        let store = PgStore::open(db.url(), Config::default()).expect("open");
        let mut listener = store.connect_client().expect("listener");
        listener
            .batch_execute(&format!("LISTEN {}", super::super::NOTIFY_CHANNEL))
            .expect("listen");
        store
            .enqueue(JobSpec {
                job_type: "reindex".into(),
                payload: serde_json::json!({"consumer": "keyword"}),
                idempotency_key: None,
                run_at_ms: None,
                parent_job_id: None,
            })
            .expect("enqueue");
        let note = listener
            .notifications()
            .timeout_iter(Duration::from_secs(5))
            .next()
            .expect("notification")
            .expect("notified within 5 s");
        assert_eq!(note.channel(), "ce_outbox");
    }

    /// With the statistics of a long-lived queue (a large finished history, a few hundred
    /// runnable jobs, ANALYZEd), the claim is a range scan of the partial index
    /// `jobs_runnable` for its type, never a walk over the history; as a prepared statement
    /// too, whether planned for its parameters or generically.
    #[test]
    fn claims_use_the_runnable_index() {
        let db = TestDb::create("jobs_explain");
        let store = PgStore::open(db.url(), Config::default()).expect("open");
        let plans = store
            .write(WriteKind::Bookkeeping, |tx, _| {
                tx.batch(
                    "INSERT INTO jobs (id, job_type, payload, state, attempts, run_at,
                         cancel_requested, created_at, updated_at)
                       SELECT 'job-' || lpad(g::text, 8, '0'), 't' || (g % 3), '{}',
                         CASE WHEN g > 29700 THEN 'pending' ELSE 'completed' END, 0,
                         CASE WHEN g > 29700 THEN g END, false, g, g
                       FROM generate_series(1, 30000) g;
                     ANALYZE jobs;",
                )?;
                let mut plans = Vec::new();
                for mode in ["force_custom_plan", "force_generic_plan"] {
                    tx.batch(&format!(
                        "SET LOCAL plan_cache_mode = {mode}; PREPARE claim_probe AS {}",
                        *CLAIM_SQL
                    ))?;
                    let rows = tx.query("EXPLAIN EXECUTE claim_probe('t1', 40000, 10)", &[])?;
                    tx.batch("DEALLOCATE claim_probe")?;
                    let lines: Vec<String> = rows
                        .iter()
                        .map(|r| r.try_get::<_, String>(0))
                        .collect::<Result<_, _>>()?;
                    plans.push((mode, lines.join("\n")));
                }
                Ok(plans)
            })
            .expect("explain");
        for (mode, plan) in plans {
            assert!(plan.contains("jobs_runnable"), "{mode}:\n{plan}");
            assert!(!plan.contains("Sort"), "{mode}: the claim sorts:\n{plan}");
        }
    }
}
