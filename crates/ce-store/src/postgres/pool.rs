//! A small pool of synchronous PostgreSQL clients and the transactions run on them: what the
//! store ([`super::PgStore`]) and the pgvector index of `ce-index` share.
//!
//! - [`Pool::run`] runs a closure in one transaction ([`Begin`]) on a pooled connection and
//!   commits when it returns `Ok`.
//! - Each connection keeps its prepared statements: [`Tx::query`] and its siblings prepare a
//!   statement once per connection (a query given as a string would be prepared on every
//!   call: two round trips).
//! - A connection on which a statement or the commit failed (a database or transport error)
//!   is dropped, never reused, and the next call connects afresh; so is one whose transaction
//!   ended with an error that [`PoolError::drops_connection`] names. Logical errors (not
//!   found, conflict) roll back and return the connection to the pool.
//! - A pooled connection found dead at `BEGIN` (server restart, terminated backend) is
//!   replaced once, transparently: nothing was sent yet. The other idle connections are
//!   dropped with it (a server restart kills them all).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::str::FromStr as _;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, IsolationLevel, NoTls, Row, Statement};

use super::redact_url;

/// The parameters of one statement.
pub type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// An error type that transactions of a [`Pool`] return.
pub trait PoolError: From<postgres::Error> {
    /// Whether a transaction that ended with this error must not give its connection back,
    /// beyond the statements that failed on it (which [`Tx`] tracks itself): e.g. an error
    /// type that cannot tell a database error from a logical one once converted.
    fn drops_connection(&self) -> bool;
}

/// Parses a connection URL, with a connect timeout and TCP keepalives unless it sets them,
/// and `application_name` unless it names one. The error is a message for the user (the URL
/// without its password, and why it does not parse).
pub fn client_config(url: &str, application_name: &str) -> Result<postgres::Config, String> {
    let mut c = postgres::Config::from_str(url).map_err(|e| format!("{}: {e}", redact_url(url)))?;
    if c.get_connect_timeout().is_none() {
        c.connect_timeout(Duration::from_secs(5));
    }
    c.keepalives(true);
    c.keepalives_idle(Duration::from_secs(30));
    if c.get_application_name().is_none() {
        c.application_name(application_name);
    }
    Ok(c)
}

/// How a transaction begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// `READ COMMITTED`, read-write.
    Write,
    /// `REPEATABLE READ, READ ONLY`: one snapshot.
    Read,
}

/// A pooled connection with its prepared statements.
struct Conn {
    client: Client,
    stmts: HashMap<String, Statement>,
}

/// One open transaction and the statement cache of its connection. Statement errors come
/// back as `E`; any of them (and a failed commit) keeps the connection out of the pool.
pub struct Tx<'a, E> {
    tx: postgres::Transaction<'a>,
    stmts: &'a mut HashMap<String, Statement>,
    max_statements: usize,
    /// Set when a statement failed in the database or on the wire.
    failed: bool,
    /// Channels to notify just before the commit.
    notify: Vec<&'static str>,
    error: PhantomData<fn() -> E>,
}

impl<E: From<postgres::Error>> Tx<'_, E> {
    fn check<T>(&mut self, r: Result<T, postgres::Error>) -> Result<T, E> {
        r.map_err(|e| {
            self.failed = true;
            E::from(e)
        })
    }

    fn prepared(&mut self, sql: &str) -> Result<Statement, E> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.prepare(sql);
        let s = self.check(s)?;
        if self.stmts.len() >= self.max_statements {
            self.stmts.clear();
        }
        self.stmts.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    /// All rows of `sql`.
    pub fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, E> {
        let s = self.prepared(sql)?;
        let r = self.tx.query(&s, params);
        self.check(r)
    }

    /// At most one row of `sql`.
    pub fn query_opt(&mut self, sql: &str, params: Params<'_>) -> Result<Option<Row>, E> {
        let s = self.prepared(sql)?;
        let r = self.tx.query_opt(&s, params);
        self.check(r)
    }

    /// Exactly one row of `sql`.
    pub fn query_one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, E> {
        let s = self.prepared(sql)?;
        let r = self.tx.query_one(&s, params);
        self.check(r)
    }

    /// Runs `sql`; the number of rows it changed.
    pub fn execute(&mut self, sql: &str, params: Params<'_>) -> Result<u64, E> {
        let s = self.prepared(sql)?;
        let r = self.tx.execute(&s, params);
        self.check(r)
    }

    /// All rows of `sql`, without caching its statement: for results whose type can change
    /// under a cached statement ("cached plan must not change result type").
    pub fn query_uncached(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, E> {
        let r = self.tx.query(sql, params);
        self.check(r)
    }

    /// Runs several statements without parameters (DDL, savepoints, settings).
    pub fn batch(&mut self, sql: &str) -> Result<(), E> {
        let r = self.tx.batch_execute(sql);
        self.check(r)
    }

    /// Sends `NOTIFY channel` (empty payload) just before the transaction commits, once
    /// however often it is asked for; PostgreSQL delivers it after the commit, and not at all
    /// when the transaction rolls back.
    pub fn notify_at_commit(&mut self, channel: &'static str) {
        if !self.notify.contains(&channel) {
            self.notify.push(channel);
        }
    }

    /// Sends the notifications and commits; whether a statement on the connection failed.
    fn commit(mut self) -> (Result<(), E>, bool) {
        for channel in std::mem::take(&mut self.notify) {
            if let Err(e) = self.execute("SELECT pg_notify($1, '')", &[&channel]) {
                return (Err(e), true);
            }
        }
        let r = self.tx.commit();
        let failed = self.failed || r.is_err();
        (r.map_err(E::from), failed)
    }
}

