//! Any OpenAI-compatible `POST /v1/embeddings` endpoint: OpenAI itself, Azure-style
//! gateways, Ollama, vLLM, Hugging Face TEI, LiteLLM, ….
//!
//! One [`Embedder::embed_texts`] call is one HTTP request (callers batch by
//! `index.embedding.batch_size`) through [`ce_http::JsonClient`]. Errors are classified for
//! the worker's retry policy (spec §8.4):
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

use std::time::Duration;

use ce_http::{Class, Failure, JsonClient, snippet};
use serde::{Deserialize, Serialize};

use crate::{EmbedError, Embedder, ModelIdentity};

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
    client: JsonClient,
    config: OpenAiConfig,
    identity: ModelIdentity,
}

impl std::fmt::Debug for OpenAiEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("url", &self.client.url())
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
    ce_http::v1_url(base_url, "embeddings")
}

impl OpenAiEmbedder {
    /// Creates a client; no request is made until the first [`Embedder::embed_texts`].
    ///
    /// Fails with [`EmbedError::Config`] when `base_url` is not an `http(s)://` URL or
    /// `expected_dimension` is 0, or `dimensions` disagrees with it.
    pub fn new(config: OpenAiConfig) -> Result<Self, EmbedError> {
        let base = config.base_url.trim();
        if !ce_http::is_http_url(base) {
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
        Ok(OpenAiEmbedder {
            client: JsonClient::new(embeddings_url(&config.base_url), config.api_key.clone()),
            identity: ModelIdentity {
                provider: PROVIDER.to_owned(),
                model: config.model.clone(),
                dimension: config.expected_dimension,
            },
            config,
        })
    }

    /// The full URL requests go to.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    fn parse(&self, body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let resp: Response = serde_json::from_slice(body).map_err(|e| {
            EmbedError::InvalidResponse(format!(
                "{} answered with unexpected JSON ({e}): {}",
                self.client.url(),
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
        let body = self
            .client
            .post(&body, timeout, MAX_RESPONSE_BYTES)
            .map_err(|f| self.failed(f))?;
        self.parse(&body, texts.len())
    }

    fn paused_for(&self) -> Option<Duration> {
        self.client.paused_for()
    }
}

impl OpenAiEmbedder {
    fn failed(&self, f: Failure) -> EmbedError {
        match f.class(self.client.url()) {
            Class::Timeout(after) => EmbedError::Timeout { after },
            Class::RateLimited {
                retry_after,
                message,
            } => EmbedError::RateLimited {
                retry_after,
                message,
            },
            Class::Provider {
                status,
                message,
                retryable,
            } => EmbedError::Provider {
                status,
                message,
                retryable,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_accepts_base_with_or_without_v1() {
        assert_eq!(
            embeddings_url("https://api.openai.com/v1/"),
            "https://api.openai.com/v1/embeddings"
        );
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
