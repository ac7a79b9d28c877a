//! A client of any OpenAI-compatible `POST /v1/chat/completions` endpoint (OpenAI, vLLM, the
//! llama.cpp server, Ollama's OpenAI endpoint, LiteLLM, …) for the derived-layer generator
//! and memory extraction.
//!
//! One [`ChatClient::complete`] call is one request, at temperature 0 by default, bounded by
//! `max_tokens` and a timeout over the whole exchange. Failures are classified like the
//! embedders' ([`ce_http`]'s table), plus what only a chat answer can be:
//!
//! | what happened | [`LlmError`] | retryable |
//! |---|---|---|
//! | HTTP 429, or an earlier 429's wait not over | `RateLimited` (with the wait) | yes |
//! | no answer within the timeout | `Timeout` | yes |
//! | HTTP 5xx, 408, connection failures | `Provider` | yes |
//! | other HTTP 4xx, a malformed URL | `Provider` | no |
//! | a refusal (`message.refusal`, `finish_reason: content_filter`) | `Refused` | no |
//! | an empty answer, one cut at `max_tokens`, malformed JSON | `InvalidAnswer` | no |
//!
//! Token counts come from the answer's `usage` (`prompt_tokens`, `completion_tokens`); an
//! endpoint that reports none gives [`ChatAnswer::usage`] `None`, never a guess.

use std::time::Duration;

use ce_core::{Classify, ErrorCode};
use ce_http::{Class, Failure, JsonClient, snippet};
use serde::{Deserialize, Serialize};

/// Largest answer body read.
const MAX_RESPONSE_BYTES: u64 = 16 << 20;

/// How to reach the endpoint and what to ask of the model.
#[derive(Clone)]
pub struct ChatConfig {
    /// Server root, e.g. `https://api.openai.com` or `http://localhost:11434` (a trailing
    /// `/v1` is accepted).
    pub base_url: String,
    /// Bearer token (read by the caller from the configured environment variable); `None`
    /// sends no `Authorization` header.
    pub api_key: Option<String>,
    /// Model name, e.g. `gpt-4o-mini`.
    pub model: String,
    /// Sampling temperature (0: as deterministic as the endpoint allows).
    pub temperature: f32,
    /// The longest answer, in tokens.
    pub max_tokens: u32,
}

impl std::fmt::Debug for ChatConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The input.
    User,
    /// An earlier answer (few-shot examples).
    Assistant,
}

/// One message of the conversation sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who says it.
    pub role: Role,
    /// What it says.
    pub content: String,
}

impl Message {
    /// A message of `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// Tokens of one call, as the endpoint reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens read.
    pub prompt_tokens: u64,
    /// Tokens written.
    pub completion_tokens: u64,
}

/// A usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAnswer {
    /// The answer's text, trimmed; never empty.
    pub content: String,
    /// The model the endpoint says answered.
    pub model: Option<String>,
    /// Token counts, when the endpoint reports them.
    pub usage: Option<Usage>,
}

/// Why a call gave no usable answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// No answer in time (retryable).
    #[error("chat completion timed out after {after:?}")]
    Timeout {
        /// The timeout that expired.
        after: Duration,
    },
    /// Rate-limited (retryable; wait `retry_after` when given).
    #[error("chat endpoint rate-limited the request{}: {message}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
    RateLimited {
        /// How long to wait.
        retry_after: Option<Duration>,
        /// The endpoint's message.
        message: String,
    },
    /// The endpoint failed: 5xx and transport errors are retryable, 4xx are not.
    #[error("chat endpoint error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Provider {
        /// HTTP status, if the endpoint answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// The model declined to answer (permanent for this input).
    #[error("the model refused: {0}")]
    Refused(String),
    /// The answer is unusable: empty, cut at `max_tokens`, malformed (permanent for this
    /// input).
    #[error("unusable chat answer: {0}")]
    InvalidAnswer(String),
    /// The configuration is unusable.
    #[error("invalid configuration {key}: {reason}")]
    Config {
        /// The configuration key.
        key: String,
        /// What is wrong, and how to fix it.
        reason: String,
    },
}

impl Classify for LlmError {
    fn code(&self) -> ErrorCode {
        match self {
            LlmError::RateLimited { .. } => ErrorCode::RateLimited,
            LlmError::Timeout { .. }
            | LlmError::Provider { .. }
            | LlmError::Refused(_)
            | LlmError::InvalidAnswer(_) => ErrorCode::Upstream,
            LlmError::Config { .. } => ErrorCode::InvalidConfig,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            LlmError::Timeout { .. } | LlmError::RateLimited { .. } => true,
            LlmError::Provider { retryable, .. } => *retryable,
            LlmError::Refused(_) | LlmError::InvalidAnswer(_) | LlmError::Config { .. } => false,
        }
    }
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: &'a [Message],
    temperature: f32,
    max_tokens: u32,
    stream: bool,
}

