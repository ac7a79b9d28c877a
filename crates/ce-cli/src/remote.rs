//! `--server URL`: every node, relation, search, outbox, status and reindex command goes over
//! HTTP to a running `ce serve` (routes in `docs/http-api.md`) instead of opening the data
//! directory. Arguments are validated here first, exactly as in local mode; the answer's JSON
//! is printed as is with `--json`, or decoded and rendered like a local answer. An error body
//! `{code, message, retryable}` becomes the same exit status as the local error would.

use std::time::Duration;

use ce_core::{
    ContextType, CtxUri, Delivery, DeliveryStatus, ErrorCode, EventPayload, EventType, Meta,
    Millis, OutboxEvent, OwnerSpace, RelationEdge,
};
use ce_server::status::{ReindexReport, Status};
use ce_server::wire::{
    AppendBody, CatAnswer, ErrorBody, LinkBody, MvBody, ReindexBody, RmBody, SearchBody, UnlinkBody,
};
use ce_store::{ConsumerStats, DeliveryRow, NodeStat, Relations, WriteOutcome};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cli::{
    CatArgs, Cli, Command, LinkArgs, LsArgs, MvArgs, OutboxAppendArgs, OutboxCommand,
    OutboxListArgs, RmArgs, TreeArgs, UnlinkArgs,
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
}

impl Client {
    /// A client of the server at `url` (`http://host:port`, a trailing `/` is fine).
    pub fn new(url: &str) -> Result<Self> {
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
        Ok(Client { base, agent })
    }

    /// `GET path?query`.
    pub fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url);
        for (k, v) in query {
            req = req.query(*k, v);
        }
        self.answer(&url, req.call())
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &impl Serialize) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let bytes = serde_json::to_vec(body).map_err(|e| CliError::Other(e.into()))?;
        let res = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(&bytes[..]);
        self.answer(&url, res)
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
                code: code_from_str(&b.code).unwrap_or_else(|| code_for_status(status)),
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

/// Every code this build knows (for decoding error bodies).
const CODES: [ErrorCode; 22] = [
    ErrorCode::InvalidUri,
    ErrorCode::InvalidLevel,
    ErrorCode::InvalidField,
    ErrorCode::UnknownEventType,
    ErrorCode::InvalidPayload,
    ErrorCode::InvalidConfig,
    ErrorCode::PayloadTooLarge,
    ErrorCode::NotFound,
    ErrorCode::AlreadyExists,
    ErrorCode::VersionConflict,
    ErrorCode::NotEmpty,
    ErrorCode::InvalidMove,
    ErrorCode::ClaimConflict,
    ErrorCode::StateTransition,
    ErrorCode::Unavailable,
    ErrorCode::EmbedTimeout,
    ErrorCode::RateLimited,
    ErrorCode::Upstream,
    ErrorCode::SchemaMismatch,
    ErrorCode::Corrupt,
    ErrorCode::Io,
    ErrorCode::Internal,
];

/// The code named `s`, if this build knows it.
pub fn code_from_str(s: &str) -> Option<ErrorCode> {
    CODES.into_iter().find(|c| c.as_str() == s)
}

/// A code with the same exit status as an HTTP status (for codes this build does not know).
fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 | 405 => ErrorCode::InvalidField,
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

fn decode<T: DeserializeOwned>(v: &Value) -> Result<T> {
    T::deserialize(v).map_err(|e| CliError::Transport {
        url: "answer".into(),
        message: format!("unexpected answer shape: {e}"),
    })
}

