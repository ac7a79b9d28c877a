//! Any OpenAI-compatible `POST /v1/embeddings` endpoint: OpenAI itself, Azure-style
//! gateways, Ollama, vLLM, Hugging Face TEI, LiteLLM, ….
//!
//! One [`Embedder::embed_texts`] call is one HTTP request (callers batch by
//! `index.embedding.batch_size`). Errors are classified for the worker's retry policy
//! (spec §8.4):
//!
//! | what happened | error | retryable |
//! |---|---|---|
//! | HTTP 429 | [`EmbedError::RateLimited`] with `Retry-After` (seconds or HTTP-date; also `retry-after-ms`) | yes |
//! | no answer within `timeout` | [`EmbedError::Timeout`] | yes |
//! | HTTP 5xx, 408, connection refused/reset, DNS, TLS | [`EmbedError::Provider`] | yes |
//! | other HTTP 4xx (bad key, unknown model, input too long) | [`EmbedError::Provider`] | no |
//! | bad JSON, wrong count, wrong dimension, non-finite or zero vectors | [`EmbedError::InvalidResponse`] | no |
//!
//! Vectors are re-normalised to unit length (providers' rounding, and not every model
//! normalises).
//!
//! A 429 with a wait (`Retry-After` / `retry-after-ms`) pauses the client itself, not only the
//! caller that got it ([`RateLimitPause`]): until the wait is over every call — from any
//! worker sharing this client — fails at once with [`EmbedError::RateLimited`] carrying the
//! time left, and no request is sent. [`Embedder::paused_for`] tells callers to hold back
//! their work meanwhile.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::{EmbedError, Embedder, ModelIdentity, RateLimitPause};

/// The identity's provider name.
pub const PROVIDER: &str = "openai";

/// Largest response body read (a 128-text batch of 3072-d vectors is about 8 MB of JSON).
const MAX_RESPONSE_BYTES: u64 = 128 << 20;

/// How to reach the endpoint.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Server root, e.g. `https://api.openai.com` or `http://localhost:11434`; a trailing `/v1`
    /// (and slashes) are accepted, so `https://api.openai.com/v1` works too.
    pub base_url: String,
    /// Bearer token; `None` sends no `Authorization` header (local servers). The caller reads
    /// it from the environment variable named by `index.embedding.api_key_env`.
    pub api_key: Option<String>,
    /// Model name sent in each request, e.g. `text-embedding-3-small`.
    pub model: String,
    /// Sent as the request's `dimensions` (shortened embeddings; OpenAI `text-embedding-3-*`
    /// only). `None` omits it.
    pub dimensions: Option<usize>,
    /// The dimension every returned vector must have (the identity's dimension).
    pub expected_dimension: usize,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("dimensions", &self.dimensions)
            .field("expected_dimension", &self.expected_dimension)
            .finish()
    }
}

/// The native dimension of well-known OpenAI embedding models (`None` for others).
pub fn known_dimension(model: &str) -> Option<usize> {
    match model {
        "text-embedding-3-small" | "text-embedding-ada-002" => Some(1536),
        "text-embedding-3-large" => Some(3072),
        _ => None,
    }
}

/// A blocking client of one OpenAI-compatible embeddings endpoint.
pub struct OpenAiEmbedder {
    agent: ureq::Agent,
    url: String,
    config: OpenAiConfig,
    identity: ModelIdentity,
    pause: RateLimitPause,
}

impl std::fmt::Debug for OpenAiEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("url", &self.url)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    input: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    embedding: Vec<f32>,
    index: usize,
}

/// `{base}/v1/embeddings`, whether or not `base` already ends in `/v1`.
pub fn embeddings_url(base_url: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/embeddings")
    } else {
        format!("{base}/v1/embeddings")
    }
}

