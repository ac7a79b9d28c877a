//! The HTTP API (axum, JSON, one port): every CLI operation under `/v1/{command}`, plus
//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json`. The routes and bodies are
//! documented in `docs/http-api.md`, and each row of [`ROUTES`] carries its operation of
//! the OpenAPI document ([`openapi`]).
//!
//! Every route is one row of [`ROUTES`] with its [`Access`]: the route's [`auth::gate`]
//! authenticates the caller's API key (when `[[server.api_keys]]` are configured) and hands
//! the handler its [`Principal`]; tenant handlers check their inputs and filter their
//! answers through a [`scope::Scope`]. To add a route: add a row here with its [`Doc`] (a
//! route without a row is not served), take `Extension<Principal>` in the handler and run it with
//! `handlers::scoped`, check every URI it addresses (`Scope::check_read` / `check_write`,
//! or `Principal::scope_filter` for a search filter) and pass every node it answers through
//! `Scope::retain`; then add the route to the tenant-isolation test table
//! (`crates/ce-server/tests/integration/tenants.rs`), which fails until it does.
//!
//! The MCP endpoint `/mcp` (Streamable HTTP, [`crate::mcp`]) is not a row of [`ROUTES`]:
//! it is one tower service behind the same gate as a tenant route, and its tools are
//! walked by their own isolation test (`crates/ce-server/tests/integration/mcp.rs`).
//!
//! [`serve`] runs until SIGINT or SIGTERM, then stops accepting, lets in-flight requests
//! finish, and stops the workers (each finishes its batch, so no claim is left behind).

pub mod auth;
pub mod console;
mod error;
pub(crate) mod handlers;
mod jobs;
pub(crate) mod kb;
pub mod openapi;
mod params;
mod repair;
pub mod scope;
pub mod sessions;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use axum::serve::ListenerExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::auth::{Access, KeyRing, Principal};
pub use self::error::ApiError;
pub use self::openapi::Doc;
use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::metrics::Metrics;

/// The default listen address.
pub const DEFAULT_BIND: &str = "127.0.0.1:7420";
/// Extra room a request body gets beyond three full layers (JSON framing and escapes).
const BODY_OVERHEAD: usize = 1 << 20;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The metrics recorder, if installed in this process.
    pub metrics: Option<Metrics>,
    /// The API keys (empty: single-user mode).
    pub keys: Arc<KeyRing>,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Listen address, e.g. `127.0.0.1:7420` (port 0 picks a free port).
    pub bind: String,
    /// Largest accepted request body; larger ones get 413 `payload_too_large`.
    pub max_body_bytes: usize,
    /// The API keys of `[[server.api_keys]]`, read (`key_env`) and checked.
    pub keys: Arc<KeyRing>,
}

impl ServeOptions {
    /// Defaults for `config`: [`DEFAULT_BIND`], a body limit that fits a put of three layers
    /// at `store.max_layer_bytes` each, and the API keys read from the environment now, so
    /// that an unset `key_env` variable fails before an engine or a worker starts.
    pub fn for_config(config: &ce_core::Config) -> Result<Self> {
        let keys = KeyRing::from_config(&config.server, |var| std::env::var(var).ok())?;
        Ok(ServeOptions {
            bind: DEFAULT_BIND.into(),
            max_body_bytes: config.store.max_layer_bytes.saturating_mul(3) + BODY_OVERHEAD,
            keys: Arc::new(keys),
        })
    }
}

/// One route: its method and path, who may call it, its handler and its documentation.
pub struct Route {
    /// The method.
    pub method: Method,
    /// The path.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Its operation in the OpenAPI document (`GET /openapi.json`).
    pub doc: Doc,
    handler: fn() -> MethodRouter<AppState>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({:?})", self.method, self.path, self.access)
    }
}

