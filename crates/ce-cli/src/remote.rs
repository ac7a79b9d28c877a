//! `--server URL`: every node, relation, search, outbox, status, reindex, jobs and repair command goes over
//! HTTP to a running `ce serve` (routes in `docs/http-api.md`) instead of opening the data
//! directory. Arguments are validated here first, exactly as in local mode; the answer's JSON
//! is printed as is with `--json`, or decoded and rendered like a local answer. An error body
//! `{code, message, retryable}` becomes the same exit status as the local error would.
//! `--api-key` (or `CE_API_KEY`) goes with every request as `Authorization: Bearer KEY`; a
//! server that refuses it answers `401 unauthenticated` or `403 forbidden` (exit 7).

use std::time::Duration;

use ce_core::{DeliveryStatus, ErrorCode, EventType, OutboxEvent};
use ce_server::jobs::reindex::{ReindexPayload, report_of};
use ce_server::status::Status;
use ce_server::wire::{
    AppendBody, CatAnswer, ErrorBody, JobQueued, LinkBody, MvBody, OutboxShowAnswer, ReindexAnswer,
    ReindexBody, RmBody, SearchBody, UnlinkBody,
};
use ce_store::{ConsumerStats, DeliveryRow, NodeStat, Relations, WriteOutcome};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cli::{
    CatArgs, Cli, Command, LinkArgs, LsArgs, MvArgs, OutboxAppendArgs, OutboxCommand,
    OutboxListArgs, ReindexArgs, RmArgs, TreeArgs, UnlinkArgs,
};
use crate::commands::{self, parse_uri};
use crate::error::{CliError, Result};
use crate::output::{self, Rendered};

/// How long one request may take (a reindex of a large store takes a while to queue).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest answer read (a `tree` of a big store is large).
const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// A client of one server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    /// `Bearer KEY`, when a key is given.
    authorization: Option<String>,
}

