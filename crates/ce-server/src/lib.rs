//! ContextEngine's engine and HTTP server.
//!
//! - [`source`]: the configured source of truth (embedded SQLite or PostgreSQL) behind one
//!   handle, shared by the engine and the local CLI
//! - [`engine`]: one data directory wired up — source of truth, embedder, vector index
//!   (embedded or pgvector), `IndexWorker`s with wake-up hints — plus search, status,
//!   reindex, drain
//! - [`jobs`]: durable jobs in the engine: the job types' handlers and the job runner
//! - [`kb`]: the ingestion workflow: knowledge bases, items and their jobs
//! - [`guarded`]: rm / mv / import under path locks, shared by the server and the local CLI
//! - [`sessions`]: sessions, their two-phase commit and the `session-commit` job
//! - [`http`]: the HTTP API (axum) with health, readiness and Prometheus endpoints
//! - [`mcp`]: the MCP server (tools and `ctx://` resources) over stdio and at `/mcp`
//! - [`wire`]: the API's JSON bodies (shared with the CLI's `--server` mode)
//! - [`status`]: the engine's reports; [`lag_history`]: the server's recent lag samples
//! - [`ui`]: the web console's static assets, served at `/ui`
//! - [`metrics`], [`logging`]: observability (spec §12.2, §12.3)

pub mod engine;
pub mod error;
mod flag;
pub mod guarded;
pub mod http;
pub mod jobs;
pub mod kb;
pub mod lag_history;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod sessions;
pub mod source;
pub mod status;
pub mod ui;
pub mod wire;

pub use engine::{Engine, EngineOptions, Readiness};
pub use error::{Result, ServerError};
pub use http::{ServeOptions, serve};
pub use metrics::Metrics;
pub use source::{MigrateReport, Source};
