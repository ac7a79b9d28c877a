//! Runs the built `ce` against a fresh data directory per test.

mod bad_input;
mod demo;
mod eval;
mod harness;
mod layout;
mod nodes;
mod outbox;
mod relations;
mod search;
mod server;
mod tenants;
mod worker;