/// Pairs the server's JSON with the human text of its decoded form.
fn rendered<W: DeserializeOwned>(
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
        Command::Serve(_) => return local_only("serve"),
        Command::Worker(_) => return local_only("worker"),
        _ => {}
    }
    let c = Client::new(url)?;
    match &cli.command {
        Command::Put(a) => {
            let body = commands::put_body(a)?;
            body.clone().into_request()?;
            outcome(c.post("/v1/put", &body)?)
        }
        Command::Cat(CatArgs { uri, level }) => {
            let uri = parse_uri(uri)?;
            let level = ce_core::Level::from_i64(*level)?;
            let json = c.get(
                "/v1/cat",
                &[("uri", uri.to_string()), ("level", level.to_string())],
            )?;
            rendered(json, |a: CatAnswer| Ok(output::cat_text(&a)))
        }
        Command::Stat(a) => {
            let uri = parse_uri(&a.uri)?;
            let json = c.get("/v1/stat", &[("uri", uri.to_string())])?;
            rendered(json, |s: WireStat| Ok(output::stat(&s.into())))
        }
        Command::Ls(LsArgs { uri }) => {
            let uri = parse_uri(uri)?;
            let json = c.get("/v1/ls", &[("uri", uri.to_string())])?;
            rendered(json, |v: Vec<WireStat>| Ok(output::ls(&stats(v))))
        }
        Command::Tree(TreeArgs { uri, depth }) => {
            let root = parse_uri(uri)?;
            let mut q = vec![("uri", root.to_string())];
            if let Some(d) = depth {
                q.push(("depth", d.to_string()));
            }
            let json = c.get("/v1/tree", &q)?;
            rendered(json, |v: Vec<WireStat>| Ok(output::tree(&root, &stats(v))))
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
            outcome(c.post("/v1/rm", &body)?)
        }
        Command::Mv(MvArgs { from, to }) => {
            let body = MvBody {
                from: parse_uri(from)?.to_string(),
                to: parse_uri(to)?.to_string(),
                trace_id: None,
            };
            outcome(c.post("/v1/mv", &body)?)
        }
        Command::Link(a) => {
            let body = link_body(a)?;
            outcome(c.post("/v1/link", &body)?)
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
            outcome(c.post("/v1/unlink", &body)?)
        }
        Command::Relations(a) => {
            let uri = parse_uri(&a.uri)?;
            let json = c.get("/v1/relations", &[("uri", uri.to_string())])?;
            rendered(json, |r: WireRelations| {
                Ok(output::relations(
                    &uri,
                    &Relations {
                        outgoing: r.outgoing,
                        incoming: r.incoming,
                    },
                ))
            })
        }
        Command::Search(a) => {
            let req = commands::search_request(a)?;
            let json = c.post("/v1/search", &SearchBody::from_request(&req))?;
            rendered(json, |r| Ok(output::search(&r)))
        }
        Command::Outbox(o) => outbox(&c, o),
        Command::Status => {
            let json = c.get("/v1/status", &[])?;
            rendered(json, |s: Status| Ok(output::status(&s)))
        }
        Command::Reindex(a) => {
            let body = ReindexBody {
                consumer: Some(a.consumer.clone()),
            };
            let json = c.post("/v1/reindex", &body)?;
            rendered(json, |r: ReindexReport| Ok(output::reindex(&r, None)))
        }
        Command::Import(_)
        | Command::Export(_)
        | Command::Demo(_)
        | Command::Bench(_)
        | Command::Serve(_)
        | Command::Worker(_) => Err(CliError::Usage("not a server command".into())),
    }
}

fn outcome(json: Value) -> Result<Rendered> {
    rendered(json, |o: WireOutcome| Ok(output::outcome(&o.into())))
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
            rendered(json, |rows: Vec<WireRow>| {
                let rows = rows
                    .into_iter()
                    .map(WireRow::into_row)
                    .collect::<Result<Vec<_>>>()?;
                Ok(output::outbox_list(&rows))
            })
        }
        OutboxCommand::Show(a) => {
            let json = c.get("/v1/outbox/show", &[("id", a.id.trim().to_owned())])?;
            rendered(json, |s: WireShow| {
                let event = s.event.into_event()?;
                let deliveries: Vec<Delivery> =
                    s.deliveries.into_iter().map(Delivery::from).collect();
                Ok(output::outbox_show(&event, &deliveries))
            })
        }
        OutboxCommand::Stats => {
            let json = c.get("/v1/outbox/stats", &[])?;
            rendered(json, |v: Vec<WireConsumerStats>| {
                let v: Vec<ConsumerStats> = v.into_iter().map(ConsumerStats::from).collect();
                Ok(output::outbox_stats(&v))
            })
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
            rendered(answer, |e: WireEvent| {
                Ok(output::event_kv(&e.into_event()?))
            })
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
        q.push(("limit", l.to_string()));
    }
    Ok(q)
}

// --- answers as the server sends them (the store's types serialize only) -------------------

#[derive(Deserialize)]
struct WireOutcome {
    uri: CtxUri,
    version: u64,
    changed: bool,
    event_ids: Vec<String>,
    nodes_affected: u64,
    trace_id: String,
}

impl From<WireOutcome> for WriteOutcome {
    fn from(w: WireOutcome) -> Self {
        WriteOutcome {
            uri: w.uri,
            version: w.version,
            changed: w.changed,
            event_ids: w.event_ids,
            nodes_affected: w.nodes_affected,
            trace_id: w.trace_id,
        }
    }
}

