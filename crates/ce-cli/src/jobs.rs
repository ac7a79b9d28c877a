//! `ce jobs list|show|cancel|retry` (docs/jobs.md), locally or with `--server URL`
//! (`GET /v1/jobs`, `GET /v1/jobs/{id}`, `POST /v1/jobs/{id}/cancel`,
//! `POST /v1/jobs/{id}/retry`); and what `ce reindex` shows of its job: the answer of a
//! queued job, and a progress line on stderr each time the job it follows changes.

use std::time::Duration;

use ce_core::rfc3339;
use ce_server::jobs::{JobsRun, parse_state};
use ce_server::status::JobsStatus;
use ce_server::wire::JobQueued;
use ce_store::{Job, JobFilter, JobState};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::cli::Cli;
use crate::commands;
use crate::error::{CliError, Result};
use crate::output::{self, Rendered, kv, table};
use crate::remote::{Client, decode, rendered};

/// Jobs listed when `--limit` is not given.
const DEFAULT_LIMIT: u32 = 100;
/// How often `--server` mode reads the job it follows.
const REMOTE_POLL: Duration = Duration::from_millis(200);

/// `ce jobs ...`.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first.
    List(JobsListArgs),
    /// Show one job: state, attempts, lease, progress or result, last error.
    Show(JobIdArg),
    /// Cancel a job: a queued one at once; a running one stops at its next checkpoint.
    Cancel(JobIdArg),
    /// Run a dead or cancelled job again, with a fresh retry budget.
    Retry(JobIdArg),
}

/// `ce jobs list`.
#[derive(Debug, Args)]
pub struct JobsListArgs {
    /// Only this state: pending, delayed, running, completed, failed, cancelled or dead.
    #[arg(long, value_name = "S")]
    pub state: Option<String>,
    /// Only this job type, e.g. reindex.
    #[arg(long = "type", value_name = "T")]
    pub job_type: Option<String>,
    /// At most N jobs, 1-10000 [default: 100].
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
}

/// A job id argument.
#[derive(Debug, Args)]
pub struct JobIdArg {
    /// The job's id (job-...).
    pub id: String,
}

impl JobsListArgs {
    fn filter(&self) -> Result<JobFilter> {
        ce_store::check_list_limit(self.limit)?;
        Ok(JobFilter {
            state: self.state.as_deref().map(parse_state).transpose()?,
            job_type: self.job_type.clone(),
            parent_job_id: None,
            limit: self.limit.unwrap_or(DEFAULT_LIMIT) as usize,
        })
    }
}

impl JobIdArg {
    /// The id, checked to be one path segment of `[A-Za-z0-9_-]` (it goes into a URL).
    fn checked(&self) -> Result<&str> {
        let id = self.id.trim();
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ce_core::CoreError::InvalidField {
                field: "id",
                reason: format!("{id:?} is not a job id (job-...)"),
            }
            .into());
        }
        Ok(id)
    }
}

/// Runs `c` against the data directory (the store only: no index is opened, so it works
/// beside a running server).
pub fn run(cli: &Cli, c: &JobsCommand) -> Result<Rendered> {
    match c {
        JobsCommand::List(a) => {
            let filter = a.filter()?;
            let jobs = commands::open_store(cli)?.jobs().list_jobs(&filter)?;
            Rendered::new(&jobs, list_text(&jobs))
        }
        JobsCommand::Show(a) => {
            let id = a.checked()?;
            let job = commands::open_store(cli)?.jobs().job(id)?;
            Rendered::new(&job, show_text(&job))
        }
        JobsCommand::Cancel(a) => {
            let id = a.checked()?;
            let job = commands::open_store(cli)?.jobs().cancel(id)?;
            Rendered::new(&job, show_text(&job))
        }
        JobsCommand::Retry(a) => {
            let id = a.checked()?;
            let job = commands::open_store(cli)?.jobs().retry(id)?;
            Rendered::new(&job, show_text(&job))
        }
    }
}

/// Runs `c` against the server of `client`.
pub fn remote(client: &Client, c: &JobsCommand) -> Result<Rendered> {
    let one = |json: Value| rendered(json, |j: Job| Ok(show_text(&j)));
    match c {
        JobsCommand::List(a) => {
            let filter = a.filter()?;
            let mut q = vec![("limit", filter.limit.to_string())];
            if let Some(s) = filter.state {
                q.push(("state", s.as_str().to_owned()));
            }
            if let Some(t) = filter.job_type {
                q.push(("type", t));
            }
            let json = client.get("/v1/jobs", &q)?;
            rendered(json, |jobs: Vec<Job>| Ok(list_text(&jobs)))
        }
        JobsCommand::Show(a) => one(client.get(&format!("/v1/jobs/{}", a.checked()?), &[])?),
        JobsCommand::Cancel(a) => one(client.post(
            &format!("/v1/jobs/{}/cancel", a.checked()?),
            &serde_json::json!({}),
        )?),
        JobsCommand::Retry(a) => one(client.post(
            &format!("/v1/jobs/{}/retry", a.checked()?),
            &serde_json::json!({}),
        )?),
    }
}

