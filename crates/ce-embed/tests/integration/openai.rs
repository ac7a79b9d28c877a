//! The OpenAI-compatible provider against the loopback server.

use std::time::{Duration, Instant};

use ce_core::Classify;
use ce_embed::{EmbedError, Embedder, HashEmbedder, OpenAiConfig, OpenAiEmbedder};
use serde_json::json;

use crate::server::{FakeOpenAi, Reply};

const DIM: usize = 16;
const KEY: &str = "sk-test-123";
const T: Duration = Duration::from_secs(5);

fn client(server: &FakeOpenAi, base_suffix: &str) -> OpenAiEmbedder {
    OpenAiEmbedder::new(OpenAiConfig {
        base_url: format!("{}{base_suffix}", server.base_url()),
        api_key: Some(KEY.to_owned()),
        model: "text-embedding-test".to_owned(),
        dimensions: None,
        expected_dimension: DIM,
    })
    .expect("client")
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

#[test]
fn embeds_in_input_order_with_auth_and_json_body() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    let texts = ["alpha beta", "", "用户偏好", "gamma"];
    for suffix in ["", "/", "/v1", "/v1/"] {
        let c = client(&server, suffix);
        assert_eq!(c.identity().key(), "openai:text-embedding-test:16");
        let out = c.embed_texts(&texts, T).expect("embed");
        assert_eq!(out.len(), texts.len());
        let hash = HashEmbedder::new(DIM);
        for (t, v) in texts.iter().zip(&out) {
            assert!((norm(v) - 1.0).abs() < 1e-5);
            // Empty text is sent as " ", which hashes like an empty text.
            let want = hash.embed_one(t);
            for (a, b) in v.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{t:?}");
            }
        }
    }
    let reqs = server.requests();
    assert_eq!(reqs.len(), 4);
    for r in &reqs {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/embeddings");
        assert_eq!(r.header("authorization"), Some("Bearer sk-test-123"));
        assert_eq!(
            r.body,
            json!({"model": "text-embedding-test", "input": ["alpha beta", " ", "用户偏好", "gamma"]})
        );
    }
    // No request for an empty batch.
    assert!(
        client(&server, "")
            .embed_texts(&[], T)
            .expect("empty")
            .is_empty()
    );
    assert_eq!(server.requests().len(), 4);
}

#[test]
fn dimensions_are_sent_when_configured_and_key_is_optional() {
    let server = FakeOpenAi::start(DIM, None);
    let c = OpenAiEmbedder::new(OpenAiConfig {
        base_url: server.base_url(),
        api_key: None,
        model: "m".to_owned(),
        dimensions: Some(8),
        expected_dimension: 8,
    })
    .expect("client");
    let out = c.embed_texts(&["x"], T).expect("embed");
    assert_eq!(out[0].len(), 8);
    let r = &server.requests()[0];
    assert_eq!(r.header("authorization"), None);
    assert_eq!(r.body["dimensions"], json!(8));
}

#[test]
fn rate_limit_carries_retry_after_and_pauses_the_client() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    server.push(Reply::Status {
        code: 429,
        headers: vec![("Retry-After", "1".to_owned())],
        body: json!({"error": {"message": "Rate limit reached for requests"}}).to_string(),
    });
    let c = client(&server, "");
    match c.embed_texts(&["a"], T) {
        Err(e @ EmbedError::RateLimited { .. }) => {
            assert!(e.is_retryable());
            let EmbedError::RateLimited {
                retry_after,
                message,
            } = e
            else {
                unreachable!()
            };
            assert_eq!(retry_after, Some(Duration::from_secs(1)));
            assert!(message.contains("Rate limit reached"), "{message}");
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // Until the wait is over the client sends nothing and says how long is left.
    assert!(c.paused_for().is_some_and(|d| d <= Duration::from_secs(1)));
    match c.embed_texts(&["a"], T) {
        Err(EmbedError::RateLimited {
            retry_after: Some(d),
            message,
        }) => {
            assert!(d <= Duration::from_secs(1), "{d:?}");
            assert!(message.contains("no request sent"), "{message}");
        }
        other => panic!("expected the paused client to refuse, got {other:?}"),
    }
    assert_eq!(server.requests().len(), 1, "no request during the pause");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.paused_for().is_some() {
        assert!(Instant::now() < deadline, "the pause never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The connection stays usable afterwards.
    assert_eq!(c.embed_texts(&["a"], T).expect("ok").len(), 1);
    assert_eq!(server.requests().len(), 2);

    // An HTTP-date is honoured as the time until it; a far one pauses for the cap at most.
    server.push(Reply::Status {
        code: 429,
        headers: vec![("Retry-After", "Fri, 01 Jan 2100 00:00:00 GMT".to_owned())],
        body: String::new(),
    });
    let c = client(&server, "");
    match c.embed_texts(&["a"], T) {
        Err(EmbedError::RateLimited {
            retry_after: Some(d),
            ..
        }) => assert!(d > Duration::from_secs(365 * 24 * 3600), "{d:?}"),
        other => panic!("expected RateLimited with a date, got {other:?}"),
    }
    assert!(
        c.paused_for()
            .is_some_and(|d| d <= ce_embed::pause::MAX_PAUSE)
    );
}

#[test]
fn a_rate_limit_pauses_every_caller_of_the_client() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    server.push(Reply::Status {
        code: 429,
        headers: vec![("Retry-After", "30".to_owned())],
        body: json!({"error": {"message": "slow down"}}).to_string(),
    });
    let c = std::sync::Arc::new(client(&server, ""));
    assert!(matches!(
        c.embed_texts(&["first"], T),
        Err(EmbedError::RateLimited { .. })
    ));
    // Four other callers (workers) share the client: none of them sends a request.
    let callers: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || c.embed_texts(&[&format!("text {i}")], T))
        })
        .collect();
    for h in callers {
        match h.join().expect("caller") {
            Err(EmbedError::RateLimited {
                retry_after: Some(d),
                ..
            }) => assert!(d <= Duration::from_secs(30), "{d:?}"),
            other => panic!("expected the shared pause, got {other:?}"),
        }
    }
    assert_eq!(server.requests().len(), 1, "one request per window");
}

