//! `ce mcp --server URL`: bridges MCP over stdio to the server's Streamable HTTP endpoint
//! `URL/mcp` (the tools live on the server; nothing is reimplemented here). Each JSON-RPC
//! message read from stdin (one per line) is POSTed; a JSON answer is written to stdout as
//! one line, an SSE answer as one line per `data:` event. The `Mcp-Session-Id` the server
//! hands out (protocol `2025-11-25`) and the negotiated `MCP-Protocol-Version` go with every
//! later request (the session is ended with `DELETE` when stdin closes), with the `Mcp-Method` / `Mcp-Name` routing headers of `2026-07-28`. A request the server refuses at the HTTP level (e.g. `401
//! unauthenticated`) is answered with a JSON-RPC error carrying `{code, message,
//! retryable}`. Logs go to stderr only.

use std::io::{BufRead, Write};

use serde_json::{Value, json};
use tracing::warn;

use crate::error::{CliError, Result};
use crate::remote::Client;

/// The path of the server's MCP endpoint.
const PATH: &str = "/mcp";
/// JSON-RPC "internal error" for a refusal at the HTTP level.
const HTTP_REFUSED: i64 = -32603;

/// Runs the bridge until stdin closes.
pub fn bridge(c: &Client) -> Result<()> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut session: Option<String> = None;
    let mut version: Option<String> = None;
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| CliError::Other(e.into()))?;
        if line.trim().is_empty() {
            continue;
        }
        let msg: Option<Value> = serde_json::from_str(&line).ok();
        let id = msg.as_ref().and_then(|m| m.get("id")).cloned();
        let mut headers = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        if let Some(s) = &session {
            headers.push(("Mcp-Session-Id", s));
        }
        if let Some(v) = &version {
            headers.push(("MCP-Protocol-Version", v));
        }
        // The 2026-07-28 routing headers: the method, and the tool name or resource URI.
        let method = msg.as_ref().and_then(|m| m["method"].as_str());
        if let Some(m) = method {
            headers.push(("Mcp-Method", m));
        }
        let params = msg.as_ref().map(|m| &m["params"]);
        if let Some(n) = params.and_then(|p| p["name"].as_str().or(p["uri"].as_str())) {
            headers.push(("Mcp-Name", n));
        }
        let out = match c.post_raw(PATH, line.as_bytes(), &headers) {
            Ok(mut res) => {
                if let Some(s) = res
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                {
                    session = Some(s.to_owned());
                }
                let status = res.status().as_u16();
                let sse = res
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|t| t.starts_with("text/event-stream"));
                let text = res
                    .body_mut()
                    .read_to_string()
                    .map_err(|e| CliError::Other(e.into()))?;
                if !(200..300).contains(&status) {
                    refused(id.as_ref(), status, &text)
                } else if sse {
                    sse_data(&text)
                } else if text.trim().is_empty() {
                    Vec::new()
                } else {
                    vec![text.trim().to_owned()]
                }
            }
            Err(e) => {
                warn!(error = %e, "mcp bridge: request failed");
                refused(
                    id.as_ref(),
                    503,
                    &json!({"code": "unavailable", "message": e.to_string(), "retryable": true})
                        .to_string(),
                )
            }
        };
        for m in out {
            if version.is_none()
                && let Some(v) = serde_json::from_str::<Value>(&m)
                    .ok()
                    .and_then(|v| v["result"]["protocolVersion"].as_str().map(str::to_owned))
            {
                version = Some(v);
            }
            writeln!(stdout, "{m}").map_err(|e| CliError::Other(e.into()))?;
            stdout.flush().map_err(|e| CliError::Other(e.into()))?;
        }
    }
    // The client is gone: end the server-side session (2025-11-25), if any.
    if let Some(s) = &session
        && let Err(e) = c.delete_raw(PATH, &[("Mcp-Session-Id", s)])
    {
        warn!(error = %e, "mcp bridge: the session was not ended");
    }
    Ok(())
}

/// The `data:` payloads of an SSE body, one message each (multi-line data joined).
fn sse_data(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut data = String::new();
    for line in body.lines().chain([""]) {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        } else if line.is_empty() && !data.is_empty() {
            out.push(std::mem::take(&mut data));
        }
    }
    out.retain(|d| !d.trim().is_empty());
    out
}

/// A JSON-RPC error for a request the server refused with HTTP `status` (nothing for a
/// notification, which has no id to answer).
fn refused(id: Option<&Value>, status: u16, body: &str) -> Vec<String> {
    let Some(id) = id else {
        warn!(status, body, "mcp bridge: a notification was refused");
        return Vec::new();
    };
    let data: Value = serde_json::from_str(body).unwrap_or_else(|_| json!({"body": body}));
    let message = data["message"].as_str().map_or_else(
        || format!("HTTP {status}"),
        |m| format!("HTTP {status}: {m}"),
    );
    vec![json!({"jsonrpc": "2.0", "id": id, "error": {"code": HTTP_REFUSED, "message": message, "data": data}}).to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_bodies_split_into_messages() {
        let body = "retry: 3000\n\nid: 1\ndata: {\"a\":1}\n\ndata: {\"b\":\ndata: 2}\n\n";
        assert_eq!(sse_data(body), ["{\"a\":1}", "{\"b\":\n2}"]);
        assert!(sse_data("retry: 3000\n\n").is_empty());
    }

    #[test]
    fn refusals_answer_requests_only() {
        let r = refused(
            Some(&json!(7)),
            401,
            r#"{"code":"unauthenticated","message":"no key","retryable":false}"#,
        );
        let v: Value = serde_json::from_str(&r[0]).expect("json");
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["data"]["code"], "unauthenticated");
        assert!(refused(None, 401, "{}").is_empty());
    }
}
