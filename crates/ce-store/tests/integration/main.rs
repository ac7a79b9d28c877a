//! Integration tests of the store, in one binary (STYLE.md): each suite goes through the
//! backend traits (`ContextFs`, `RelationStore`, `OutboxStore`), so another backend runs the
//! same suites by changing `common::open`.
//!
//! Randomized tests print their seed; `CE_SEED=<seed>` replays one, `CE_PROPTEST_CASES`
//! scales the number of property-test cases.

mod common;
mod crash;
mod fs;
mod outbox_concurrency;
mod outbox_model;