/// A pool of connections to one database (see the module documentation). Safe to share
/// between threads.
pub struct Pool {
    config: postgres::Config,
    location: String,
    max_idle: usize,
    max_statements: usize,
    idle: Mutex<Vec<Conn>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("url", &self.location)
            .field("max_idle", &self.max_idle)
            .finish_non_exhaustive()
    }
}

enum Attempt<T, E, F> {
    /// The transaction began and `f` ran (committed when `Ok`); whether a statement on the
    /// connection failed.
    Ran(Result<T, E>, bool),
    /// `BEGIN` failed; `f` did not run and is handed back.
    BeginFailed(postgres::Error, F),
}

impl Pool {
    /// A pool for `config` that keeps up to `max_idle` idle connections, each with all the
    /// statements it prepared. `location` (the URL without its password) names the
    /// database in logs.
    pub fn new(config: postgres::Config, location: impl Into<String>, max_idle: usize) -> Pool {
        Pool {
            config,
            location: location.into(),
            max_idle,
            max_statements: usize::MAX,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Keeps at most `n` prepared statements per connection (the cache is emptied when
    /// full): for callers whose statement texts vary without bound.
    pub fn with_max_statements(mut self, n: usize) -> Pool {
        self.max_statements = n.max(1);
        self
    }

    /// The URL without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// A new client with the pool's settings, outside the pool (e.g. for `LISTEN`).
    pub fn connect(&self) -> Result<Client, postgres::Error> {
        self.config.connect(NoTls)
    }

    /// Runs `f` on a new connection that is pooled afterwards if `f` returns `Ok` (`f`
    /// drives the client itself, so nothing tells a failed statement from another error).
    pub fn with_client<T, E: From<postgres::Error>>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut conn = self.new_conn()?;
        let out = f(&mut conn.client);
        if out.is_ok() {
            self.give_back(conn);
        }
        out
    }

    /// Runs `f` in one transaction on a pooled connection; commits when it returns `Ok`. A
    /// pooled connection that fails at `BEGIN` is replaced once (with the rest of the idle
    /// connections: a server restart kills them all).
    pub fn run<T, E: PoolError>(
        &self,
        begin: Begin,
        f: impl FnOnce(&mut Tx<'_, E>) -> Result<T, E>,
    ) -> Result<T, E> {
        let (mut conn, pooled) = self.take()?;
        let f = match self.attempt(&mut conn, begin, f) {
            Attempt::Ran(out, failed) => return self.settle(conn, out, failed),
            Attempt::BeginFailed(e, f) if pooled => {
                tracing::debug!(error = %e, url = %self.location, "pooled postgres connection is dead; reconnecting");
                self.idle().clear();
                f
            }
            Attempt::BeginFailed(e, _) => return Err(e.into()),
        };
        let mut conn = self.new_conn()?;
        match self.attempt(&mut conn, begin, f) {
            Attempt::Ran(out, failed) => self.settle(conn, out, failed),
            Attempt::BeginFailed(e, _) => Err(e.into()),
        }
    }

    fn attempt<T, E: From<postgres::Error>, F: FnOnce(&mut Tx<'_, E>) -> Result<T, E>>(
        &self,
        conn: &mut Conn,
        begin: Begin,
        f: F,
    ) -> Attempt<T, E, F> {
        let Conn { client, stmts } = conn;
        let builder = client.build_transaction();
        let begun = match begin {
            Begin::Write => builder
                .isolation_level(IsolationLevel::ReadCommitted)
                .start(),
            Begin::Read => builder
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start(),
        };
        let tx = match begun {
            Ok(tx) => tx,
            Err(e) => return Attempt::BeginFailed(e, f),
        };
        let mut tx = Tx {
            tx,
            stmts,
            max_statements: self.max_statements,
            failed: false,
            notify: Vec::new(),
            error: PhantomData,
        };
        match f(&mut tx) {
            Ok(v) => {
                let (done, failed) = tx.commit();
                Attempt::Ran(done.map(|()| v), failed)
            }
            // Dropping the transaction rolls it back.
            Err(e) => Attempt::Ran(Err(e), tx.failed),
        }
    }

    /// Gives `conn` back unless a statement on it failed or `out` is an error that drops it.
    fn settle<T, E: PoolError>(&self, conn: Conn, out: Result<T, E>, failed: bool) -> Result<T, E> {
        if !failed && !out.as_ref().is_err_and(E::drops_connection) {
            self.give_back(conn);
        }
        out
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn new_conn(&self) -> Result<Conn, postgres::Error> {
        Ok(Conn {
            client: self.connect()?,
            stmts: HashMap::new(),
        })
    }

    /// An idle connection that is not known to be closed (and `true`), or a new one.
    fn take(&self) -> Result<(Conn, bool), postgres::Error> {
        let pooled = self.idle().pop();
        match pooled {
            Some(c) if !c.client.is_closed() => Ok((c, true)),
            _ => Ok((self.new_conn()?, false)),
        }
    }

    fn give_back(&self, conn: Conn) {
        if conn.client.is_closed() {
            return;
        }
        let mut idle = self.idle();
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }
}
