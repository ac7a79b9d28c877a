//! A PostgreSQL server with the pgvector extension for tests of the pgvector vector index.
//!
//! The machine's PostgreSQL has no pgvector, so these tests use a second server started by
//! `scripts/pgvector-server.py` from the PyPI package `pgserver` (PostgreSQL 16 + pgvector
//! 0.6), listening on a unix socket only. [`pgvector_url`] is `CE_TEST_PGVECTOR_URL` when set,
//! else the URL the script prints (it starts the server, or reuses a running one, once per
//! process). Each test takes a fresh database from it with [`test_db`]. A server that cannot
//! be started fails the test with what to do: these tests never skip.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::pg::TestDb;

/// The variable that overrides the administrative URL of the pgvector server.
pub const URL_VAR: &str = "CE_TEST_PGVECTOR_URL";

/// The script that starts the server and prints its URL.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pgvector-server.py")
}

/// What to do when the server cannot be had.
fn fix() -> String {
    format!(
        "install the server with `python3 -m pip install pgserver` (.ci/run does) and check \
         that `python3 {}` prints a URL, or set {URL_VAR} to a PostgreSQL with the pgvector \
         extension",
        script().display()
    )
}

/// The administrative URL of a PostgreSQL server with pgvector: `CE_TEST_PGVECTOR_URL`, else
/// the one `scripts/pgvector-server.py` prints after starting (or reusing) its server. Panics
/// with what to do when neither works.
pub fn pgvector_url() -> String {
    if let Ok(url) = std::env::var(URL_VAR) {
        return url;
    }
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let script = script();
        let out = Command::new("python3")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}; {}", script.display(), fix()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let url = stdout.lines().last().unwrap_or("").trim().to_owned();
        if !out.status.success() || url.is_empty() {
            panic!(
                "{} failed ({}): {}\n{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                fix()
            );
        }
        url
    })
    .clone()
}

/// A fresh, empty database on the pgvector server, dropped with the value.
pub fn test_db(label: &str) -> TestDb {
    TestDb::create_on(&pgvector_url(), label, &fix())
}
