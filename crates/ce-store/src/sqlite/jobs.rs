//! The job queue's row operations on SQLite ([`JobTx`]); the transitions are
//! `crate::jobs::machine`'s. The single writer serializes every write transaction, so a row
//! read in one is as good as locked: [`JobTx::lock_job`] is a plain read and
//! [`JobTx::lock_type`] has nothing to do.

use std::sync::LazyLock;

use ce_core::Millis;
use rusqlite::{Row, params};

use super::rows::SqlTx;
use super::{Durability, SqliteStore};
use crate::error::Result;
use crate::jobs::rows::{
    JOB_COLUMNS, JobColumns, JobTx, LIVE_STATES_SQL, StoredJob, job_count, job_params, list_query,
    update_sql,
};
use crate::jobs::{JobCount, JobFilter};

/// SQLite's parameter `n`.
fn placeholder(n: usize) -> String {
    format!("?{n}")
}

static UPDATE_SQL: LazyLock<String> = LazyLock::new(|| update_sql(placeholder));

crate::jobs::rows::impl_column_reader!(Row<'_>, get);

/// Runs `sql` with `p` and decodes every row it returns as a job.
fn jobs(tx: &SqlTx<'_>, sql: &str, p: impl rusqlite::Params) -> Result<Vec<StoredJob>> {
    let mut stmt = tx.conn.prepare_cached(sql)?;
    let mut rows = stmt.query(p)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(JobColumns::read(r)?.decode()?);
    }
    Ok(out)
}

fn one(tx: &SqlTx<'_>, sql: &str, p: impl rusqlite::Params) -> Result<Option<StoredJob>> {
    Ok(jobs(tx, sql, p)?.into_iter().next())
}

/// Runs `sql` with the columns of `job` as parameters 1 to 19.
fn execute_with(tx: &SqlTx<'_>, sql: &str, job: &StoredJob) -> Result<usize> {
    let c = JobColumns::of(job)?;
    let params: [&dyn rusqlite::ToSql; 19] = job_params!(c);
    Ok(tx.conn.prepare_cached(sql)?.execute(params.as_slice())?)
}

impl JobTx for SqlTx<'_> {
    fn insert_job(&mut self, job: &StoredJob) -> Result<bool> {
        let sql = format!(
            "INSERT INTO jobs ({JOB_COLUMNS})
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19)
             ON CONFLICT (idempotency_key) WHERE {LIVE_STATES_SQL} DO NOTHING"
        );
        Ok(execute_with(self, &sql, job)? == 1)
    }

    fn job_by_key(&mut self, key: &str) -> Result<Option<StoredJob>> {
        one(
            self,
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE idempotency_key = ?1 AND {LIVE_STATES_SQL}"
            ),
            [key],
        )
    }

    fn live_keys(&mut self, from: &str, to: &str) -> Result<Vec<String>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT idempotency_key FROM jobs
             WHERE idempotency_key >= ?1 AND idempotency_key < ?2 AND {LIVE_STATES_SQL}"
        ))?;
        let keys = st.query_map([from, to], |r| r.get::<_, String>(0))?;
        Ok(keys.collect::<rusqlite::Result<Vec<String>>>()?)
    }

    fn job(&mut self, id: &str) -> Result<Option<StoredJob>> {
        one(
            self,
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
            [id],
        )
    }

    fn lock_job(&mut self, id: &str) -> Result<Option<StoredJob>> {
        self.job(id)
    }

    fn update_job(&mut self, job: &StoredJob) -> Result<()> {
        execute_with(self, &UPDATE_SQL, job)?;
        Ok(())
    }

    fn lock_type(&mut self, _job_type: &str) -> Result<()> {
        Ok(())
    }

    fn running_count(&mut self, job_type: &str, now: Millis) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT count(*) FROM jobs
                 WHERE job_type = ?1 AND state = 'running' AND run_at > ?2",
            )?
            .query_row(params![job_type, now], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn claim_candidates(
        &mut self,
        job_type: &str,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<StoredJob>> {
        jobs(
            self,
            &claim_sql(),
            params![job_type, now, i64::try_from(limit).unwrap_or(i64::MAX)],
        )
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<StoredJob>> {
        let (sql, values) = list_query(filter, placeholder);
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let mut args: Vec<&dyn rusqlite::ToSql> =
            values.iter().map(|v| v as &dyn rusqlite::ToSql).collect();
        args.push(&limit);
        jobs(self, &sql, args.as_slice())
    }

    fn job_counts(&mut self) -> Result<Vec<JobCount>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job_type, state, count(*) FROM jobs
             GROUP BY job_type, state ORDER BY job_type, state",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?))
        })?;
        rows.map(|r| {
            let (t, s, n) = r?;
            job_count(t, &s, n)
        })
        .collect()
    }
}

/// The claim query: runnable jobs of `?1` at `?2`, oldest `?3` first, along the partial index
/// `jobs_runnable`.
fn claim_sql() -> String {
    format!(
        "SELECT {JOB_COLUMNS} FROM jobs
         WHERE job_type = ?1 AND {LIVE_STATES_SQL} AND run_at <= ?2
         ORDER BY run_at, id LIMIT ?3"
    )
}

impl SqliteStore {
    /// A job write transaction (FULL durability when `durable`, else NORMAL).
    fn write_jobs<T>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut dyn JobTx, Millis) -> Result<T>,
    ) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        let durability = if durable {
            Durability::Full
        } else {
            Durability::Normal
        };
        self.write(durability, |conn, now| {
            f(&mut SqlTx::new(conn, consumers), now)
        })
    }

    /// A read snapshot of the job queue.
    fn read_jobs<T>(&self, f: impl FnOnce(&mut dyn JobTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|conn| f(&mut SqlTx::new(conn, consumers)))
    }
}

crate::jobs::machine::impl_job_store!(SqliteStore);

#[cfg(test)]
mod tests {
    use super::claim_sql;

    /// The claim walks the partial index of runnable jobs for its type, never the table.
    #[test]
    fn claims_use_the_runnable_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = super::SqliteStore::open(dir.path(), ce_core::Config::default()).expect("open");
        let plan: Vec<String> = store
            .read(|conn| {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {}", claim_sql()))?;
                let rows = stmt.query_map(rusqlite::params!["reindex", 0, 10], |r| {
                    r.get::<_, String>(3)
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .expect("explain");
        let plan = plan.join("\n");
        assert!(plan.contains("USING INDEX jobs_runnable"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "the claim sorts: {plan}");
    }
}
