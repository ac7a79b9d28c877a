//! The source-store backends a suite runs on, and where each keeps its data.
//!
//! A test body is a function of the [`Backend`]; [`backend_tests!`](crate::backend_tests)
//! generates its `sqlite::` and `postgres::` `#[test]`s. A [`Place`] owns what a store lives
//! in (a temporary directory, or a throwaway database of [`crate::pg`]); each suite opens its
//! store there itself (this crate does not depend on the store). The PostgreSQL variants fail,
//! never skip, when the server is unreachable.

use crate::pg::{TestDb, connect};

/// A backend the suites run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `SqliteStore` in a temporary directory.
    Sqlite,
    /// `PgStore` in a throwaway database.
    Postgres,
}

impl Backend {
    /// A new, empty place for a store of this backend, named after the running test.
    pub fn place(self) -> Place {
        match self {
            Backend::Sqlite => Place::Dir(tempfile::tempdir().expect("tempdir")),
            Backend::Postgres => {
                let thread = std::thread::current();
                Place::Db(TestDb::create(thread.name().unwrap_or("store")))
            }
        }
    }
}

/// Where a store lives, for as long as the value: a temporary directory or a database.
/// Opening it again reopens the same store.
#[derive(Debug)]
pub enum Place {
    /// The directory of a `SqliteStore`.
    Dir(tempfile::TempDir),
    /// The database of a `PgStore`.
    Db(TestDb),
}

impl Place {
    /// Empties the place, as if it were new (drop its stores first): a new directory, or the
    /// same database with every table but the migration log truncated (much cheaper than a
    /// new database, for property tests that open a store per case).
    pub fn reset(&mut self) {
        match self {
            Place::Dir(dir) => *dir = tempfile::tempdir().expect("tempdir"),
            Place::Db(db) => {
                let mut c = connect(db.url());
                let tables: Vec<String> = c
                    .query(
                        "SELECT quote_ident(tablename) FROM pg_tables
                         WHERE schemaname = current_schema()
                           AND tablename NOT IN ('ce_schema_migrations', 'journal')",
                        &[],
                    )
                    .expect("list tables")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                if !tables.is_empty() {
                    c.batch_execute(&format!("TRUNCATE {} RESTART IDENTITY", tables.join(", ")))
                        .expect("truncate tables");
                }
                // The journal's one row is part of the schema: reset, not removed.
                c.batch_execute(
                    "DO $$ BEGIN
                         IF to_regclass('journal') IS NOT NULL THEN
                             UPDATE journal SET pruned_through = 0;
                         END IF;
                     END $$",
                )
                .expect("reset the journal row");
            }
        }
    }
}

/// Generates, for each named function `fn(Backend)` of the calling module, a `#[test]` of
/// that name in a `sqlite` and in a `postgres` submodule.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name($crate::backends::Backend::Sqlite)
                }
            )+
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    super::$name($crate::backends::Backend::Postgres)
                }
            )+
        }
    };
}
