//! The MCP server (Model Context Protocol, official Rust SDK `rmcp`): the tools of
//! [`tools::TOOLS`] and `ctx://` resources, over stdio (`ce mcp`) and Streamable HTTP at
//! [`PATH`] on `ce serve`. See `docs/mcp.md`.
//!
//! The HTTP transport sits behind the same [`crate::http::auth::gate`] as the JSON API
//! (a tenant route): the gate puts the caller's [`Principal`] into the request's
//! extensions, rmcp hands the request's `http::request::Parts` to the handler, and every
//! tool runs with that principal's [`Scope`]. Over stdio the caller is the single-user
//! admin. Tool failures are tool results with `isError: true` and our
//! `{code, message, retryable}` as structured content; protocol errors are kept for
//! malformed JSON-RPC and unknown tools.
//!
//! Protocol revisions: rmcp serves `2026-07-28` (stateless) and still accepts clients of
//! `2025-11-25` (initialize, `Mcp-Session-Id` sessions kept in memory).

pub mod pack;
pub mod tools;

use std::sync::Arc;

use ce_core::{CtxUri, ErrorCode, IndexProjector, Level};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::http::handlers::on_blocking_pool;
use crate::http::scope::Scope;
use crate::http::{ApiError, Principal};
use crate::wire::{self, CatAnswer, ErrorBody};

/// The path of the Streamable HTTP transport on `ce serve`.
pub const PATH: &str = "/mcp";

/// Host names `/mcp` always accepts (rmcp's DNS-rebinding protection); `server.allowed_hosts`
/// adds more, `"*"` accepts any.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Accounts per page of `resources/list`.
const RESOURCES_PAGE: usize = 100;

/// The MCP handler: the engine and, for stdio, the fixed caller.
#[derive(Clone)]
pub struct CeMcp {
    engine: Arc<Engine>,
    /// `None`: the caller of each request is the HTTP gate's principal.
    principal: Option<Principal>,
}

/// `{code, message, retryable}` of an error.
pub(crate) fn error_body(e: &ApiError) -> Value {
    json!(ErrorBody {
        code: e.code.as_str().to_owned(),
        message: e.message.clone(),
        retryable: e.retryable,
    })
}

/// A tool result: readable JSON text plus the same value as structured content.
fn tool_result(v: Value, is_error: bool) -> CallToolResult {
    let text = serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string());
    let mut r = if is_error {
        CallToolResult::structured_error(v)
    } else {
        CallToolResult::structured(v)
    };
    r.content = vec![ContentBlock::text(text)];
    r
}

impl CeMcp {
    /// The handler of `ce mcp` (stdio): every call is the single-user admin's.
    pub fn local(engine: Arc<Engine>) -> Self {
        CeMcp {
            engine,
            principal: Some(Principal::Admin),
        }
    }

    /// The handler of `/mcp`: every call is its HTTP request's principal.
    pub fn http(engine: Arc<Engine>) -> Self {
        CeMcp {
            engine,
            principal: None,
        }
    }

    fn caller(&self, ctx: &RequestContext<RoleServer>) -> std::result::Result<Principal, McpError> {
        if let Some(p) = &self.principal {
            return Ok(p.clone());
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .cloned()
            .ok_or_else(|| {
                McpError::internal_error("request without an authenticated caller", None)
            })
    }

    /// Runs tool `name` for `p` (the in-process entry point the handler uses): `None` for
    /// an unknown tool.
    pub async fn call(&self, p: Principal, name: &str, args: Value) -> Option<CallToolResult> {
        let tool = tools::find(name)?;
        Some(match tools::call(&self.engine, p, tool, args).await {
            Ok(v) => tool_result(v, false),
            Err(e) => tool_result(error_body(&e), true),
        })
    }

    /// Reads resource `uri` (`ctx://path`, optionally `?level=0|1|2`; default L2) for `p`.
    pub async fn read(&self, p: Principal, uri: &str) -> std::result::Result<String, ApiError> {
        let (path, level) = match uri.split_once('?') {
            None => (uri, Level::L2),
            Some((path, query)) => {
                let l = query
                    .strip_prefix("level=")
                    .and_then(|l| l.parse::<i64>().ok())
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidField,
                            format!("resource {uri:?}: the only query is ?level=0, 1 or 2"),
                            false,
                        )
                    })?;
                (path, Level::from_i64(l)?)
            }
        };
        let uri = wire::uri(path)?;
        on_blocking_pool(&self.engine, move |e| {
            let node = Scope::new(&p, e.store().as_ref()).read_node(&uri)?;
            let projector = IndexProjector::new(e.config().projector);
            Ok(CatAnswer::of(&node, level, &projector).text)
        })
        .await
    }
}