impl OpenAiEmbedder {
    /// Creates a client; no request is made until the first [`Embedder::embed_texts`].
    ///
    /// Fails with [`EmbedError::Config`] when `base_url` is not an `http(s)://` URL or
    /// `expected_dimension` is 0, or `dimensions` disagrees with it.
    pub fn new(config: OpenAiConfig) -> Result<Self, EmbedError> {
        let base = config.base_url.trim();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(EmbedError::Config {
                key: "index.embedding.base_url".into(),
                reason: format!("{base:?} is not an http:// or https:// URL"),
            });
        }
        if config.expected_dimension == 0 {
            return Err(EmbedError::Config {
                key: "index.embedding.dimensions".into(),
                reason: "the expected vector dimension is 0".into(),
            });
        }
        if let Some(d) = config.dimensions
            && d != config.expected_dimension
        {
            return Err(EmbedError::Config {
                key: "index.embedding.dimensions".into(),
                reason: format!(
                    "requested {d} dimensions but expecting {}",
                    config.expected_dimension
                ),
            });
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("contextengine/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(OpenAiEmbedder {
            agent,
            url: embeddings_url(&config.base_url),
            identity: ModelIdentity {
                provider: PROVIDER.to_owned(),
                model: config.model.clone(),
                dimension: config.expected_dimension,
            },
            config,
            pause: RateLimitPause::default(),
        })
    }

    /// The full URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn transport_error(&self, e: ureq::Error, timeout: Duration) -> EmbedError {
        use ureq::Error as E;
        match e {
            E::Timeout(_) => EmbedError::Timeout { after: timeout },
            E::Io(ref io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                EmbedError::Timeout { after: timeout }
            }
            // Mistakes in the configuration: retrying cannot help.
            E::BadUri(_) | E::Http(_) | E::RequireHttpsOnly(_) | E::InvalidProxyUrl => {
                EmbedError::Provider {
                    status: None,
                    message: format!("cannot call {}: {e}", self.url),
                    retryable: false,
                }
            }
            // Connection refused/reset, DNS, TLS, protocol errors: transient as far as we can
            // tell.
            _ => EmbedError::Provider {
                status: None,
                message: format!("cannot reach {}: {e}", self.url),
                retryable: true,
            },
        }
    }

    fn parse(&self, body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let resp: Response = serde_json::from_slice(body).map_err(|e| {
            EmbedError::InvalidResponse(format!(
                "{} answered with unexpected JSON ({e}): {}",
                self.url,
                snippet(body)
            ))
        })?;
        if resp.data.len() != n {
            return Err(EmbedError::InvalidResponse(format!(
                "sent {n} texts, got {} embeddings",
                resp.data.len()
            )));
        }
        let dim = self.identity.dimension;
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
        for item in resp.data {
            if item.index >= n || out[item.index].is_some() {
                return Err(EmbedError::InvalidResponse(format!(
                    "embedding index {} is out of range or repeated (batch of {n})",
                    item.index
                )));
            }
            if item.embedding.len() != dim {
                return Err(EmbedError::InvalidResponse(format!(
                    "model {} returned a {}-dimensional vector, expected {dim} (check \
                     index.embedding.dimensions)",
                    self.config.model,
                    item.embedding.len()
                )));
            }
            let mut v = item.embedding;
            if !crate::normalize(&mut v) {
                return Err(EmbedError::InvalidResponse(format!(
                    "embedding {} is zero or not finite",
                    item.index
                )));
            }
            out[item.index] = Some(v);
        }
        // n items with distinct in-range indices fill every slot.
        Ok(out.into_iter().flatten().collect())
    }
}

impl Embedder for OpenAiEmbedder {
    fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    /// Sends one request with all `texts` (empty texts are sent as a single space, which
    /// OpenAI accepts where it rejects `""`); `timeout` bounds the whole exchange, connect
    /// to last body byte.
    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(left) = self.pause.remaining() {
            return Err(EmbedError::RateLimited {
                retry_after: Some(left),
                message: format!(
                    "{} asked to wait after an earlier rate limit: no request sent",
                    self.url
                ),
            });
        }
        let input: Vec<&str> = texts
            .iter()
            .map(|t| if t.is_empty() { " " } else { *t })
            .collect();
        let body = serde_json::to_vec(&Request {
            model: &self.config.model,
            input: &input,
            dimensions: self.config.dimensions,
        })
        .map_err(|e| EmbedError::InvalidResponse(format!("cannot encode request: {e}")))?;