#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

/// The JSON body of an answer: `content` trimmed, without a Markdown code fence
/// (```` ```json … ``` ````) that models often wrap a JSON answer in.
pub fn json_body(content: &str) -> &str {
    let t = content.trim();
    t.strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|r| r.strip_suffix("```"))
        .unwrap_or(t)
        .trim()
}

/// A blocking client of one chat-completions endpoint, shared by its callers (its rate-limit
/// pause is shared too).
#[derive(Debug)]
pub struct ChatClient {
    client: JsonClient,
    config: ChatConfig,
}

impl ChatClient {
    /// Checks `config` (an `http(s)://` URL, a model name, `max_tokens` > 0); no request is
    /// made until the first call.
    pub fn new(config: ChatConfig) -> Result<Self, LlmError> {
        let bad = |key: &str, reason: String| LlmError::Config {
            key: key.into(),
            reason,
        };
        if !ce_http::is_http_url(&config.base_url) {
            return Err(bad(
                "base_url",
                format!("{:?} is not an http:// or https:// URL", config.base_url),
            ));
        }
        if config.model.trim().is_empty() {
            return Err(bad("model", "no model is named".into()));
        }
        if config.max_tokens == 0 {
            return Err(bad("max_tokens", "must be at least 1".into()));
        }
        if !(0.0..=2.0).contains(&config.temperature) {
            return Err(bad(
                "temperature",
                format!("{} is outside 0..=2", config.temperature),
            ));
        }
        let url = ce_http::v1_url(&config.base_url, "chat/completions");
        Ok(ChatClient {
            client: JsonClient::new(url, config.api_key.clone()),
            config,
        })
    }

    /// The full URL requests go to.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// The most completion tokens a request asks for.
    pub fn max_tokens(&self) -> u32 {
        self.config.max_tokens
    }

    /// The model named in requests.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// How long callers must still wait after a rate limit.
    pub fn paused_for(&self) -> Option<Duration> {
        self.client.paused_for()
    }

    /// Sends `messages` and returns the first choice's answer.
    pub fn complete(
        &self,
        messages: &[Message],
        timeout: Duration,
    ) -> Result<ChatAnswer, LlmError> {
        let body = serde_json::to_vec(&Request {
            model: &self.config.model,
            messages,
            temperature: self.config.temperature,
            max_tokens: self.config.max_tokens,
            stream: false,
        })
        .map_err(|e| LlmError::InvalidAnswer(format!("cannot encode the request: {e}")))?;
        let body = self
            .client
            .post(&body, timeout, MAX_RESPONSE_BYTES)
            .map_err(|f| self.failed(f))?;
        self.parse(&body)
    }

    fn parse(&self, body: &[u8]) -> Result<ChatAnswer, LlmError> {
        let resp: Response = serde_json::from_slice(body).map_err(|e| {
            LlmError::InvalidAnswer(format!(
                "{} answered with unexpected JSON ({e}): {}",
                self.url(),
                snippet(body)
            ))
        })?;
        let Some(choice) = resp.choices.into_iter().next() else {
            return Err(LlmError::InvalidAnswer("the answer has no choices".into()));
        };
        if let Some(r) = choice.message.refusal.filter(|r| !r.trim().is_empty()) {
            return Err(LlmError::Refused(r));
        }
        match choice.finish_reason.as_deref() {
            Some("content_filter") => {
                return Err(LlmError::Refused(
                    "the endpoint's content filter stopped the answer".into(),
                ));
            }
            Some("length") => {
                return Err(LlmError::InvalidAnswer(format!(
                    "the answer was cut at max_tokens = {}",
                    self.config.max_tokens
                )));
            }
            _ => {}
        }
        let content = choice.message.content.unwrap_or_default();
        let content = content.trim();
        if content.is_empty() {
            return Err(LlmError::InvalidAnswer("the answer is empty".into()));
        }
        Ok(ChatAnswer {
            content: content.to_owned(),
            model: resp.model,
            usage: resp.usage,
        })
    }

    fn failed(&self, f: Failure) -> LlmError {
        match f.class(self.client.url()) {
            Class::Timeout(after) => LlmError::Timeout { after },
            Class::RateLimited {
                retry_after,
                message,
            } => LlmError::RateLimited {
                retry_after,
                message,
            },
            Class::Provider {
                status,
                message,
                retryable,
            } => LlmError::Provider {
                status,
                message,
                retryable,
            },
        }
    }
}
