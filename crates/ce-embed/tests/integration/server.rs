//! A loopback OpenAI-compatible `/v1/embeddings` server for tests (on
//! [`ce_testkit::http::LoopbackServer`]), scripted per request. Vectors come from the hash
//! embedder, so a client's result can be checked exactly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_embed::HashEmbedder;
pub use ce_testkit::http::Recorded;
use ce_testkit::http::{LoopbackServer, Reply as HttpReply};
use serde_json::{Value, json};

/// What the server answers to the next request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with the hash embedder's vectors, listed in reverse order (indices tell the order).
    Ok,
    /// Any status with extra headers and a body.
    Status {
        code: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Waits, then answers like `Ok`.
    Slow(Duration),
    /// 200 with vectors one component too long.
    WrongDimension,
    /// 200 with one vector fewer than texts.
    WrongCount,
    /// 200 with a body that is not JSON.
    BadJson,
}

struct Shared {
    dim: usize,
    api_key: Option<String>,
    script: Mutex<VecDeque<Reply>>,
}

/// The running server; stops when dropped.
pub struct FakeOpenAi {
    server: LoopbackServer,
    shared: Arc<Shared>,
}

impl FakeOpenAi {
    /// Starts a server answering `dim`-dimensional vectors and requiring `Bearer {api_key}`
    /// when a key is given.
    pub fn start(dim: usize, api_key: Option<&str>) -> Self {
        let shared = Arc::new(Shared {
            dim,
            api_key: api_key.map(str::to_owned),
            script: Mutex::new(VecDeque::new()),
        });
        let s = Arc::clone(&shared);
        let server = LoopbackServer::start(move |req| respond(req, &s));
        FakeOpenAi { server, shared }
    }

    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Queues the reply for the next unscripted request (default: `Ok`).
    pub fn push(&self, reply: Reply) {
        self.shared.script.lock().expect("script").push_back(reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.server.requests()
    }
}

fn error(code: u16, message: &str) -> HttpReply {
    HttpReply::error(code, message)
}

fn ok(body: String) -> HttpReply {
    HttpReply {
        status: 200,
        headers: Vec::new(),
        body,
        delay: None,
    }
}

/// Checks the request like the real API does, then follows the script.
fn respond(req: &Recorded, s: &Shared) -> HttpReply {
    if req.method != "POST" || req.path != "/v1/embeddings" {
        return error(404, &format!("no route {} {}", req.method, req.path));
    }
    if let Some(key) = &s.api_key
        && req.header("authorization") != Some(&format!("Bearer {key}"))
    {
        return error(401, "Incorrect API key provided");
    }
    if req.header("content-type") != Some("application/json") {
        return error(400, "content-type must be application/json");
    }
    let Some(model) = req.body.get("model").and_then(Value::as_str) else {
        return error(400, "'model' is required");
    };
    let Some(input) = req.body.get("input").and_then(Value::as_array) else {
        return error(400, "'input' must be an array");
    };
    let texts: Option<Vec<&str>> = input.iter().map(Value::as_str).collect();
    let Some(texts) = texts else {
        return error(400, "'input' must be strings");
    };
    if texts.iter().any(|t| t.is_empty()) {
        return error(400, "'$.input' is invalid: empty string");
    }
    let dim = match req.body.get("dimensions") {
        None => s.dim,
        Some(d) => d.as_u64().expect("dimensions is a number") as usize,
    };
    let reply = s
        .script
        .lock()
        .expect("script")
        .pop_front()
        .unwrap_or(Reply::Ok);
    let hash = HashEmbedder::new(dim);
    let data = |extra: usize, drop_last: bool| {
        let mut items: Vec<Value> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut v: Vec<f32> = hash.embed_one(t);
                // Not unit length on the wire: the client re-normalises.
                v.iter_mut().for_each(|x| *x *= 3.0);
                v.extend(std::iter::repeat_n(0.5, extra));
                json!({"object": "embedding", "index": i, "embedding": v})
            })
            .collect();
        if drop_last {
            items.pop();
        }
        items.reverse();
        json!({
            "object": "list",
            "data": items,
            "model": model,
            "usage": {"prompt_tokens": texts.len(), "total_tokens": texts.len()}
        })
        .to_string()
    };
    match reply {
        Reply::Ok => ok(data(0, false)),
        Reply::Slow(d) => HttpReply {
            delay: Some(d),
            ..ok(data(0, false))
        },
        Reply::WrongDimension => ok(data(1, false)),
        Reply::WrongCount => ok(data(0, true)),
        Reply::BadJson => ok("{\"data\": [oops".to_owned()),
        Reply::Status {
            code,
            headers,
            body,
        } => HttpReply {
            status: code,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            body,
            delay: None,
        },
    }
}