        let mut req = self
            .agent
            .post(&self.url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Content-Type", "application/json")
            .header("Accept", "application/json");
        if let Some(key) = &self.config.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        let mut resp = req
            .send(&body[..])
            .map_err(|e| self.transport_error(e, timeout))?;
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers(), SystemTime::now());
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_vec()
            .map_err(|e| self.transport_error(e, timeout))?;

        match status {
            200..=299 => self.parse(&body, texts.len()),
            429 => {
                if let Some(wait) = retry_after {
                    self.pause.extend(wait);
                }
                Err(EmbedError::RateLimited {
                    retry_after,
                    message: error_message(&body),
                })
            }
            _ => Err(EmbedError::Provider {
                status: Some(status),
                message: format!("{} answered {status}: {}", self.url, error_message(&body)),
                retryable: status == 408 || status >= 500,
            }),
        }
    }

    fn paused_for(&self) -> Option<Duration> {
        self.pause.remaining()
    }
}

/// The wait a 429 or 503 asks for: `retry-after-ms` (milliseconds, OpenAI/Azure) or
/// `Retry-After` (delay-seconds or an HTTP-date, RFC 9110 §10.2.3). A date in the past is a
/// zero wait; an unparseable value is ignored.
pub fn retry_after(headers: &ureq::http::HeaderMap, now: SystemTime) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    parse_retry_after(get("retry-after")?, now)
}

/// Parses one `Retry-After` value (see [`retry_after`]).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The provider's error message (`{"error":{"message":…}}` or `{"error":"…"}`), else the
/// start of the body.
fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let err = v.get("error").unwrap_or(&v);
        if let Some(m) = err.get("message").and_then(|m| m.as_str()) {
            return m.to_owned();
        }
        if let Some(m) = err.as_str() {
            return m.to_owned();
        }
    }
    snippet(body)
}

fn snippet(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_accepts_base_with_or_without_v1() {
        for base in [
            "https://api.openai.com",
            "https://api.openai.com/",
            "https://api.openai.com/v1",
            "https://api.openai.com/v1/",
        ] {
            assert_eq!(
                embeddings_url(base),
                "https://api.openai.com/v1/embeddings",
                "{base}"
            );
        }
        assert_eq!(
            embeddings_url("http://gw.local/openai"),
            "http://gw.local/openai/v1/embeddings"
        );
    }

    #[test]
    fn retry_after_parses_seconds_and_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").expect("date");
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);

        let mut h = ureq::http::HeaderMap::new();
        h.insert("retry-after", ureq::http::HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert(
            "retry-after-ms",
            ureq::http::HeaderValue::from_static("250"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
    }

    #[test]
    fn error_messages_are_extracted() {
        assert_eq!(
            error_message(br#"{"error":{"message":"Incorrect API key","type":"x"}}"#),
            "Incorrect API key"
        );
        assert_eq!(
            error_message(br#"{"error":"model not found"}"#),
            "model not found"
        );
        assert_eq!(
            error_message(b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(error_message(b""), "(empty body)");
    }

    #[test]
    fn config_is_checked_and_key_redacted() {
        let cfg = OpenAiConfig {
            base_url: "api.openai.com".into(),
            api_key: Some("sk-secret".into()),
            model: "text-embedding-3-small".into(),
            dimensions: None,
            expected_dimension: 1536,
        };
        assert!(!format!("{cfg:?}").contains("sk-secret"));
        let err = OpenAiEmbedder::new(cfg.clone()).expect_err("no scheme");
        assert!(
            err.to_string().contains("index.embedding.base_url"),
            "{err}"
        );
        let err = OpenAiEmbedder::new(OpenAiConfig {
            base_url: "https://api.openai.com".into(),
            dimensions: Some(256),
            ..cfg
        })
        .expect_err("mismatch");
        assert!(
            err.to_string().contains("index.embedding.dimensions"),
            "{err}"
        );
    }
}