fn protocol_error(e: &ApiError) -> McpError {
    let data = Some(error_body(e));
    match e.code {
        ErrorCode::NotFound => McpError::resource_not_found(e.message.clone(), data),
        c if c.http_status() < 500 => McpError::invalid_params(e.message.clone(), data),
        _ => McpError::internal_error(e.message.clone(), data),
    }
}

impl ServerHandler for CeMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            "contextengine",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "ContextEngine is a context database: a tree of ctx:// nodes, each with an abstract \
             (L0), an overview (L1) and full content (L2). Use `search` to find context (set \
             max_tokens to get one block within a budget), `read` to open nodes, `list` and \
             `tree` to browse, `write` / `edit` to remember, `status` to see when writes are \
             searchable. With an admin key, `kb_create` / `kb_add` index files, URLs and notes \
             into a knowledge base and `kb_status` follows them.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(
            tools::TOOLS.iter().map(tools::Tool::to_mcp).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        tools::find(name).map(tools::Tool::to_mcp)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, McpError> {
        let p = self.caller(&context)?;
        let args = Value::Object(request.arguments.unwrap_or_default());
        match self.call(p, &request.name, args).await {
            Some(r) => Ok(r.into()),
            None => Err(McpError::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourcesResult, McpError> {
        let p = self.caller(&context)?;
        let start: usize = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(c) => c.parse().map_err(|_| {
                McpError::invalid_params(
                    format!("cursor {c:?} was not returned by this server"),
                    None,
                )
            })?,
        };
        let top = on_blocking_pool(&self.engine, move |e| {
            Scope::new(&p, e.store().as_ref()).ls(&CtxUri::root())
        })
        .await
        .map_err(|e| protocol_error(&e))?;
        let end = top.len().min(start.saturating_add(RESOURCES_PAGE));
        let next = (end < top.len()).then(|| end.to_string());
        let mut page = ListResourcesResult::with_all_items(
            top.get(start.min(end)..end)
                .unwrap_or_default()
                .iter()
                .map(|s| {
                    let uri = s.uri.to_string();
                    Resource::new(uri.clone(), uri)
                        .with_description("An account: its full content (L2); see the ctx:// templates for any node and layer")
                        .with_mime_type("text/plain")
                })
                .collect(),
        );
        page.next_cursor = next;
        Ok(page)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("ctx://{+path}", "node")
                .with_description("A node's full content (L2)")
                .with_mime_type("text/plain"),
            ResourceTemplate::new("ctx://{+path}{?level}", "node layer")
                .with_description("A node's layer: level=0 abstract, 1 overview, 2 content")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<ReadResourceResponse, McpError> {
        let p = self.caller(&context)?;
        let text = self
            .read(p, &request.uri)
            .await
            .map_err(|e| protocol_error(&e))?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, request.uri).with_mime_type("text/plain"),
        ])
        .into())
    }
}

/// The Streamable HTTP service of `/mcp` (mounted by `crate::http::router` behind the
/// tenant gate): sessions for `2025-11-25` clients in memory, JSON answers where possible,
/// `Host` checked against [`LOOPBACK_HOSTS`] plus `server.allowed_hosts`; `cancel` ends
/// open streams when the server shuts down.
pub fn http_service(
    engine: Arc<Engine>,
    max_body_bytes: usize,
    cancel: CancellationToken,
) -> StreamableHttpService<CeMcp, LocalSessionManager> {
    let extra = &engine.config().server.allowed_hosts;
    let mut config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_cancellation_token(cancel)
        .with_max_request_body_bytes(max_body_bytes);
    config = if extra.iter().any(|h| h == "*") {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(
            LOOPBACK_HOSTS
                .iter()
                .map(|h| (*h).to_owned())
                .chain(extra.iter().cloned()),
        )
    };
    StreamableHttpService::new(
        move || Ok(CeMcp::http(engine.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// `ce mcp`: serves `engine` over stdin / stdout until the client closes stdin, then stops
/// the engine's workers. Logs go to stderr (stdout is the protocol).
pub fn serve_stdio(engine: Arc<Engine>) -> Result<()> {
    let io = |context: &str, e: std::io::Error| ServerError::Io {
        context: context.to_owned(),
        source: e,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ce-mcp")
        .build()
        .map_err(|e| io("starting the async runtime", e))?;
    let handler = CeMcp::local(engine.clone());
    let served = runtime.block_on(async move {
        let running = handler.serve(rmcp::transport::stdio()).await.map_err(|e| {
            io(
                "starting MCP over stdio",
                std::io::Error::other(e.to_string()),
            )
        })?;
        info!("mcp: serving on stdio");
        running.waiting().await.map_err(|e| {
            io(
                "serving MCP over stdio",
                std::io::Error::other(e.to_string()),
            )
        })?;
        Ok(())
    });
    info!("mcp: stdin closed, stopping workers");
    engine.shutdown();
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    served
}