/// Rows of [`ROUTES`]: `METHOD "path" Access => handler { doc }` (a row without its
/// [`Doc`] does not parse).
macro_rules! routes {
    ($($method:ident $path:literal $access:ident => $handler:path { $doc:expr }),* $(,)?) => {
        &[$(Route {
            method: Method::$method,
            path: $path,
            access: Access::$access,
            doc: $doc,
            handler: || routes!(@on $method $handler),
        }),*]
    };
    (@on GET $h:path) => { get($h) };
    (@on POST $h:path) => { post($h) };
}

/// Every route the server serves (the router is built from this table, plus the services
/// of [`openapi::MOUNTED`]).
pub const ROUTES: &[Route] = {
    use crate::engine::repair::{DeadRepairBody, DeadRepairReport, ReconcileBody, ReconcileReport};
    use crate::status::Status;
    use crate::wire::{
        AppendBody, CatAnswer, Health, JobQueued, LinkBody, MvBody, NotReady, OutboxShowAnswer,
        PutBody, Ready, ReindexAnswer, ReindexBody, RmBody, SearchBody, UnlinkBody,
    };
    use ce_core::OutboxEvent;
    use ce_retrieval::{HierarchicalResponse, RelatedResponse, SearchResponse};
    use ce_store::{ConsumerStats, DeliveryRow, Job, NodeStat, Relations, WriteOutcome};
    use handlers as h;
    use openapi::{any_of, json, schema};
    routes![
        POST "/v1/put" Tenant => h::put {
            Doc::new("Create or change a node (its layers, type, category, owner space, metadata)",
                json::<WriteOutcome>()).body(schema::<PutBody>())
        },
        GET "/v1/cat" Tenant => h::cat {
            Doc::new("Read one layer of a node", json::<CatAnswer>()).query(h::CAT)
        },
        GET "/v1/stat" Tenant => h::stat {
            Doc::new("A node's metadata, without its layers", json::<NodeStat>()).query(h::STAT)
        },
        GET "/v1/ls" Tenant => h::ls {
            Doc::new("The children of a node", json::<Vec<NodeStat>>()).query(h::LS)
        },
        GET "/v1/tree" Tenant => h::tree {
            Doc::new("The subtree below a node, depth first", json::<Vec<NodeStat>>())
                .query(h::TREE)
        },
        POST "/v1/rm" Tenant => h::rm {
            Doc::new("Remove a node (a subtree with `recursive`)", json::<WriteOutcome>())
                .body(schema::<RmBody>())
        },
        POST "/v1/mv" Tenant => h::mv {
            Doc::new("Move a node and its subtree", json::<WriteOutcome>())
                .body(schema::<MvBody>())
        },
        POST "/v1/link" Tenant => h::link {
            Doc::new("Add or change a typed relation between two nodes", json::<WriteOutcome>())
                .body(schema::<LinkBody>())
        },
        POST "/v1/unlink" Tenant => h::unlink {
            Doc::new("Remove a relation", json::<WriteOutcome>()).body(schema::<UnlinkBody>())
        },
        GET "/v1/children" Tenant => console::children {
            Doc::new("A page of a node's children, each with its L0 (the console's tree)",
                json::<console::ChildrenPage>())
                .query(console::CHILDREN)
        },
        GET "/v1/records" Tenant => console::records {
            Doc::new("A node's records in each index and whether they are current",
                json::<console::NodeRecords>())
                .query(console::RECORDS)
        },
        GET "/v1/relations" Tenant => h::relations {
            Doc::new("A node's relations as the source of truth holds them", json::<Relations>())
                .query(h::RELATIONS)
        },
        GET "/v1/related" Tenant => h::related {
            Doc::new("A node's related nodes from the relation index", json::<RelatedResponse>())
                .query(h::RELATED)
        },
        POST "/v1/search" Tenant => h::search {
            Doc::new("Search (vector, keyword, hybrid or hierarchical)",
                openapi::Reply::Json(any_of::<SearchResponse, HierarchicalResponse>))
                .describe("`\"mode\": \"hierarchical\"` answers a `HierarchicalResponse`, \
                    every other mode a `SearchResponse`.")
                .body(schema::<SearchBody>())
        },
        POST "/v1/sessions/new" Tenant => sessions::new {
            Doc::new("Create a session", json::<crate::sessions::SessionView>())
                .body(schema::<sessions::NewSessionBody>())
        },
        POST "/v1/sessions/add" Tenant => sessions::add {
            Doc::new("Append a message to a session (idempotent per message id)",
                json::<crate::sessions::Appended>())
                .body(schema::<sessions::AddMessageBody>())
        },
        GET "/v1/sessions/show" Tenant => sessions::show {
            Doc::new("A session: its live messages and its archives",
                json::<crate::sessions::SessionView>())
                .query(sessions::SHOW)
        },
        GET "/v1/sessions/ls" Tenant => sessions::ls {
            Doc::new("The sessions of an owner or an account",
                json::<Vec<crate::sessions::SessionEntry>>())
                .query(sessions::LS)
        },
        POST "/v1/sessions/commit" Tenant => sessions::commit {
            Doc::new("Commit a session: archive its messages and enqueue memory extraction",
                json::<crate::sessions::CommitOutcome>())
                .describe("Phase 1 of the two-phase commit: the archive and its \
                    `session-commit` job are written in one transaction; `status` is \
                    `skipped` when nothing is beyond the keep-last policy.")
                .body(schema::<sessions::CommitBody>())
        },
        GET "/v1/outbox/list" Admin => h::outbox_list {
            Doc::new("Outbox deliveries with their events, oldest first", json::<Vec<DeliveryRow>>())
                .query(h::OUTBOX_LIST)
        },
        GET "/v1/outbox/show" Admin => h::outbox_show {
            Doc::new("An outbox event and its deliveries", json::<OutboxShowAnswer>())
                .query(h::OUTBOX_SHOW)
        },
        GET "/v1/outbox/stats" Admin => h::outbox_stats {
            Doc::new("Delivery counts per consumer", json::<Vec<ConsumerStats>>()).query(h::NONE)
        },
        POST "/v1/outbox/append" Admin => h::outbox_append {
            Doc::new("Append an event to the outbox (repair)", json::<OutboxEvent>())
                .body(schema::<AppendBody>())
        },
        GET "/v1/status" Admin => h::status {
            Doc::new("Readiness, indexes, consumers' lag, jobs", json::<Status>()).query(h::NONE)
        },
        GET "/v1/status/lag" Admin => console::lag_history {
            Doc::new("Each consumer's lag over the last hour, from this server's own samples",
                json::<crate::lag_history::LagHistoryAnswer>())
                .describe("Sampled in memory every 10 s by `ce serve`; empty after a restart.")
                .query(h::NONE)
        },
        POST "/v1/reindex" Admin => jobs::reindex {
            Doc::new("Rebuild an index from the source of truth (a `reindex` job)",
                openapi::Reply::Json(any_of::<ReindexAnswer, JobQueued>))
                .describe("Answers the report once the job has run, or the queued job at once \
                    with `no_wait`.")
                .optional_body(schema::<ReindexBody>())
        },
        GET "/v1/jobs" Admin => jobs::list {
            Doc::new("Jobs, newest first", json::<Vec<Job>>()).query(jobs::LIST)
        },
        GET "/v1/jobs/{id}" Admin => jobs::show {
            Doc::new("One job", json::<Job>())
        },
        POST "/v1/jobs/{id}/cancel" Admin => jobs::cancel {
            Doc::new("Cancel a job", json::<Job>()).optional_body(schema::<handlers::NoFields>())
        },
        POST "/v1/jobs/{id}/retry" Admin => jobs::retry {
            Doc::new("Retry a failed, cancelled or dead job", json::<Job>())
                .optional_body(schema::<handlers::NoFields>())
        },
        GET "/v1/kb" Admin => kb::list {
            Doc::new("The knowledge bases", json::<Vec<ce_store::KnowledgeBase>>())
                .query(h::NONE)
        },
        POST "/v1/kb/create" Admin => kb::create {
            Doc::new("Create a knowledge base", json::<ce_store::KnowledgeBase>())
                .body(schema::<crate::kb::CreateBase>())
        },
        GET "/v1/kb/{base}" Admin => kb::show {
            Doc::new("A knowledge base and its items by status", json::<crate::kb::KbStatus>())
                .query(h::NONE)
        },
        GET "/v1/kb/{base}/status" Admin => kb::status {
            Doc::new("A knowledge base's items by status, with their errors",
                json::<crate::kb::KbStatus>())
                .query(kb::STATUS)
        },
        POST "/v1/kb/{base}/rm" Admin => kb::remove {
            Doc::new("Remove a knowledge base with its items and nodes (a cleanup job)",
                json::<crate::kb::KbJobs>())
                .optional_body(schema::<handlers::NoFields>())
        },
        POST "/v1/kb/{base}/items" Admin => kb::add {
            Doc::new("Add files, directories, URLs and notes (rows and first jobs)",
                json::<crate::kb::AddResult>())
                .describe("Local paths only under `[ingest].allowed_paths` of the server.")
                .body(schema::<crate::wire::KbAddBody>())
        },
        POST "/v1/kb/{base}/items/rm" Admin => kb::remove_items {
            Doc::new("Delete items: invisible at once, removed by a cleanup job",
                json::<crate::kb::KbJobs>())
                .body(schema::<crate::wire::KbItemsBody>())
        },
        POST "/v1/kb/{base}/reindex" Admin => kb::reindex {
            Doc::new("Reindex completed or failed items", json::<crate::kb::KbJobs>())
                .body(schema::<crate::wire::KbItemsBody>())
        },
        POST "/v1/kb/{base}/progress" Admin => kb::progress {
            Doc::new("Progress of items and jobs of an entry",
                json::<crate::kb::follow::KbProgress>())
                .body(schema::<crate::wire::KbProgressBody>())
        },
        POST "/v1/repair/dead" Admin => repair::dead {
            Doc::new("Count, requeue or force-finish dead deliveries", json::<DeadRepairReport>())
                .body(schema::<DeadRepairBody>())
        },
        POST "/v1/repair/reconcile" Admin => repair::reconcile {
            Doc::new("Compare indexes with the source of truth and repair them",
                json::<ReconcileReport>())
                .body(schema::<ReconcileBody>())
        },
        GET "/healthz" Open => h::healthz {
            Doc::new("Liveness: 200 while the process serves", json::<Health>())
        },
        GET "/readyz" Open => h::readyz {
            Doc::new("Readiness: 200 when ready", json::<Ready>())
                .other(503, "Not ready (retryable), with the reasons.", schema::<NotReady>())
        },
        GET "/metrics" Admin => h::metrics {
            Doc::new("Prometheus metrics", openapi::Reply::Text("text/plain"))
        },
        GET "/openapi.json" Open => openapi::serve {
            Doc::new("This OpenAPI 3.1 document",
                json::<serde_json::Map<String, serde_json::Value>>())
        },
    ]
};

