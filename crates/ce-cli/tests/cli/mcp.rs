//! MCP through the official SDKs against the real binary: the Python SDK (`mcp`, pinned in
//! `tests/requirements.txt`) over stdio (`ce mcp`), over Streamable HTTP (`ce serve`) and
//! through the stdio bridge (`ce mcp --server URL`); the TypeScript SDK
//! (`@modelcontextprotocol/sdk`, `tests/mcp-ts/package-lock.json`) over Streamable HTTP.
//! The scripts (`tests/mcp/check_mcp.py`, `tests/mcp-ts/check.mjs`) call every tool, check
//! results, typed errors and tenant isolation between two keys, and search for a write once
//! `status` says it is indexed; as the admin they add a note and a file to a knowledge base
//! and find them once `kb_status` says they are completed. A missing interpreter or package
//! fails the test.

use super::harness::{CE, Ce, HASH_EMBEDDER, external, python};

const KEY_A: &str = "mcp-key-of-account-a-0001";
const KEY_B: &str = "mcp-key-of-account-b-0001";
const KEY_ADMIN: &str = "mcp-key-of-the-admin-0001";

/// A data directory whose `[ingest].allowed_paths` is its `docs/`, holding one Markdown file
/// (its path returned), plus `extra` configuration.
fn with_docs(extra: &str) -> (Ce, String) {
    let ce = Ce::new();
    let docs = ce.data_dir().join("docs");
    std::fs::create_dir(&docs).expect("docs");
    let file = docs.join("pangolin.md");
    std::fs::write(
        &file,
        "# Pangolins\n\nPangolins curl into a ball of armoured scales when threatened.\n",
    )
    .expect("doc");
    ce.write_config(&format!(
        "{HASH_EMBEDDER}[ingest]\nallowed_paths = [\"{}\"]\n{extra}",
        docs.display()
    ));
    (ce, file.to_str().expect("utf-8 path").to_owned())
}

fn two_accounts() -> (Ce, String) {
    with_docs(&format!(
        "[[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n\
         [[server.api_keys]]\nkey = \"{KEY_B}\"\naccount_id = \"b\"\n\
         [[server.api_keys]]\nkey = \"{KEY_ADMIN}\"\nadmin = true\n"
    ))
}

#[test]
fn python_sdk_over_stdio() {
    let (ce, doc) = with_docs("");
    let dir = ce.data_dir().to_str().expect("utf-8 path").to_owned();
    let out = external(
        &python(),
        &[
            "tests/mcp/check_mcp.py",
            "stdio",
            "local",
            &doc,
            CE,
            "--data-dir",
            &dir,
            "mcp",
        ],
        &[],
    );
    assert!(out.contains("mcp python sdk (stdio): ok"), "{out}");
}

#[test]
fn python_sdk_over_http_and_through_the_stdio_bridge() {
    let (ce, doc) = two_accounts();
    let server = ce.serve(&[]);
    let out = external(
        &python(),
        &[
            "tests/mcp/check_mcp.py",
            "http",
            &server.url,
            KEY_A,
            KEY_B,
            KEY_ADMIN,
            &doc,
        ],
        &[],
    );
    assert!(out.contains("mcp python sdk (http): ok"), "{out}");
    // `ce mcp --server URL`: the same tools, served by the server, over stdio.
    let out = external(
        &python(),
        &[
            "tests/mcp/check_mcp.py",
            "stdio",
            "a/bridge",
            "-",
            CE,
            "--server",
            &server.url,
            "--api-key",
            KEY_A,
            "mcp",
        ],
        &[],
    );
    assert!(out.contains("mcp python sdk (stdio): ok"), "{out}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn typescript_sdk_over_http() {
    let (ce, _doc) = two_accounts();
    let server = ce.serve(&[]);
    let out = external(
        "node",
        &[
            "tests/mcp-ts/check.mjs",
            &server.url,
            KEY_A,
            KEY_B,
            KEY_ADMIN,
        ],
        &[],
    );
    assert!(out.contains("mcp typescript sdk (http): ok"), "{out}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// Stdout of `ce mcp` is the protocol only: a client that initializes and disconnects gets
/// its answer there and nothing else, with `--json` too, and the command exits 0.
#[test]
fn stdio_prints_nothing_but_the_protocol() {
    let ce = Ce::hash("");
    let session = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n"
    );
    for args in [&["mcp"][..], &["--json", "mcp"]] {
        let out = ce.run_with_stdin(args, session);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {e}: {l:?}")))
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stdout}");
        assert_eq!(lines[0]["jsonrpc"], "2.0", "{stdout}");
        assert_eq!(lines[0]["id"], 1, "{stdout}");
    }
}
