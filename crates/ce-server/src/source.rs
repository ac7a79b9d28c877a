//! The source of truth a process is configured with (`store.url`): the embedded SQLite file
//! in the data directory, or PostgreSQL. [`Source::open`] is the one place that chooses;
//! the engine, the guarded writes and every local CLI command use the handle it returns.
//!
//! The handle dereferences to [`SourceStore`] (nodes, relations, outbox, holds), so callers
//! write `source.put(..)` whatever the backend; what differs (the clock, where the data
//! lives, schema migrations, PostgreSQL's wake-up connection) has its own method.

use std::path::Path;
use std::sync::Arc;

use ce_core::{Clock, Config, CoreError};
use ce_store::postgres::{PgStore, redact_url};
use ce_store::{JobStore, SourceStore, SqliteStore, StoreError};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The name of the embedded backend in reports.
pub const SQLITE: &str = "sqlite";
/// The name of the PostgreSQL backend in reports.
pub const POSTGRES: &str = "postgres";

/// An open source of truth. Cheap to clone (the stores are shared).
#[derive(Debug, Clone)]
pub enum Source {
    /// `ce.db` in the data directory (`store.url` empty).
    Sqlite(Arc<SqliteStore>),
    /// A PostgreSQL database (`store.url = "postgres://…"`).
    Postgres(Arc<PgStore>),
}

/// `ce migrate`: the schema version of the configured store before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The database file, or the URL without its password.
    pub location: String,
    /// The schema version found (0: a new store).
    pub from: i64,
    /// The schema version now (equal to `from` when nothing was pending).
    pub to: i64,
}

impl Source {
    /// Opens the store `config.store.url` names (empty: `ce.db` in `data_dir`), applying
    /// pending schema migrations and registering the configured consumers.
    ///
    /// With the `extractive` generator, small leaves are derived in their write transaction
    /// (`derive.inline_max_chars`, docs/derive.md "Derived at write time").
    pub fn open(data_dir: &Path, config: &Config) -> Result<Source> {
        config.validate()?;
        let inline = ce_derive::InlineExtractive::from_config(config)
            .map(|d| Arc::new(d) as Arc<dyn ce_store::derive::LeafDeriver>);
        if config.store_is_postgres() {
            let url = &config.store.url;
            let store = PgStore::open(url, config.clone()).map_err(|e| at_url(url, e))?;
            store.set_leaf_deriver_opt(inline);
            Ok(Source::Postgres(Arc::new(store)))
        } else {
            let store = SqliteStore::open(data_dir, config.clone())?;
            store.set_leaf_deriver_opt(inline);
            Ok(Source::Sqlite(Arc::new(store)))
        }
    }

    /// Applies the pending migrations of the configured store (opening it) and reports the
    /// schema version before and after. Safe to run from several processes at once: the
    /// store serializes migrations, and the later ones find nothing to do.
    pub fn migrate(data_dir: &Path, config: &Config) -> Result<(Source, MigrateReport)> {
        let source = Source::open(data_dir, config)?;
        let (from, to) = match &source {
            Source::Sqlite(s) => s.schema_migration(),
            Source::Postgres(p) => p.schema_migration(),
        };
        let report = MigrateReport {
            backend: source.backend().to_owned(),
            location: source.location(),
            from,
            to,
        };
        Ok((source, report))
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            Source::Sqlite(_) => SQLITE,
            Source::Postgres(_) => POSTGRES,
        }
    }

    /// Where the data lives: the database file, or the URL without its password.
    pub fn location(&self) -> String {
        match self {
            Source::Sqlite(s) => s.path().display().to_string(),
            Source::Postgres(p) => p.location().to_owned(),
        }
    }

    /// The store's clock (leases, backoff, ages).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        match self {
            Source::Sqlite(s) => s.clock(),
            Source::Postgres(p) => p.clock(),
        }
    }

    /// The store as a shared trait object (for workers and background threads).
    pub fn shared(&self) -> Arc<dyn SourceStore> {
        match self {
            Source::Sqlite(s) => s.clone(),
            Source::Postgres(p) => p.clone(),
        }
    }

    /// The durable job queue of the store (docs/jobs.md).
    pub fn jobs(&self) -> &dyn JobStore {
        match self {
            Source::Sqlite(s) => s.as_ref(),
            Source::Postgres(p) => p.as_ref(),
        }
    }

    /// The PostgreSQL store, when that is the backend.
    pub fn postgres(&self) -> Option<&Arc<PgStore>> {
        match self {
            Source::Postgres(p) => Some(p),
            Source::Sqlite(_) => None,
        }
    }
}