/// Follows job `id` on the server of `client` until it has run (or failed), with a progress
/// line on stderr at each change.
pub fn follow_remote(client: &Client, id: &str, json: bool, label: &str) -> Result<Job> {
    let path = format!("/v1/jobs/{id}");
    ce_server::jobs::follow(
        || decode::<Job>(&client.get(&path, &[])?),
        || Ok::<bool, CliError>(false),
        REMOTE_POLL,
        &|j| print_progress(j, json, label),
    )
}

/// Prints one progress line of a followed job on stderr: text, or a JSON object with a
/// `progress` key (`--json`).
pub fn print_progress(job: &Job, json: bool, label: &str) {
    let line = if json {
        let detail = match job.state {
            JobState::Completed => Value::Null,
            _ => job.progress.clone().unwrap_or(Value::Null),
        };
        let v = serde_json::json!({
            "progress": label,
            "job_id": job.id,
            "state": job.state,
            "attempts": job.attempts,
            "detail": detail,
        });
        format!("{v}\n")
    } else {
        let detail = match (&job.progress, job.state) {
            (Some(p), JobState::Running) => format!(": {p}"),
            _ => String::new(),
        };
        format!(
            "{label}: job {} {} (attempt {}){detail}\n",
            job.id,
            job.state.as_str(),
            job.attempts
        )
    };
    output::print_stderr(&line);
}

/// The answer of a queued job (`ce reindex --no-wait`).
pub fn queued(q: &JobQueued) -> Result<Rendered> {
    let mut text = kv(&[
        ("job", q.job_id.clone()),
        ("type", q.job.job_type.clone()),
        ("state", q.job.state.as_str().to_owned()),
        (
            "created",
            if q.created {
                "yes".to_owned()
            } else {
                "no: a job with the same key is not finished; this is it".to_owned()
            },
        ),
    ]);
    text.push_str(&format!(
        "a running `ce serve` or `ce worker` runs it, or `ce worker --once`; `ce jobs show {}` \
         follows it\n",
        q.job_id
    ));
    Rendered::new(q, text)
}

/// `ce jobs list`.
pub fn list_text(jobs: &[Job]) -> String {
    if jobs.is_empty() {
        return "no jobs\n".to_owned();
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.id.clone(),
                j.job_type.clone(),
                j.state.as_str().to_owned(),
                j.attempts.to_string(),
                j.idempotency_key.clone().unwrap_or_else(|| "-".into()),
                rfc3339(j.updated_at_ms),
            ]
        })
        .collect();
    table(
        &["ID", "TYPE", "STATE", "ATTEMPTS", "KEY", "UPDATED"],
        &rows,
    )
}

/// `ce jobs show` (and the answer of cancel and retry).
pub fn show_text(j: &Job) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let time = |t: Option<ce_core::Millis>| or_dash(t.map(rfc3339));
    let mut pairs = vec![
        ("id", j.id.clone()),
        ("type", j.job_type.clone()),
        ("state", j.state.as_str().to_owned()),
        ("attempts", j.attempts.to_string()),
        ("key", or_dash(j.idempotency_key.clone())),
        ("payload", j.payload.to_string()),
        ("parent", or_dash(j.parent_job_id.clone())),
        ("run_at", time(j.run_at_ms)),
        ("claimed_by", or_dash(j.claimed_by.clone())),
        ("claimed_until", time(j.claimed_until_ms)),
        ("cancel_requested", j.cancel_requested.to_string()),
        (
            if j.state == JobState::Completed {
                "result"
            } else {
                "progress"
            },
            or_dash(j.progress.as_ref().map(Value::to_string)),
        ),
    ];
    if let Some(code) = &j.error_code {
        pairs.push((
            "last_error",
            format!("{}: {}", code, j.last_error.clone().unwrap_or_default()),
        ));
    }
    pairs.extend([
        ("created", rfc3339(j.created_at_ms)),
        ("started", time(j.started_at_ms)),
        ("finished", time(j.finished_at_ms)),
        ("updated", rfc3339(j.updated_at_ms)),
    ]);
    kv(&pairs)
}

/// What `ce worker --once` did with the jobs.
pub fn run_text(r: &JobsRun) -> String {
    format!(
        "{} run: {} completed, {} failed (to retry), {} dead, {} cancelled, {} lost to another runner",
        r.ran, r.completed, r.failed, r.dead, r.cancelled, r.lost
    )
}

/// The `jobs` line of `ce status`: counts by state, and who runs them.
pub fn status_line(s: &JobsStatus) -> String {
    let counts: Vec<String> = s
        .by_state
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(state, n)| format!("{n} {}", state.as_str()))
        .collect();
    let counts = if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.join(", ")
    };
    let runner = if !s.enabled {
        "jobs.enabled is false: `ce serve` and `ce worker` run none"
    } else if s.runner {
        "a runner runs them in this process"
    } else {
        "no runner in this process (`ce worker --once` runs the due ones; `ce serve` or \
         `ce worker` keeps running them)"
    };
    format!("{counts}; {runner}")
}