/// The router with every route of [`ROUTES`], each behind its [`auth::gate`], and the MCP
/// endpoint [`crate::mcp::PATH`] behind a tenant gate.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    router_with(state, max_body_bytes, CancellationToken::new())
}

/// [`router`] whose MCP streams end when `cancel` is cancelled (at shutdown).
fn router_with(state: AppState, max_body_bytes: usize, cancel: CancellationToken) -> Router {
    let mcp = crate::mcp::http_service(state.engine.clone(), max_body_bytes, cancel);
    let mcp_gate = auth::Gate::new(state.keys.clone(), Access::Tenant);
    let mut router = Router::new()
        .route_service(crate::mcp::PATH, mcp)
        .route_layer(middleware::from_fn_with_state(mcp_gate, auth::gate))
        // The console's static files hold no data: no key needed (its API calls need one).
        .route(crate::ui::PATH, get(crate::ui::redirect))
        .route("/ui/", get(crate::ui::index))
        .route("/ui/{*file}", get(crate::ui::file));
    for r in ROUTES {
        let gate = auth::Gate::new(state.keys.clone(), r.access);
        router = router.route(
            r.path,
            (r.handler)().route_layer(middleware::from_fn_with_state(gate, auth::gate)),
        );
    }
    router
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Logs every request with its status and latency, and counts it.
async fn log_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let res = next.run(req).await;
    let status = res.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    info!(%method, path, status, ms, "request");
    metrics::counter!("http_requests_total", "status" => status.to_string()).increment(1);
    metrics::histogram!("http_request_latency_ms").record(ms);
    res
}

