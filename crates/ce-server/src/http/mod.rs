//! The HTTP API (axum, JSON, one port): every CLI operation under `/v1/{command}`, plus
//! `/healthz`, `/readyz` and `/metrics`. The routes and bodies are documented in
//! `docs/http-api.md`.
//!
//! [`serve`] runs until SIGINT or SIGTERM, then stops accepting, lets in-flight requests
//! finish, and stops the workers (each finishes its batch, so no claim is left behind).

mod error;
mod handlers;
mod params;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tracing::{info, warn};

pub use self::error::ApiError;
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
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Listen address, e.g. `127.0.0.1:7420` (port 0 picks a free port).
    pub bind: String,
    /// Largest accepted request body; larger ones get 413 `payload_too_large`.
    pub max_body_bytes: usize,
}

impl ServeOptions {
    /// Defaults for `config`: [`DEFAULT_BIND`], and a body limit that fits a put of three
    /// layers at `store.max_layer_bytes` each.
    pub fn for_config(config: &ce_core::Config) -> Self {
        ServeOptions {
            bind: DEFAULT_BIND.into(),
            max_body_bytes: config.store.max_layer_bytes.saturating_mul(3) + BODY_OVERHEAD,
        }
    }
}

/// The router with every route (see the module docs).
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    use handlers as h;
    Router::new()
        .route("/v1/put", post(h::put))
        .route("/v1/cat", get(h::cat))
        .route("/v1/stat", get(h::stat))
        .route("/v1/ls", get(h::ls))
        .route("/v1/tree", get(h::tree))
        .route("/v1/rm", post(h::rm))
        .route("/v1/mv", post(h::mv))
        .route("/v1/link", post(h::link))
        .route("/v1/unlink", post(h::unlink))
        .route("/v1/relations", get(h::relations))
        .route("/v1/search", post(h::search))
        .route("/v1/outbox/list", get(h::outbox_list))
        .route("/v1/outbox/show", get(h::outbox_show))
        .route("/v1/outbox/stats", get(h::outbox_stats))
        .route("/v1/outbox/append", post(h::outbox_append))
        .route("/v1/status", get(h::status))
        .route("/v1/reindex", post(h::reindex))
        .route("/healthz", get(h::healthz))
        .route("/readyz", get(h::readyz))
        .route("/metrics", get(h::metrics))
        .fallback(h::not_found)
        .method_not_allowed_fallback(h::method_not_allowed)
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
    let io = |context: &str| {
        let context = context.to_owned();
        move |source| ServerError::Io { context, source }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ce-http")
        .build()
        .map_err(io("starting the async runtime"))?;
    let state = AppState {
        engine: engine.clone(),
        metrics: metrics.clone(),
    };
    let app = router(state, options.max_body_bytes);
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&options.bind)
            .await
            .map_err(io(&format!("binding {}", options.bind)))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the bound address"))?;
        info!(%addr, "listening");
        on_listening(addr);
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
            .with_graceful_shutdown(shutdown_signal())
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
