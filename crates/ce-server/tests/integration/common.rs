//! The fixture the in-process router tests share: an engine on a fresh data directory (index
//! workers off; [`TestApp::drain`] applies the outbox), the router with the configuration's
//! API keys, and a runtime to drive requests on.

use std::sync::Arc;

use axum::Router;
use ce_core::{Config, CtxUri};
use ce_server::http::{AppState, KeyRing, router};
use ce_server::status::DrainProgress;
use ce_server::{Engine, EngineOptions};
use ce_store::{LinkRequest, PutRequest};

/// Parses a test URI.
pub fn u(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

/// An engine, its router and a runtime.
pub struct TestApp {
    _dir: tempfile::TempDir,
    /// The engine.
    pub engine: Arc<Engine>,
    /// The router of every route.
    pub app: Router,
    /// The runtime requests run on.
    pub rt: tokio::runtime::Runtime,
}

impl TestApp {
    /// Opens an engine with `toml`; a `key_env` of the configuration named `admin.0` reads
    /// `admin.1`.
    pub fn open(toml: &str, admin: Option<(&str, &str)>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::from_toml(toml).expect("config");
        let keys = KeyRing::from_config(&config.server, |var| {
            admin
                .filter(|(name, _)| *name == var)
                .map(|(_, key)| key.to_owned())
        })
        .expect("keys");
        let options = EngineOptions {
            workers: 1,
            run_workers: false,
            role: "test".into(),
            consumers: Vec::new(),
        };
        let engine = Arc::new(Engine::open_with(dir.path(), config, options).expect("engine"));
        let state = AppState {
            engine: engine.clone(),
            metrics: None,
            keys: Arc::new(keys),
        };
        TestApp {
            _dir: dir,
            engine,
            app: router(state, 1 << 20),
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime"),
        }
    }

    /// Writes a node whose L0 is `text`, L1 `overview` (if any) and L2 `"{text} in detail"`.
    pub fn put(&self, uri: &str, text: &str, overview: Option<String>) {
        let req = PutRequest {
            abstract_text: Some(text.into()),
            overview,
            content: Some(format!("{text} in detail")),
            ..PutRequest::default()
        };
        self.engine.put(&u(uri), req).expect("put");
    }

    /// Links `from` → `to` (`references`).
    pub fn link(&self, from: &str, to: &str) {
        let req = LinkRequest {
            from: u(from),
            to: u(to),
            relation_type: "references".into(),
            weight: 1.0,
            reason: String::new(),
            trace_id: None,
        };
        self.engine.link(req).expect("link");
    }

    /// Applies every pending outbox delivery.
    pub fn drain(&self) {
        self.engine.drain(&|_: &DrainProgress| {}).expect("drain");
    }
}
