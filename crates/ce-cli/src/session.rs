//! `ce session new|add|show|ls|commit` (docs/sessions.md), on the data directory or with
//! `--server URL` (`/v1/sessions/*`). `commit` runs Phase 1 and prints the job id of Phase 2;
//! with `--wait` (local only) it then runs the job here and prints its report.

use ce_core::rfc3339;
use ce_server::sessions::phase2::Phase2Report;
use ce_server::sessions::{
    AddMessage, Appended, CommitOutcome, SessionEntry, SessionView, Sessions,
};
use ce_session::Role;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::cli::Cli;
use crate::commands::{self, parse_uri};
use crate::error::{CliError, Result};
use crate::output::{Rendered, kv, table};
use crate::remote::{Client, rendered};

/// `ce session ...`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session (ctx://A/users/U/sessions/S or ctx://A/agents/G/sessions/S).
    New(SessionNewArgs),
    /// Append a message (a retried append with the same --id does not duplicate).
    Add(SessionAddArgs),
    /// Show a session: its live messages and its archives.
    Show(SessionUriArgs),
    /// List sessions of an owner (ctx://A/users/U), an account, or every account.
    Ls(SessionLsArgs),
    /// Commit: archive the messages (Phase 1) and enqueue summary and memory extraction
    /// (Phase 2, a `session-commit` job).
    Commit(SessionCommitArgs),
}

/// `ce session new`.
#[derive(Debug, Args)]
pub struct SessionNewArgs {
    /// The session URI.
    pub uri: String,
    /// A title.
    #[arg(long)]
    pub title: Option<String>,
}

/// `ce session add`.
#[derive(Debug, Args)]
pub struct SessionAddArgs {
    /// The session URI.
    pub uri: String,
    /// user, assistant, system or tool.
    #[arg(long)]
    pub role: String,
    /// The message text.
    #[arg(long)]
    pub content: String,
    /// The client's message id (letters, digits, '.', '_', '-').
    #[arg(long)]
    pub id: Option<String>,
    /// When it was said, in milliseconds since the epoch [default: now].
    #[arg(long, value_name = "MS")]
    pub time_ms: Option<i64>,
    /// Tool calls or other parts, as a JSON value.
    #[arg(long, value_name = "JSON")]
    pub parts: Option<String>,
}

/// A session URI.
#[derive(Debug, Args)]
pub struct SessionUriArgs {
    /// The session URI.
    pub uri: String,
}

/// `ce session ls`.
#[derive(Debug, Args)]
pub struct SessionLsArgs {
    /// An owner, its sessions folder, or an account [default: every account].
    pub uri: Option<String>,
}

/// `ce session commit`.
#[derive(Debug, Args)]
pub struct SessionCommitArgs {
    /// The session URI.
    pub uri: String,
    /// Run Phase 2 here and print its report (not with --server: the server runs it).
    #[arg(long)]
    pub wait: bool,
}

impl SessionAddArgs {
    fn request(&self) -> Result<AddMessage> {
        let parts = self
            .parts
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| ce_core::CoreError::InvalidField {
                field: "parts",
                reason: format!("not JSON: {e}"),
            })?;
        Ok(AddMessage {
            uri: parse_uri(&self.uri)?,
            role: self.role.parse::<Role>()?,
            content: self.content.clone(),
            id: self.id.clone(),
            time_ms: self.time_ms,
            parts,
        })
    }
}

fn view_text(v: &SessionView) -> String {
    let mut out = kv(&[
        ("session", v.uri.to_string()),
        ("title", v.title.clone()),
        ("messages", v.messages.len().to_string()),
        ("archives", v.archives.len().to_string()),
        ("created", rfc3339(v.created_at_ms)),
    ]);
    if !v.messages.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = v
            .messages
            .iter()
            .map(|m| {
                vec![
                    m.seq.to_string(),
                    m.id.clone(),
                    m.role.to_string(),
                    m.content.replace('\n', " "),
                ]
            })
            .collect();
        out.push_str(&table(&["SEQ", "ID", "ROLE", "CONTENT"], &rows));
    }
    if !v.archives.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = v
            .archives
            .iter()
            .map(|a| {
                vec![
                    a.number.to_string(),
                    a.state.map_or("?", |s| s.as_str()).to_owned(),
                    a.extraction.as_str().to_owned(),
                    a.messages.to_string(),
                    a.summary.replace('\n', " "),
                ]
            })
            .collect();
        out.push_str(&table(
            &["ARCHIVE", "STATE", "EXTRACTION", "MESSAGES", "SUMMARY"],
            &rows,
        ));
    }
    out
}

fn appended_text(a: &Appended) -> String {
    let created = match (&a.archive, a.created) {
        (_, true) => "yes".to_owned(),
        (Some(archive), false) => format!("no (appended before, archived in {archive})"),
        (None, false) => "no (appended before)".to_owned(),
    };
    kv(&[
        ("message", a.uri.to_string()),
        ("seq", a.seq.to_string()),
        ("created", created),
    ])
}

fn ls_text(entries: &[SessionEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.uri.to_string(),
                e.appended.to_string(),
                e.archives.to_string(),
                rfc3339(e.updated_at_ms),
                e.title.clone(),
            ]
        })
        .collect();
    table(
        &["SESSION", "APPENDED", "ARCHIVES", "UPDATED", "TITLE"],
        &rows,
    )
}

