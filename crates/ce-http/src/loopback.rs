//! A loopback HTTP/1.1 server for tests that stand in for a paid remote API (an embeddings or
//! chat-completions endpoint): real HTTP over `127.0.0.1:0` — request line, headers, a
//! `Content-Length` body, keep-alive — each request answered by the test's handler, which
//! speaks the real API's wire protocol (status codes, `Retry-After`, JSON bodies).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `POST`, `GET`, ….
    pub method: String,
    /// The request target, e.g. `/v1/embeddings`.
    pub path: String,
    /// Headers in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
}

impl Recorded {
    /// A header's value (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the handler answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Extra headers (`Content-Length` is always sent, `Content-Type: application/json` unless
    /// one is given here).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
    /// Waits this long before answering (a slow provider).
    pub delay: Option<Duration>,
}

impl Reply {
    /// `status` with a JSON body.
    pub fn json(status: u16, body: &Value) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: body.to_string(),
            delay: None,
        }
    }

    /// The OpenAI error shape: `{"error": {"message": …, "type": …}}`.
    pub fn error(status: u16, message: &str) -> Self {
        Reply::json(
            status,
            &serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}}),
        )
    }

    /// A chat-completions answer (`POST /v1/chat/completions`, the OpenAI shape): one
    /// choice with the assistant's `content`, and the `usage` of the call.
    pub fn chat_completion(
        model: &str,
        content: &str,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) -> Self {
        Reply::json(
            200,
            &serde_json::json!({
                "id": "chatcmpl-loopback",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}
            }),
        )
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

type Handler = dyn Fn(&Recorded) -> Reply + Send + Sync;

struct Shared {
    handler: Box<Handler>,
    requests: Mutex<Vec<Recorded>>,
    stop: AtomicBool,
}

/// The running server; stops when dropped.
pub struct LoopbackServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl LoopbackServer {
    /// Starts a server answering every request with `handler`.
    pub fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            handler: Box::new(handler),
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
        LoopbackServer {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for LoopbackServer {
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
    // As HTTP servers do: without it, the last segment of each response waits for the client's
    // delayed ACK of the one before (Nagle's algorithm), up to 40 ms per request on Linux —
    // 22 ms a request on average in `ce bench ingest --embedder loopback`.
    let _ = stream.set_nodelay(true);
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
        let reply = (s.handler)(&req);
        s.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(req);
        if let Some(d) = reply.delay {
            std::thread::sleep(d);
        }
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Length: {}\r\n",
            reply.status,
            reason(reply.status),
            reply.body.len()
        );
        if !reply
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            out.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in &reply.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        // Head and body in one write: one segment for a small reply.
        out.push_str(&reply.body);
        if writer.write_all(out.as_bytes()).is_err() || writer.flush().is_err() {
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
