//! Runs the built `ce` against a fresh data directory per test.

mod bad_input;
mod crash_sweep;
mod demo;
mod derive;
mod eval;
mod fake_embeddings;
mod first_use;
mod fuzz_args;
mod harness;
mod jobs;
mod kill_server;
mod layout;
mod mcp;
mod nodes;
mod openapi;
mod outbox;
mod postgres;
mod python_client;
mod readme;
mod relations;
mod repair;
mod scale;
mod search;
mod server;
mod tenants;
mod worker;
