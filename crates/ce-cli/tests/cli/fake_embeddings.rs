//! A loopback OpenAI-compatible `/v1/embeddings` endpoint (the real wire protocol over HTTP,
//! standing in for a paid remote API) with injectable failures:
//! - while `failing` is set, every request gets 400 (non-retryable: the delivery dies);
//! - a request with a text containing [`POISON`] always gets 400;
//! - a request with a text containing [`FLAKY`] gets 503 (retryable) the first
//!   [`FLAKY_FAILURES`] times that text is seen, then succeeds.
//!
//! A refused request refuses every text in it (as a real provider refuses a batch), so the
//! server records the last answer each text got: [`FakeEmbeddings::refused_last`] are the
//! texts whose last answer was a 400 — the nodes whose deliveries must end dead.
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
use std::time::Duration;

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
    last: Mutex<HashMap<String, u16>>,
    overlaps: AtomicUsize,
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

    /// Texts whose last answer was a refusal (400).
    pub fn refused_last(&self) -> HashSet<String> {
        let last = self.shared.last.lock().expect("lock");
        last.iter()
            .filter(|(_, s)| **s == 400)
            .map(|(t, _)| t.clone())
            .collect()
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
        let (status, answer) = answer(&texts, failing, state);
        {
            let code: u16 = status[..3].parse().unwrap_or(0);
            let mut last = state.last.lock().expect("lock");
            let mut in_flight = state.in_flight.lock().expect("lock");
            for t in &texts {
                last.insert(t.clone(), code);
                in_flight.remove(t);
            }
        }
        let text = answer.to_string();
        if write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        )
        .is_err()
        {
            return;
        }
    }
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