#[test]
fn server_errors_are_retryable_client_errors_are_not() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    let c = client(&server, "");
    for (code, retryable) in [
        (500, true),
        (503, true),
        (408, true),
        (400, false),
        (404, false),
    ] {
        server.push(Reply::Status {
            code,
            headers: Vec::new(),
            body: json!({"error": {"message": format!("failure {code}")}}).to_string(),
        });
        match c.embed_texts(&["a"], T) {
            Err(e @ EmbedError::Provider { .. }) => {
                assert_eq!(e.is_retryable(), retryable, "{code}: {e}");
                let msg = e.to_string();
                assert!(msg.contains(&format!("HTTP {code}")), "{msg}");
                assert!(msg.contains(&format!("failure {code}")), "{msg}");
            }
            other => panic!("{code}: expected Provider, got {other:?}"),
        }
    }
    // A wrong key is the server's real 401.
    let bad = OpenAiEmbedder::new(OpenAiConfig {
        base_url: server.base_url(),
        api_key: Some("wrong".to_owned()),
        model: "m".to_owned(),
        dimensions: None,
        expected_dimension: DIM,
    })
    .expect("client");
    match bad.embed_texts(&["a"], T) {
        Err(
            e @ EmbedError::Provider {
                status: Some(401), ..
            },
        ) => {
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("Incorrect API key"), "{e}");
        }
        other => panic!("expected 401, got {other:?}"),
    }
}

#[test]
fn slow_answers_time_out() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    server.push(Reply::Slow(Duration::from_millis(1500)));
    let c = client(&server, "");
    let start = Instant::now();
    let err = c
        .embed_texts(&["a"], Duration::from_millis(200))
        .expect_err("timeout");
    assert!(matches!(err, EmbedError::Timeout { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(
        start.elapsed() < Duration::from_millis(1200),
        "{:?}",
        start.elapsed()
    );
    // The next call works (a fresh connection).
    assert_eq!(c.embed_texts(&["a"], T).expect("ok").len(), 1);
}

#[test]
fn connection_refused_is_retryable() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    }; // closed again: nothing listens there now
    let c = OpenAiEmbedder::new(OpenAiConfig {
        base_url: format!("http://{addr}"),
        api_key: None,
        model: "m".to_owned(),
        dimensions: None,
        expected_dimension: DIM,
    })
    .expect("client");
    match c.embed_texts(&["a"], T) {
        Err(e @ EmbedError::Provider { status: None, .. }) => assert!(e.is_retryable(), "{e}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[test]
fn malformed_answers_are_invalid_responses() {
    let server = FakeOpenAi::start(DIM, Some(KEY));
    let c = client(&server, "");
    for (reply, needle) in [
        (Reply::WrongDimension, "17-dimensional"),
        (Reply::WrongCount, "sent 2 texts, got 1"),
        (Reply::BadJson, "unexpected JSON"),
    ] {
        server.push(reply);
        match c.embed_texts(&["a", "b"], T) {
            Err(e @ EmbedError::InvalidResponse(_)) => {
                assert!(!e.is_retryable());
                assert!(e.to_string().contains(needle), "{e}");
            }
            other => panic!("expected InvalidResponse ({needle}), got {other:?}"),
        }
    }
}