impl std::ops::Deref for Source {
    type Target = dyn SourceStore;

    fn deref(&self) -> &Self::Target {
        match self {
            Source::Sqlite(s) => s.as_ref(),
            Source::Postgres(p) => p.as_ref(),
        }
    }
}

impl AsRef<dyn SourceStore> for Source {
    fn as_ref(&self) -> &(dyn SourceStore + 'static) {
        &**self
    }
}

impl From<SqliteStore> for Source {
    fn from(s: SqliteStore) -> Self {
        Source::Sqlite(Arc::new(s))
    }
}

impl From<PgStore> for Source {
    fn from(p: PgStore) -> Self {
        Source::Postgres(Arc::new(p))
    }
}

/// `e`, met while connecting to `url`, naming the server (the store's own message does not).
/// A database or role the server does not know, refused credentials, or a `search_path`
/// naming no schema that exists are a bad `store.url`: `invalid_config`, not an internal
/// error.
fn at_url(url: &str, e: StoreError) -> StoreError {
    match e {
        StoreError::PgUnavailable(why) => {
            StoreError::PgUnavailable(format!("{} (store.url / --store): {why}", redact_url(url)))
        }
        StoreError::Postgres(pg) => match pg.as_db_error() {
            // SQLSTATE class 3D: no such database; 28: invalid authorization.
            Some(db) if ["3D", "28"].iter().any(|c| db.code().code().starts_with(c)) => {
                StoreError::Core(CoreError::InvalidConfig {
                    key: "store.url".into(),
                    reason: format!(
                        "{}: {} ({})",
                        redact_url(url),
                        db.message(),
                        db.code().code()
                    ),
                })
            }
            // SQLSTATE 3F000: the migrations found no schema to create their tables in.
            Some(db) if db.code().code().starts_with("3F") => {
                let named = search_path_of(url).map_or_else(
                    || "the role's or database's default search_path".to_owned(),
                    |p| format!("search_path {p:?}"),
                );
                StoreError::Core(CoreError::InvalidConfig {
                    key: "store.url".into(),
                    reason: format!(
                        "{}: {named} names no schema that exists (create it with \
                         `CREATE SCHEMA name`, or fix options=-csearch_path=...): {} ({})",
                        redact_url(url),
                        db.message(),
                        db.code().code()
                    ),
                })
            }
            _ => StoreError::Postgres(pg),
        },
        e => e,
    }
}

/// The `search_path` a PostgreSQL URL sets through its `options` parameter
/// (`options=-csearch_path%3Dname` or `-c search_path=a,b`), if any.
fn search_path_of(url: &str) -> Option<String> {
    let config: postgres::Config = url.parse().ok()?;
    let options = config.get_options()?;
    let (_, rest) = options.split_once("search_path=")?;
    let value = rest.split_whitespace().next().unwrap_or("");
    Some(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ce_store::sqlite::DB_FILE;

    #[test]
    fn the_embedded_store_is_the_default_and_migrate_reports_its_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (source, first) = Source::migrate(dir.path(), &Config::default()).expect("migrate");
        assert_eq!(source.backend(), SQLITE);
        assert_eq!(first.backend, SQLITE);
        assert_eq!(first.from, 0);
        assert!(first.to > 0, "{first:?}");
        assert!(first.location.ends_with(DB_FILE), "{first:?}");
        drop(source);
        let (_, second) = Source::migrate(dir.path(), &Config::default()).expect("again");
        assert_eq!((second.from, second.to), (first.to, first.to));
    }

    #[test]
    fn the_search_path_is_read_from_the_url_options() {
        assert_eq!(
            search_path_of("postgres://u@h/db?options=-csearch_path%3Dapp").as_deref(),
            Some("app")
        );
        assert_eq!(
            search_path_of("postgres://u@h/db?options=-c%20search_path%3Da,b%20-cx%3Dy").as_deref(),
            Some("a,b")
        );
        assert_eq!(search_path_of("postgres://u@h/db?sslmode=disable"), None);
    }

    #[test]
    fn a_url_that_is_not_postgres_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::default();
        config.store.url = "mysql://root:pw@h/db".into();
        let err = Source::open(dir.path(), &config).expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("store.url") && !text.contains("pw"), "{text}");
        assert_eq!(
            ce_core::Classify::code(&err),
            ce_core::ErrorCode::InvalidConfig
        );
        assert!(
            !dir.path().join(DB_FILE).exists(),
            "nothing created on refusal"
        );
    }
}
