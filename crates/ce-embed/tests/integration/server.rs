//! A loopback OpenAI-compatible `/v1/embeddings` server for tests: real HTTP/1.1 over
//! `127.0.0.1:0` (request line, headers, `Content-Length` body, keep-alive), scripted per
//! request. Vectors come from the hash embedder, so a client's result can be checked exactly.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ce_embed::HashEmbedder;
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

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    dim: usize,
    api_key: Option<String>,
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    stop: AtomicBool,
}

/// The running server; stops when dropped.
pub struct FakeOpenAi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FakeOpenAi {
    /// Starts a server answering `dim`-dimensional vectors and requiring `Bearer {api_key}`
    /// when a key is given.
    pub fn start(dim: usize, api_key: Option<&str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            dim,
            api_key: api_key.map(str::to_owned),
            script: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let s = Arc::clone(&s);
                std::thread::spawn(move || serve_connection(stream, &s));
            }
        });
        FakeOpenAi {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues the reply for the next unscripted request (default: `Ok`).
    pub fn push(&self, reply: Reply) {
        self.shared.script.lock().expect("script").push_back(reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("requests").clone()
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Serves requests on one connection until the client closes it (keep-alive).
fn serve_connection(stream: TcpStream, s: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(req) = read_request(&mut reader) else {
            return;
        };
        let (code, headers, body) = respond(&req, s);
        s.requests.lock().expect("requests").push(req);
        let mut out = format!(
            "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            reason(code),
            body.len()
        );
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        if writer.write_all(out.as_bytes()).is_err()
            || writer.write_all(body.as_bytes()).is_err()
            || writer.flush().is_err()
        {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let version = parts.next()?;
    assert!(version.starts_with("HTTP/1."), "request line {line:?}");
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().expect("content-length"))
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn error(code: u16, message: &str) -> (u16, Vec<(&'static str, String)>, String) {
    (
        code,
        Vec::new(),
        json!({"error": {"message": message, "type": "invalid_request_error"}}).to_string(),
    )
}

/// Checks the request like the real API does, then follows the script.
fn respond(req: &Recorded, s: &Shared) -> (u16, Vec<(&'static str, String)>, String) {
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
        Reply::Ok => (200, Vec::new(), data(0, false)),
        Reply::Slow(d) => {
            std::thread::sleep(d);
            (200, Vec::new(), data(0, false))
        }
        Reply::WrongDimension => (200, Vec::new(), data(1, false)),
        Reply::WrongCount => (200, Vec::new(), data(0, true)),
        Reply::BadJson => (200, Vec::new(), "{\"data\": [oops".to_owned()),
        Reply::Status {
            code,
            headers,
            body,
        } => (code, headers, body),
    }
}
