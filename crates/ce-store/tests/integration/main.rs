//! Integration tests of the store, in one binary (STYLE.md): each suite goes through the
//! backend traits (`ContextFs`, `RelationStore`, `OutboxStore`) and runs on SQLite and on
//! PostgreSQL from the same code (`common::backend_tests!`); `crash` is SQLite's own (it
//! kills a process holding the database file).
//!
//! Randomized tests print their seed; `CE_SEED=<seed>` replays one, `CE_PROPTEST_CASES`
//! scales the number of property-test cases.

mod common;
mod crash;
mod derive;
mod fs;
mod jobs_concurrency;
mod jobs_model;
mod jobs_ops;
mod kb;
mod outbox_concurrency;
mod outbox_model;
mod outbox_ops;
