//! Throwaway PostgreSQL databases for tests of the scale backend.
//!
//! The server is the machine's PostgreSQL (`.ci/run` starts it): `CE_TEST_PG_URL`, or
//! `postgres://postgres@127.0.0.1:5432/test` (trust auth). Each [`TestDb`] is a fresh
//! database created from that connection and dropped (forcibly) when the value drops, so
//! tests run in parallel without seeing each other. An unreachable server fails the test
//! with a message saying how to start one: these tests never skip. [`TestDb::create_on`] does
//! the same on another server (e.g. the pgvector server of [`crate::pgvector`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// The variable that overrides the administrative connection URL.
pub const URL_VAR: &str = "CE_TEST_PG_URL";
/// The default administrative connection URL.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The administrative connection URL.
pub fn admin_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `url` with its database name replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map_or(0, |i| i + 3);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// Connects to `url` or panics with what to do about it.
pub fn connect(url: &str) -> postgres::Client {
    connect_or(url, &format!("start it (.ci/run does) or set {URL_VAR}"))
}

/// Connects to `url` or panics naming `fix`, what to do about it.
fn connect_or(url: &str, fix: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls)
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is not reachable ({e}); {fix}"))
}

/// A database that exists for the lifetime of the value.
#[derive(Debug)]
pub struct TestDb {
    admin: String,
    name: String,
    url: String,
    /// What to do when the server is unreachable (for panic messages).
    fix: String,
}

impl TestDb {
    /// Creates a fresh, empty database named after `label` (letters, digits, `_`) on the
    /// machine's PostgreSQL ([`admin_url`]).
    pub fn create(label: &str) -> TestDb {
        Self::create_on(
            &admin_url(),
            label,
            &format!("start it (.ci/run does) or set {URL_VAR}"),
        )
    }

    /// Creates a fresh, empty database named after `label` on the server of `admin` (a URL
    /// whose user may create databases); `fix` says what to do if that server is unreachable.
    pub fn create_on(admin: &str, label: &str, fix: &str) -> TestDb {
        static N: AtomicU64 = AtomicU64::new(0);
        let admin = admin.to_owned();
        let clean: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!(
            "ce_t_{clean}_{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let mut c = connect_or(&admin, fix);
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin}: {e}"));
        let url = with_database(&admin, &name);
        TestDb {
            admin,
            name,
            url,
            fix: fix.to_owned(),
        }
    }

    /// The URL of the database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Terminates every connection to the database but the caller's own (fault injection:
    /// what a server restart does to clients); returns how many were terminated.
    pub fn terminate_connections(&self) -> u64 {
        let mut c = connect_or(&self.admin, &self.fix);
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = $1 AND pid <> pg_backend_pid()) t",
                &[&self.name],
            )
            .map(|r| r.get(0))
            .unwrap_or_else(|e| panic!("pg_terminate_backend on {}: {e}", self.name));
        n as u64
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_names_are_replaced_keeping_the_query() {
        assert_eq!(
            with_database("postgres://u@h:5432/test?sslmode=disable", "x"),
            "postgres://u@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(with_database("postgresql://h/a", "b"), "postgresql://h/b");
        assert_eq!(
            with_database("postgresql://postgres@%2Ftmp%2Fpg/postgres", "x"),
            "postgresql://postgres@%2Ftmp%2Fpg/x",
            "a unix socket directory as the host"
        );
    }
}
