//! ce-embed integration tests (one binary; modules per provider).

mod build;
mod cache;
mod local;
mod openai;
mod server;
