//! A loopback OpenAI-compatible `/v1/embeddings` endpoint (the real wire protocol over HTTP,
//! standing in for a paid remote API) with injectable failures:
//! - while `failing` is set, every request gets 400 (non-retryable: the delivery dies);
//! - a request with a text containing [`POISON`] always gets 400;
//! - a request with a text containing [`FLAKY`] gets 503 (retryable) the first
//!   [`FLAKY_FAILURES`] times that text is seen, then succeeds;
//! - after [`FakeEmbeddings::rate_limit_next`], the next request gets 429 with
//!   `Retry-After`, and so does every request that arrives before that wait is over (counted
//!   by [`FakeEmbeddings::requests_in_window`]: a client that honours the wait sends none).
//!
//! A refused request refuses every text in it, as a real provider refuses a batch; the
//! worker splits refused calls until the POISON texts are alone, so only the nodes whose
//! texts are POISON end dead. [`FakeEmbeddings::requests`] counts every request, and
//! [`FakeEmbeddings::embedded`] lists every text answered with a vector.
//!
//! Each connection is served on its own thread, so concurrent requests really overlap; the
//! server counts a text that arrives while another request carrying the same text is still
//! being answered ([`FakeEmbeddings::overlaps`]) — with one text per event, that is one event
//! applied by two workers at once.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Marks a text the provider always refuses.
pub const POISON: &str = "POISON";
/// Marks a text the provider fails transiently.
pub const FLAKY: &str = "FLAKY";
/// How many times a flaky text fails before it succeeds.
pub const FLAKY_FAILURES: usize = 2;
/// The vectors' dimension.
pub const DIM: usize = 16;

#[derive(Default)]
struct Shared {
    in_flight: Mutex<HashSet<String>>,
    seen: Mutex<HashMap<String, usize>>,
    embedded: Mutex<Vec<String>>,
    overlaps: AtomicUsize,
    requests: AtomicUsize,
    window: Mutex<Window>,
}

/// The rate-limit window (see [`FakeEmbeddings::rate_limit_next`]).
#[derive(Default)]
struct Window {
    /// The wait the next request is answered with.
    armed: Option<u64>,
    /// The end of the wait last asked for.
    until: Option<Instant>,
    /// Requests answered 429.
    refused: usize,
    /// Requests that arrived before the end of a wait already asked for.
    inside: usize,
}

/// The running endpoint.
pub struct FakeEmbeddings {
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// While set, every request is refused with 400.
    pub failing: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl FakeEmbeddings {
    /// Starts the endpoint; `failing` is its initial state.
    pub fn start(failing: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let failing = Arc::new(AtomicBool::new(failing));
        let shared = Arc::new(Shared::default());
        let (flag, state) = (failing.clone(), shared.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (flag, state) = (flag.clone(), state.clone());
                std::thread::spawn(move || serve(stream, &flag, &state));
            }
        });
        FakeEmbeddings {
            url,
            failing,
            shared,
        }
    }

    /// Texts that arrived while a request with the same text was in flight.
    pub fn overlaps(&self) -> usize {
        self.shared.overlaps.load(Ordering::SeqCst)
    }

    /// Requests received.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Answers the next request with 429 and `Retry-After: secs`, and every request that
    /// arrives before those seconds are over with 429 and the time left.
    pub fn rate_limit_next(&self, secs: u64) {
        self.shared.window.lock().expect("lock").armed = Some(secs);
    }

    /// Every text answered with a vector, in order of arrival (repeats included).
    pub fn embedded(&self) -> Vec<String> {
        self.shared.embedded.lock().expect("lock").clone()
    }

    /// Requests answered 429.
    pub fn rate_limited(&self) -> usize {
        self.shared.window.lock().expect("lock").refused
    }

    /// Requests that arrived while a `Retry-After` already sent was not over.
    pub fn requests_in_window(&self) -> usize {
        self.shared.window.lock().expect("lock").inside
    }

    /// The `[index.embedding]` section that points `ce` here, `batch_size` texts per request
    /// at most.
    pub fn embedding_config(&self, batch_size: u32) -> String {
        format!(
            "[index.embedding]\nprovider = \"openai\"\nmodel = \"fake\"\nbase_url = \"{}\"\n\
             dimensions = {DIM}\nbatch_size = {batch_size}\n",
            self.url
        )
    }
}

fn serve(mut stream: std::net::TcpStream, failing: &AtomicBool, state: &Shared) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    // Keep-alive: answer requests on this connection until the client closes it.
    loop {
        let mut len = 0usize;
        let mut started = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                if started {
                    break;
                }
                continue;
            }
            started = true;
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let texts: Vec<String> = req["input"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|t| t.as_str().unwrap_or("").to_owned())
            .collect();
        {
            let mut in_flight = state.in_flight.lock().expect("lock");
            for t in &texts {
                if !in_flight.insert(t.clone()) {
                    state.overlaps.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        // Hold the request open briefly so that a concurrent duplicate would overlap.
        std::thread::sleep(Duration::from_millis(1));
        state.requests.fetch_add(1, Ordering::SeqCst);
        let (status, answer, headers) = match rate_limit(state) {
            Some(secs) => (
                "429 Too Many Requests",
                json!({"error": {"message": "rate limit reached"}}),
                format!("Retry-After: {secs}\r\n"),
            ),
            None => {
                let (status, answer) = answer(&texts, failing, state);
                (status, answer, String::new())
            }
        };
        {
            let mut in_flight = state.in_flight.lock().expect("lock");
            for t in &texts {
                in_flight.remove(t);
            }
        }
        let text = answer.to_string();
        if write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{text}",
            text.len()
        )
        .is_err()
        {
            return;
        }
    }
}

/// The `Retry-After` seconds to answer this request with, if it is rate-limited.
fn rate_limit(state: &Shared) -> Option<u64> {
    let mut w = state.window.lock().expect("lock");
    let now = Instant::now();
    if let Some(until) = w.until.filter(|u| *u > now) {
        w.inside += 1;
        w.refused += 1;
        return Some((until - now).as_secs_f64().ceil() as u64);
    }
    let secs = w.armed.take()?;
    w.until = Some(now + Duration::from_secs(secs));
    w.refused += 1;
    Some(secs)
}

fn answer(texts: &[String], failing: &AtomicBool, state: &Shared) -> (&'static str, Value) {
    if failing.load(Ordering::SeqCst) || texts.iter().any(|t| t.contains(POISON)) {
        return ("400 Bad Request", json!({"error": {"message": "refused"}}));
    }
    let mut flaky = false;
    {
        let mut seen = state.seen.lock().expect("lock");
        for t in texts.iter().filter(|t| t.contains(FLAKY)) {
            let n = seen.entry(t.clone()).or_insert(0);
            *n += 1;
            flaky |= *n <= FLAKY_FAILURES;
        }
    }
    if flaky {
        return (
            "503 Service Unavailable",
            json!({"error": {"message": "try again"}}),
        );
    }
    state
        .embedded
        .lock()
        .expect("lock")
        .extend(texts.iter().cloned());
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"index": i, "embedding": vector(t)}))
        .collect();
    ("200 OK", json!({"data": data}))
}

/// A deterministic nonzero vector of `text`.
pub fn vector(text: &str) -> Vec<f32> {
    let h = text.bytes().fold(1469598103934665603u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(1099511628211)
    });
    (0..DIM).map(|j| ((h >> j) & 1) as f32 + 0.25).collect()
}
