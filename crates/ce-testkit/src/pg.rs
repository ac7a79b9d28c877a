//! Throwaway PostgreSQL databases for tests of the scale backend.
//!
//! The server is the machine's PostgreSQL (`.ci/run` starts it): `CE_TEST_PG_URL`, or
//! `postgres://postgres@127.0.0.1:5432/test` (trust auth). Each [`TestDb`] is a fresh
//! database created from that connection and dropped (forcibly) when the value drops, so
//! tests run in parallel without seeing each other. An unreachable server fails the test
//! with a message saying how to start one: these tests never skip. [`TestDb::create_on`] does
//! the same on another server (e.g. the pgvector server of [`crate::pgvector`]).

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

/// A TCP gate in front of a test server (fault injection): while closed it accepts every
/// connection and closes it at once, as a restarting server does, so a client sees the
/// connection closed; while open it relays bytes both ways to the server. [`Gate::url`]
/// rewrites a database URL to go through the gate.
#[derive(Debug)]
pub struct Gate {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
}

impl Gate {
    /// A gate to the TCP server of `url` (a `postgres://` URL with a host name or address),
    /// open or closed.
    pub fn start(url: &str, open: bool) -> Gate {
        let config = postgres::Config::from_str(url)
            .unwrap_or_else(|e| panic!("not a PostgreSQL URL: {url}: {e}"));
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            other => panic!("a gate needs a TCP host, {url} has {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let target = format!("{host}:{port}");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the gate");
        let addr = listener.local_addr().expect("gate address");
        let open = Arc::new(AtomicBool::new(open));
        let is_open = open.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !is_open.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let target = target.clone();
                std::thread::spawn(move || relay(client, &target));
            }
        });
        Gate { addr, open }
    }

    /// `url` with its host and port replaced by the gate's.
    pub fn url(&self, url: &str) -> String {
        let scheme_end = url.find("://").map_or(0, |i| i + 3);
        let rest = &url[scheme_end..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let user = rest[..authority_end].rfind('@').map_or("", |i| &rest[..=i]);
        format!(
            "{}{user}{}{}",
            &url[..scheme_end],
            self.addr,
            &rest[authority_end..]
        )
    }

    /// Lets new connections through (those already relayed stay up either way).
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// Relays `client` to `target` until either side closes.
fn relay(client: TcpStream, target: &str) {
    let Ok(server) = TcpStream::connect(target) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut client_in), Ok(mut server_in)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (mut client_out, mut server_out) = (client, server);
    let up = std::thread::spawn(move || {
        copy_then_close(&mut client_in, &mut server_out);
    });
    copy_then_close(&mut server_in, &mut client_out);
    let _ = up.join();
}

/// Copies until `from` ends or fails (a reset is an end too), then closes both.
fn copy_then_close(from: &mut TcpStream, to: &mut TcpStream) {
    let _ = std::io::copy(from, to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::{Gate, with_database};

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

    #[test]
    fn a_gate_url_keeps_user_database_and_query() {
        let gate = Gate::start("postgres://u@127.0.0.1:5432/test", false);
        let addr = gate.addr;
        assert_eq!(
            gate.url("postgres://u:pw@127.0.0.1:5432/db?sslmode=disable"),
            format!("postgres://u:pw@{addr}/db?sslmode=disable")
        );
        assert_eq!(
            gate.url("postgresql://127.0.0.1/db"),
            format!("postgresql://{addr}/db")
        );
    }
}