fn commit_text(c: &CommitOutcome) -> String {
    let mut pairs = vec![
        ("session", c.session.to_string()),
        (
            "status",
            serde_json::to_value(c.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ),
        ("archived", c.archived.to_string()),
        ("kept", c.kept.to_string()),
        ("extraction", c.extraction.clone()),
    ];
    if let Some(a) = &c.archive {
        pairs.push(("archive", a.to_string()));
    }
    if let Some(j) = &c.job_id {
        pairs.push(("job", j.clone()));
    }
    kv(&pairs)
}

fn report_text(r: &Phase2Report) -> String {
    let mut pairs = vec![
        ("archive", r.archive.to_string()),
        (
            "outcome",
            serde_json::to_value(r.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ),
        ("extraction", r.extraction.as_str().to_owned()),
        (
            "memories",
            format!(
                "{} added, {} updated, {} superseded, {} unchanged",
                r.counts.added, r.counts.updated, r.counts.superseded, r.counts.unchanged
            ),
        ),
        ("summary", r.summary.clone()),
    ];
    if let Some(n) = &r.note {
        pairs.push(("note", n.clone()));
    }
    if let Some(d) = &r.diff {
        pairs.push(("diff", d.to_string()));
    }
    kv(&pairs)
}

/// Runs `c` against the data directory.
pub fn run(cli: &Cli, c: &SessionCommand) -> Result<Rendered> {
    if let SessionCommand::Commit(a) = c
        && a.wait
    {
        return commit_and_wait(cli, a);
    }
    let (_, config) = commands::resolve(cli)?;
    let (store, locks) = commands::open_locked(cli)?;
    let s = Sessions {
        store: store.as_ref(),
        locks: &locks,
        config: &config,
        wake: None,
        // Phase 2 (the merge) runs in an engine: `commit --wait`, a worker, `ce serve`.
        embedder: Err("the local session commands open no embedder"),
    };
    match c {
        SessionCommand::New(a) => {
            let v = s.create(&parse_uri(&a.uri)?, a.title.clone())?;
            Rendered::new(&v, view_text(&v))
        }
        SessionCommand::Add(a) => {
            let out = s.add(a.request()?)?;
            Rendered::new(&out, appended_text(&out))
        }
        SessionCommand::Show(a) => {
            let v = s.show(&parse_uri(&a.uri)?)?;
            Rendered::new(&v, view_text(&v))
        }
        SessionCommand::Ls(a) => {
            let within = a.uri.as_deref().map(parse_uri).transpose()?;
            let out = s.ls(within.as_ref())?;
            Rendered::new(&out, ls_text(&out))
        }
        SessionCommand::Commit(a) => {
            let out = s.commit(&parse_uri(&a.uri)?)?;
            Rendered::new(&out, commit_text(&out))
        }
    }
}

/// `ce session commit --wait`: Phase 1, then the job run here to its end.
fn commit_and_wait(cli: &Cli, a: &SessionCommitArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let engine = commands::open_engine(cli, 1, false, "session")?;
    let out = engine.sessions().commit(&uri)?;
    let Some(job_id) = out.job_id.clone() else {
        return Rendered::new(&json!({"commit": out, "phase2": null}), commit_text(&out));
    };
    let json_mode = cli.json;
    let job = engine.follow_job(&job_id, true, &|j| {
        if !json_mode {
            eprintln!("session-commit {}: {}", j.id, j.state.as_str());
        }
    })?;
    engine.shutdown();
    if let Some(e) = ce_server::jobs::job_error(&job) {
        return Err(e.into());
    }
    let report: Phase2Report = serde_json::from_value(job.progress.clone().unwrap_or_default())
        .map_err(|e| CliError::Other(e.into()))?;
    let human = format!("{}\n{}", commit_text(&out), report_text(&report));
    Rendered::new(&json!({"commit": out, "phase2": report}), human)
}

/// Runs `c` against the server of `client`.
pub fn remote(client: &Client, c: &SessionCommand) -> Result<Rendered> {
    match c {
        SessionCommand::New(a) => {
            let json = client.post("/v1/sessions/new", &json!({"uri": a.uri, "title": a.title}))?;
            rendered(json, |v: SessionView| Ok(view_text(&v)))
        }
        SessionCommand::Add(a) => {
            let r = a.request()?;
            let json = client.post(
                "/v1/sessions/add",
                &json!({"uri": r.uri, "role": r.role, "content": r.content, "id": r.id,
                        "time_ms": r.time_ms, "parts": r.parts}),
            )?;
            rendered(json, |v: Appended| Ok(appended_text(&v)))
        }
        SessionCommand::Show(a) => {
            let json = client.get("/v1/sessions/show", &[("uri", a.uri.clone())])?;
            rendered(json, |v: SessionView| Ok(view_text(&v)))
        }
        SessionCommand::Ls(a) => {
            let q: Vec<(&str, String)> = a.uri.iter().map(|u| ("uri", u.clone())).collect();
            let json = client.get("/v1/sessions/ls", &q)?;
            rendered(json, |v: Vec<SessionEntry>| Ok(ls_text(&v)))
        }
        SessionCommand::Commit(a) if a.wait => Err(CliError::Usage(
            "--wait runs Phase 2 in this process, on the data directory; with --server the \
             server's job runner runs it (follow it with `ce jobs show ID`)"
                .into(),
        )),
        SessionCommand::Commit(a) => {
            let json = client.post("/v1/sessions/commit", &json!({"uri": a.uri}))?;
            rendered(json, |v: CommitOutcome| Ok(commit_text(&v)))
        }
    }
}