/// A request to `url` that got no answer.
fn transport(url: String, e: &ureq::Error) -> CliError {
    CliError::Transport {
        url,
        message: e.to_string(),
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`, a trailing `/` is fine) that
    /// sends `api_key`, if any, with every request.
    pub fn new(url: &str, api_key: Option<&str>) -> Result<Self> {
        let base = url.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) || base.len() < 8 {
            return Err(CliError::Usage(format!(
                "--server {url:?} is not an http:// or https:// URL"
            )));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .user_agent(concat!("ce/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let authorization = match api_key.map(str::trim) {
            None => None,
            Some(k) if k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                return Err(CliError::Usage(
                    "--api-key (or CE_API_KEY) must be a non-empty key without whitespace".into(),
                ));
            }
            Some(k) => Some(format!("Bearer {k}")),
        };
        Ok(Client {
            base,
            agent,
            authorization,
        })
    }

    /// `req` with the key's `Authorization` header, if there is a key.
    fn authorized<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.authorization {
            Some(a) => req.header("Authorization", a),
            None => req,
        }
    }

    /// `GET path?query`.
    pub fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.authorized(self.agent.get(&url));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        self.answer(&url, req.call())
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &impl Serialize) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let bytes = serde_json::to_vec(body).map_err(|e| CliError::Other(e.into()))?;
        let req = self
            .authorized(self.agent.post(&url))
            .header("Content-Type", "application/json");
        let res = req.send(&bytes[..]);
        self.answer(&url, res)
    }

    /// `POST path` with `body` and `headers`, answered as is (any status): the MCP bridge.
    pub fn post_raw(
        &self,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let url = format!("{}{path}", self.base);
        let mut req = self.authorized(self.agent.post(&url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send(body).map_err(|e| transport(url, &e))
    }

    /// `DELETE path` with `headers`; the status, or why not (the MCP bridge ends its session).
    pub fn delete_raw(&self, path: &str, headers: &[(&str, &str)]) -> Result<u16> {
        let url = format!("{}{path}", self.base);
        let mut req = self.authorized(self.agent.delete(&url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.call()
            .map(|r| r.status().as_u16())
            .map_err(|e| transport(url, &e))
    }

    fn answer(
        &self,
        url: &str,
        res: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value> {
        let transport = |message: String| CliError::Transport {
            url: url.to_owned(),
            message,
        };
        let mut res = res.map_err(|e| transport(e.to_string()))?;
        let status = res.status().as_u16();
        let text = res
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .map_err(|e| transport(format!("reading the answer: {e}")))?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text)
                .map_err(|e| transport(format!("the answer is not JSON ({e})")));
        }
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => CliError::Remote {
                code: b.code.parse().unwrap_or_else(|_| code_for_status(status)),
                code_text: b.code,
                message: b.message,
                retryable: b.retryable,
            },
            Err(_) => {
                let code = code_for_status(status);
                CliError::Remote {
                    code,
                    code_text: code.as_str().to_owned(),
                    message: format!("HTTP {status}: {}", text.trim()),
                    retryable: matches!(status, 429 | 502..=504),
                }
            }
        })
    }
}

/// A code with the same exit status as an HTTP status (for codes this build does not know).
fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 | 405 => ErrorCode::InvalidField,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::AlreadyExists,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::RateLimited,
        502 => ErrorCode::Upstream,
        503 => ErrorCode::Unavailable,
        504 => ErrorCode::EmbedTimeout,
        _ => ErrorCode::Internal,
    }
}

pub(crate) fn decode<T: DeserializeOwned>(v: &Value) -> Result<T> {
    T::deserialize(v).map_err(|e| CliError::Transport {
        url: "answer".into(),
        message: format!("unexpected answer shape: {e}"),
    })
}

/// Pairs the server's JSON with the human text of its decoded form.
pub(crate) fn rendered<W: DeserializeOwned>(
    json: Value,
    human: impl FnOnce(W) -> Result<String>,
) -> Result<Rendered> {
    let decoded: W = decode(&json)?;
    Ok(Rendered {
        human: human(decoded)?,
        json,
    })
}

/// Runs `cli`'s command against the server at `url`.
pub fn run(cli: &Cli, url: &str) -> Result<Rendered> {
    let local_only = |name: &str| {
        Err(CliError::Usage(format!(
            "`ce {name}` works on the data directory and cannot be sent to --server; run it without --server"
        )))
    };
    // Arguments are validated before the first request, as in local mode.
    match &cli.command {
        Command::Import(_) => return local_only("import"),
        Command::Export(_) => return local_only("export"),
        Command::Demo(_) => return local_only("demo"),
        Command::Bench(_) => return local_only("bench"),
        Command::Eval(_) => return local_only("eval"),
        Command::Serve(_) => return local_only("serve"),
        Command::Worker(_) => return local_only("worker"),
        Command::Migrate => return local_only("migrate"),
        _ => {}
    }
    let c = Client::new(url, cli.api_key.as_deref())?;
    if let Command::Mcp(_) = &cli.command {
        crate::mcp::bridge(&c)?;
        return Ok(Rendered::nothing());
    }
    match &cli.command {
        Command::Put(a) => {
            let body = commands::put_body(a)?;
            body.clone().into_request()?;
            outcome(c.post("/v1/put", &body)?, cli.verbose)
        }
        Command::Cat(CatArgs { uri, level }) => {
            let uri = parse_uri(uri)?;
            let level = ce_core::Level::from_i64(*level)?;
            let json = c.get(
                "/v1/cat",
                &[("uri", uri.to_string()), ("level", level.to_string())],
            )?;
            rendered(json, |a: CatAnswer| {
                output::print_cat_note(&a, cli.json);
                Ok(output::cat_text(&a))
            })
        }
        Command::Stat(a) => {
            let uri = parse_uri(&a.uri)?;
            let json = c.get("/v1/stat", &[("uri", uri.to_string())])?;
            rendered(json, |s: NodeStat| Ok(output::stat(&s)))
        }
        Command::Ls(LsArgs { uri }) => {
            let uri = parse_uri(uri)?;
            let json = c.get("/v1/ls", &[("uri", uri.to_string())])?;
            rendered(json, |v: Vec<NodeStat>| Ok(output::ls(&uri, &v)))
        }
        Command::Tree(TreeArgs { uri, depth }) => {
            let root = parse_uri(uri)?;
            let mut q = vec![("uri", root.to_string())];
            if let Some(d) = depth {
                q.push(("depth", d.to_string()));
            }
            let json = c.get("/v1/tree", &q)?;
            rendered(json, |v: Vec<NodeStat>| Ok(output::tree(&root, &v)))
        }
        Command::Rm(RmArgs {
            uri,
            recursive,
            expect_version,
        }) => {
            let body = RmBody {
                uri: parse_uri(uri)?.to_string(),
                recursive: *recursive,
                expect_version: *expect_version,
                trace_id: None,
            };
            outcome(c.post("/v1/rm", &body)?, cli.verbose)
        }
        Command::Mv(MvArgs { from, to }) => {
            let body = MvBody {
                from: parse_uri(from)?.to_string(),
                to: parse_uri(to)?.to_string(),
                trace_id: None,
            };
            outcome(c.post("/v1/mv", &body)?, cli.verbose)
        }
        Command::Link(a) => {
            let body = link_body(a)?;
            outcome(c.post("/v1/link", &body)?, cli.verbose)
        }
        Command::Unlink(UnlinkArgs {
            from,
            to,
            relation_type,
        }) => {
            let body = UnlinkBody {
                from: parse_uri(from)?.to_string(),
                to: parse_uri(to)?.to_string(),
                relation_type: relation_type.clone(),
                trace_id: None,
            };
            outcome(c.post("/v1/unlink", &body)?, cli.verbose)
        }
        Command::Relations(a) => {
            let uri = parse_uri(&a.uri)?;
            let json = c.get("/v1/relations", &[("uri", uri.to_string())])?;
            rendered(json, |r: Relations| Ok(output::relations(&uri, &r)))
        }
        Command::Related(a) => {
            let req = commands::related_request(a)?;
            let mut q = vec![
                ("uri", req.uri.to_string()),
                ("direction", req.direction.to_string()),
                ("limit", req.limit.to_string()),
            ];
            if let Some(t) = &req.relation_type {
                q.push(("type", t.clone()));
            }
            let json = c.get("/v1/related", &q)?;
            rendered(json, |r| Ok(output::related(&r, output::REMOTE_CATCH_UP)))
        }
        Command::Search(a) if commands::is_hierarchical(a) => {
            let req = commands::hierarchical_request(a)?;
            let json = c.post("/v1/search", &SearchBody::from_hierarchical(&req))?;
            rendered(json, |r| {
                Ok(output::hierarchical(&r, output::REMOTE_CATCH_UP))
            })
        }
        Command::Search(a) => {
            let req = commands::search_request(a)?;
            let json = c.post("/v1/search", &SearchBody::from_request(&req))?;
            rendered(json, |r| Ok(output::search(&r, output::REMOTE_CATCH_UP)))
        }
        Command::Outbox(o) => outbox(&c, o),
        Command::Status => {
            let json = c.get("/v1/status", &[])?;
            rendered(json, |s: Status| Ok(output::status(&s)))
        }
        Command::Reindex(a) if a.take_over => Err(CliError::Usage(
            "--take-over runs without --server, on the data directory that takes the consumer \
             over (a running server already owns what it consumes)"
                .into(),
        )),
        Command::Reindex(a) => reindex(&c, a, cli.json),
        Command::Jobs(j) => crate::jobs::remote(&c, j),
        Command::Kb(k) => crate::kb::remote(&c, k, cli.json),
        Command::Repair(r) => crate::repair::remote(&c, r),
        Command::Session(s) => crate::session::remote(&c, s),
        Command::Import(_)
        | Command::Export(_)
        | Command::Demo(_)
        | Command::Bench(_)
        | Command::Eval(_)
        | Command::Serve(_)
        | Command::Worker(_)
        | Command::Mcp(_)
        | Command::Migrate => Err(CliError::Usage("not a server command".into())),
    }
}

/// `ce reindex --server`: enqueues the job; unless `--no-wait`, follows it (progress on
/// stderr) and answers its report (the server's workers then rebuild the index).
fn reindex(c: &Client, a: &ReindexArgs, json: bool) -> Result<Rendered> {
    ReindexPayload::new(&a.consumer, false)?;
    let body = ReindexBody {
        consumer: Some(a.consumer.clone()),
        no_wait: true,
    };
    let queued: JobQueued = decode(&c.post("/v1/reindex", &body)?)?;
    if a.no_wait {
        return crate::jobs::queued(&queued);
    }
    let job = crate::jobs::follow_remote(c, &queued.job_id, json, "reindex")?;
    if let Some(e) = ce_server::jobs::job_error(&job) {
        return Err(e.into());
    }
    let answer = ReindexAnswer {
        report: report_of(&job)?,
        job_id: job.id,
    };
    let text = output::reindex(&answer.report, None, &answer.job_id);
    Rendered::new(&answer, text)
}

fn outcome(json: Value, verbose: bool) -> Result<Rendered> {
    rendered(json, |o: WriteOutcome| Ok(output::outcome(&o, verbose)))
}

fn link_body(a: &LinkArgs) -> Result<LinkBody> {
    Ok(LinkBody {
        from: parse_uri(&a.from)?.to_string(),
        to: parse_uri(&a.to)?.to_string(),
        relation_type: a.relation_type.clone(),
        weight: Some(a.weight),
        reason: Some(a.reason.clone()),
        trace_id: None,
    })
}

fn outbox(c: &Client, o: &OutboxCommand) -> Result<Rendered> {
    match o {
        OutboxCommand::List(a) => {
            let q = list_query(a)?;
            let json = c.get("/v1/outbox/list", &q)?;
            rendered(json, |rows: Vec<DeliveryRow>| {
                Ok(output::outbox_list(&rows))
            })
        }
        OutboxCommand::Show(a) => {
            let json = c.get("/v1/outbox/show", &[("id", a.id.trim().to_owned())])?;
            rendered(json, |s: OutboxShowAnswer| {
                Ok(output::outbox_show(&s.event, &s.deliveries))
            })
        }
        OutboxCommand::Stats => {
            let json = c.get("/v1/outbox/stats", &[])?;
            rendered(json, |v: Vec<ConsumerStats>| Ok(output::outbox_stats(&v)))
        }
        OutboxCommand::Append(OutboxAppendArgs {
            event_type,
            payload,
        }) => {
            let (t, json) = commands::append_payload(event_type, payload)?;
            let body = AppendBody {
                event_type: t.as_str().to_owned(),
                payload: json,
            };
            let answer = c.post("/v1/outbox/append", &body)?;
            rendered(answer, |e: OutboxEvent| Ok(output::event_kv(&e)))
        }
    }
}

/// The query of `outbox list`, validated like the local command.
fn list_query(a: &OutboxListArgs) -> Result<Vec<(&'static str, String)>> {
    let mut q = Vec::new();
    if let Some(s) = &a.status {
        q.push(("status", s.parse::<DeliveryStatus>()?.as_str().to_owned()));
    }
    if let Some(c) = &a.consumer {
        q.push(("consumer", c.clone()));
    }
    if let Some(t) = &a.event_type {
        q.push(("type", t.parse::<EventType>()?.as_str().to_owned()));
    }
    if let Some(s) = a.after {
        q.push(("after", s.to_string()));
    }
    if let Some(c) = &a.after_consumer {
        q.push(("after_consumer", c.clone()));
    }
    if let Some(l) = a.limit {
        ce_store::check_list_limit(Some(l))?;
        q.push(("limit", l.to_string()));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_codes_follow_the_status() {
        for status in [400u16, 401, 403, 404, 409, 413, 429, 500, 502, 503, 504] {
            assert_eq!(code_for_status(status).http_status(), status);
        }
    }

    #[test]
    fn server_urls_are_checked() {
        assert!(Client::new("http://127.0.0.1:7420/", None).is_ok());
        assert!(matches!(
            Client::new("127.0.0.1:7420", None),
            Err(CliError::Usage(_))
        ));
        let c = Client::new("http://127.0.0.1:7420", Some(" key-0123456789abcdef ")).expect("key");
        assert_eq!(
            c.authorization.as_deref(),
            Some("Bearer key-0123456789abcdef")
        );
        for bad in ["", "  ", "two words"] {
            assert!(matches!(
                Client::new("http://127.0.0.1:7420", Some(bad)),
                Err(CliError::Usage(_))
            ));
        }
    }
}