#[derive(Deserialize)]
struct WireStat {
    uri: CtxUri,
    parent_uri: CtxUri,
    context_type: ContextType,
    category: String,
    owner_space: OwnerSpace,
    version: u64,
    content_hash: String,
    relation_version: u64,
    layer_bytes: [u64; 3],
    children: u64,
    meta: Meta,
    created_at_ms: Millis,
    updated_at_ms: Millis,
}

impl From<WireStat> for NodeStat {
    fn from(w: WireStat) -> Self {
        NodeStat {
            uri: w.uri,
            parent_uri: w.parent_uri,
            context_type: w.context_type,
            category: w.category,
            owner_space: w.owner_space,
            version: w.version,
            content_hash: w.content_hash,
            relation_version: w.relation_version,
            layer_bytes: w.layer_bytes,
            children: w.children,
            meta: w.meta,
            created_at_ms: w.created_at_ms,
            updated_at_ms: w.updated_at_ms,
        }
    }
}

fn stats(v: Vec<WireStat>) -> Vec<NodeStat> {
    v.into_iter().map(NodeStat::from).collect()
}

#[derive(Deserialize)]
struct WireRelations {
    outgoing: Vec<RelationEdge>,
    incoming: Vec<RelationEdge>,
}

#[derive(Deserialize)]
struct WireConsumerStats {
    consumer: String,
    pending: u64,
    claimed: u64,
    retry_wait: u64,
    done: u64,
    dead: u64,
    low_watermark_seq: Option<i64>,
    oldest_pending_created_at_ms: Option<Millis>,
}

impl From<WireConsumerStats> for ConsumerStats {
    fn from(w: WireConsumerStats) -> Self {
        ConsumerStats {
            consumer: w.consumer,
            pending: w.pending,
            claimed: w.claimed,
            retry_wait: w.retry_wait,
            done: w.done,
            dead: w.dead,
            low_watermark_seq: w.low_watermark_seq,
            oldest_pending_created_at_ms: w.oldest_pending_created_at_ms,
        }
    }
}

#[derive(Deserialize)]
struct WireEvent {
    seq: i64,
    event_id: String,
    event_type: EventType,
    uri: CtxUri,
    payload: Value,
    created_at_ms: Millis,
}

impl WireEvent {
    fn into_event(self) -> Result<OutboxEvent> {
        Ok(OutboxEvent {
            payload: EventPayload::parse(self.event_type.as_str(), &self.payload)?,
            seq: self.seq,
            event_id: self.event_id,
            event_type: self.event_type,
            uri: self.uri,
            created_at_ms: self.created_at_ms,
        })
    }
}

#[derive(Deserialize)]
struct WireDelivery {
    consumer: String,
    seq: i64,
    status: DeliveryStatus,
    retry_count: u32,
    next_visible_at_ms: Option<Millis>,
    claimed_by: Option<String>,
    claim_token: Option<String>,
    claimed_until_ms: Option<Millis>,
    last_error: Option<String>,
    error_code: Option<String>,
    updated_at_ms: Millis,
}

impl From<WireDelivery> for Delivery {
    fn from(w: WireDelivery) -> Self {
        Delivery {
            consumer: w.consumer,
            seq: w.seq,
            status: w.status,
            retry_count: w.retry_count,
            next_visible_at_ms: w.next_visible_at_ms,
            claimed_by: w.claimed_by,
            claim_token: w.claim_token,
            claimed_until_ms: w.claimed_until_ms,
            last_error: w.last_error,
            error_code: w.error_code,
            updated_at_ms: w.updated_at_ms,
        }
    }
}

#[derive(Deserialize)]
struct WireRow {
    event: WireEvent,
    delivery: WireDelivery,
}

impl WireRow {
    fn into_row(self) -> Result<DeliveryRow> {
        Ok(DeliveryRow {
            event: self.event.into_event()?,
            delivery: self.delivery.into(),
        })
    }
}

#[derive(Deserialize)]
struct WireShow {
    event: WireEvent,
    deliveries: Vec<WireDelivery>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_decodes_and_unknown_ones_follow_the_status() {
        for c in CODES {
            assert_eq!(code_from_str(c.as_str()), Some(c));
        }
        assert_eq!(code_from_str("teapot"), None);
        for status in [400u16, 404, 409, 413, 429, 500, 502, 503, 504] {
            assert_eq!(code_for_status(status).http_status(), status);
        }
    }

    #[test]
    fn server_urls_are_checked() {
        assert!(Client::new("http://127.0.0.1:7420/").is_ok());
        assert!(matches!(
            Client::new("127.0.0.1:7420"),
            Err(CliError::Usage(_))
        ));
    }
}