/// Serves `engine` on `options.bind` until SIGINT or SIGTERM; calls `on_listening` with the
/// bound address once the socket accepts connections. Stops the engine's workers before
/// returning.
pub fn serve(
    engine: Arc<Engine>,
    metrics: Option<Metrics>,
    options: &ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    serve_with(engine, metrics, options, on_listening, shutdown_signal())
}

/// [`serve`] until `stop` is set (checked every 50 ms) instead of a signal: for a process that
/// serves its own engine for a while (`ce bench ui`).
pub fn serve_until(
    engine: Arc<Engine>,
    options: &ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<()> {
    let stopped = async move {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    serve_with(engine, None, options, on_listening, stopped)
}

fn serve_with(
    engine: Arc<Engine>,
    metrics: Option<Metrics>,
    options: &ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let io = |context: &str| {
        let context = context.to_owned();
        move |source| ServerError::Io { context, source }
    };
    let server_config = &engine.config().server;
    let keys = options.keys.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ce-http")
        .build()
        .map_err(io("starting the async runtime"))?;
    let state = AppState {
        engine: engine.clone(),
        metrics: metrics.clone(),
        keys: keys.clone(),
    };
    let cancel = CancellationToken::new();
    let app = router_with(state, options.max_body_bytes, cancel.clone());
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&options.bind)
            .await
            .map_err(io(&format!("binding {}", options.bind)))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the bound address"))?;
        // Nagle's algorithm off, as HTTP servers do: with it, the tail of a response written
        // in more than one piece waits for the client's delayed ACK (up to 40 ms on Linux).
        let listener = listener.tap_io(|tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY on a connection");
            }
        });
        auth::check_bind(addr, &keys, server_config)?;
        if keys.is_enabled() {
            info!(keys = keys.len(), "api keys required");
        } else if !addr.ip().is_loopback() {
            warn!(%addr, "serving without api keys on a non-loopback address (server.allow_unauthenticated)");
        }
        info!(%addr, "listening");
        on_listening(addr);
        let sampled = engine.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::lag_history::SAMPLE_INTERVAL);
            loop {
                tick.tick().await;
                let e = sampled.clone();
                match tokio::task::spawn_blocking(move || e.sample_lag()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => warn!(%error, "lag sample failed"),
                    Err(error) => warn!(%error, "lag sample task failed"),
                }
            }
        });
        if let Some(m) = metrics {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    m.run_upkeep();
                }
            });
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                stop.await;
                // Open MCP streams would hold the graceful shutdown forever.
                cancel.cancel();
            })
            .await
            .map_err(io("serving"))
    });
    info!("stopping workers");
    engine.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
    info!("stopped");
    served
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("SIGINT: shutting down"),
        () = term => info!("SIGTERM: shutting down"),
    }
}

/// Waits for SIGINT or SIGTERM on a small runtime of its own (for `ce worker`).
pub fn wait_for_shutdown_signal() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            context: "starting the signal runtime".into(),
            source,
        })?;
    runtime.block_on(shutdown_signal());
    Ok(())
}
