//! The client side of OpenAI-compatible HTTP APIs, shared by every remote provider
//! (`/v1/embeddings` in ce-embed, `/v1/chat/completions` in ce-llm): one JSON `POST` with a
//! timeout over the whole exchange, and its failures classified for the callers' retry
//! policies (spec §8.4):
//!
//! | what happened | [`Failure`] | retryable |
//! |---|---|---|
//! | HTTP 429 | `RateLimited` with `Retry-After` (seconds or HTTP-date; also `retry-after-ms`) | yes |
//! | an earlier 429's wait is not over | `Paused` (no request sent) | yes |
//! | no answer within the timeout | `Timeout` | yes |
//! | HTTP 5xx, 408, connection refused/reset, DNS, TLS | `Status` / `Transport` | yes |
//! | other HTTP 4xx (bad key, unknown model, input too long), a malformed URL | `Status` / `Transport` | no |
//!
//! A 429 with a wait pauses the client itself, not only the caller that got it
//! ([`RateLimitPause`]): until the wait is over every call — from any thread sharing the
//! client — fails at once with [`Failure::Paused`] and no request is sent.
//!
//! [`loopback`] is the other side: a loopback server speaking these protocols, for the test
//! doubles of paid APIs and for benchmarks (`ce bench ingest`).

use std::time::{Duration, SystemTime};

pub mod loopback;
pub mod pause;

pub use pause::RateLimitPause;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// No answer within the timeout.
    Timeout {
        /// The timeout that expired.
        after: Duration,
    },
    /// An earlier rate limit's wait is not over; nothing was sent.
    Paused {
        /// The time left.
        left: Duration,
    },
    /// HTTP 429.
    RateLimited {
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// Another non-2xx answer.
    Status {
        /// The HTTP status.
        status: u16,
        /// The provider's message, with the URL.
        message: String,
        /// 408 and 5xx.
        retryable: bool,
    },
    /// No answer: the connection failed, or the request could not be made.
    Transport {
        /// What went wrong, with the URL.
        message: String,
        /// Whether a retry can help (not for a malformed URL or request).
        retryable: bool,
    },
}

/// A [`Failure`] as the three classes every provider error type has: a timeout, a rate
/// limit (with its wait), or a provider failure (with its HTTP status when it answered).
#[derive(Debug, Clone, PartialEq)]
pub enum Class {
    /// No answer in time.
    Timeout(Duration),
    /// Rate-limited: wait `retry_after` when given.
    RateLimited {
        /// The wait.
        retry_after: Option<Duration>,
        /// What the provider (or the pause) says.
        message: String,
    },
    /// Any other failure.
    Provider {
        /// The HTTP status, if the provider answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
        /// Whether a retry can help.
        retryable: bool,
    },
}

impl Failure {
    /// The failure's class; `url` names the endpoint in the message of a paused call.
    pub fn class(self, url: &str) -> Class {
        match self {
            Failure::Timeout { after } => Class::Timeout(after),
            Failure::Paused { left } => Class::RateLimited {
                retry_after: Some(left),
                message: format!(
                    "{url} asked to wait after an earlier rate limit: no request sent"
                ),
            },
            Failure::RateLimited {
                retry_after,
                message,
            } => Class::RateLimited {
                retry_after,
                message,
            },
            Failure::Status {
                status,
                message,
                retryable,
            } => Class::Provider {
                status: Some(status),
                message,
                retryable,
            },
            Failure::Transport { message, retryable } => Class::Provider {
                status: None,
                message,
                retryable,
            },
        }
    }
}

/// A blocking client of one endpoint: its URL, its bearer token and its rate-limit pause.
pub struct JsonClient {
    agent: ureq::Agent,
    url: String,
    api_key: Option<String>,
    pause: RateLimitPause,
}

impl std::fmt::Debug for JsonClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonClient")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl JsonClient {
    /// A client of `url` sending `Authorization: Bearer {api_key}` when a key is given.
    pub fn new(url: String, api_key: Option<String>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("contextengine/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        JsonClient {
            agent,
            url,
            api_key,
            pause: RateLimitPause::default(),
        }
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How long callers must still wait after a rate limit; `None` when they need not.
    pub fn paused_for(&self) -> Option<Duration> {
        self.pause.remaining()
    }

    /// Posts `body` (JSON) and returns the body of a 2xx answer, at most `max_bytes` long;
    /// `timeout` bounds the whole exchange, connect to last body byte.
    pub fn post(&self, body: &[u8], timeout: Duration, max_bytes: u64) -> Result<Vec<u8>, Failure> {
        if let Some(left) = self.pause.remaining() {
            return Err(Failure::Paused { left });
        }
        let mut req = self
            .agent
            .post(&self.url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Content-Type", "application/json")
            .header("Accept", "application/json");
        if let Some(key) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        let mut resp = req.send(body).map_err(|e| self.transport(e, timeout))?;
        let status = resp.status().as_u16();
        let wait = retry_after(resp.headers(), SystemTime::now());
        let body = resp
            .body_mut()
            .with_config()
            .limit(max_bytes)
            .read_to_vec()
            .map_err(|e| self.transport(e, timeout))?;
        match status {
            200..=299 => Ok(body),
            429 => {
                if let Some(w) = wait {
                    self.pause.extend(w);
                }
                Err(Failure::RateLimited {
                    retry_after: wait,
                    message: error_message(&body),
                })
            }
            _ => Err(Failure::Status {
                status,
                message: format!("{} answered {status}: {}", self.url, error_message(&body)),
                retryable: status == 408 || status >= 500,
            }),
        }
    }

    fn transport(&self, e: ureq::Error, timeout: Duration) -> Failure {
        use ureq::Error as E;
        match e {
            E::Timeout(_) => Failure::Timeout { after: timeout },
            E::Io(ref io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                Failure::Timeout { after: timeout }
            }
            // Mistakes in the configuration: retrying cannot help.
            E::BadUri(_) | E::Http(_) | E::RequireHttpsOnly(_) | E::InvalidProxyUrl => {
                Failure::Transport {
                    message: format!("cannot call {}: {e}", self.url),
                    retryable: false,
                }
            }
            // Connection refused/reset, DNS, TLS, protocol errors: transient as far as we can
            // tell.
            _ => Failure::Transport {
                message: format!("cannot reach {}: {e}", self.url),
                retryable: true,
            },
        }
    }
}

/// `{base}/v1/{path}`, whether or not `base` already ends in `/v1`.
pub fn v1_url(base_url: &str, path: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    let path = path.trim_start_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/{path}")
    } else {
        format!("{base}/v1/{path}")
    }
}

/// Whether `url` is an `http://` or `https://` URL.
pub fn is_http_url(url: &str) -> bool {
    let u = url.trim();
    u.starts_with("http://") || u.starts_with("https://")
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
pub fn error_message(body: &[u8]) -> String {
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

/// The start of a body (300 characters at most), for error messages.
pub fn snippet(body: &[u8]) -> String {
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

    fn page(status: u16, content_type: &str, body: &str, delay_ms: u64) -> loopback::Reply {
        loopback::Reply {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
            delay: (delay_ms > 0).then(|| Duration::from_millis(delay_ms)),
        }
    }

    fn text_only(ct: Option<&str>) -> bool {
        ct.is_some_and(|c| c.starts_with("text/"))
    }

    #[test]
    fn get_reads_a_page_within_its_limits_and_classifies_every_refusal() {
        let server = loopback::LoopbackServer::start(|r| match r.path.as_str() {
            "/page" => page(200, "text/html", "<p>hello</p>", 0),
            "/big" => page(200, "text/plain", &"x".repeat(2048), 0),
            "/png" => page(200, "image/png", "binary", 0),
            "/slow" => page(200, "text/plain", "late", 1500),
            "/down" => page(503, "text/plain", "maintenance", 0),
            _ => page(404, "text/plain", "no such page", 0),
        });
        let url = |p: &str| format!("{}{p}", server.base_url());
        let t = Duration::from_secs(5);
        let ok = get(&url("/page"), t, 1024, &text_only).expect("page");
        assert_eq!(ok.body, b"<p>hello</p>");
        assert_eq!(ok.content_type.as_deref(), Some("text/html"));
        assert!(ok.url.ends_with("/page"), "{}", ok.url);
        assert_eq!(
            get(&url("/big"), t, 1024, &text_only),
            Err(GetError::TooLarge { max_bytes: 1024 })
        );
        assert_eq!(
            get(&url("/png"), t, 1024, &text_only),
            Err(GetError::ContentType {
                content_type: "image/png".into()
            })
        );
        match get(&url("/slow"), Duration::from_millis(300), 1024, &text_only) {
            Err(GetError::Failure(Failure::Timeout { .. })) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        match get(&url("/down"), t, 1024, &text_only) {
            Err(GetError::Failure(Failure::Status {
                status: 503,
                retryable: true,
                ..
            })) => {}
            other => panic!("expected a retryable 503, got {other:?}"),
        }
        match get(&url("/missing"), t, 1024, &text_only) {
            Err(GetError::Failure(Failure::Status {
                status: 404,
                retryable: false,
                message,
            })) => assert!(message.contains("no such page"), "{message}"),
            other => panic!("expected a permanent 404, got {other:?}"),
        }
    }

    #[test]
    fn urls_accept_a_base_with_or_without_v1() {
        for base in [
            "https://api.openai.com",
            "https://api.openai.com/",
            "https://api.openai.com/v1",
            "https://api.openai.com/v1/",
        ] {
            assert_eq!(
                v1_url(base, "embeddings"),
                "https://api.openai.com/v1/embeddings",
                "{base}"
            );
        }
        assert_eq!(
            v1_url("http://gw.local/openai", "/chat/completions"),
            "http://gw.local/openai/v1/chat/completions"
        );
        assert!(is_http_url(" https://x") && is_http_url("http://x"));
        assert!(!is_http_url("api.openai.com"));
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
    fn the_key_is_redacted() {
        let c = JsonClient::new("http://x/v1/embeddings".into(), Some("sk-secret".into()));
        assert!(!format!("{c:?}").contains("sk-secret"));
    }
}

/// A document fetched with [`get`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    /// The URL it was finally read from (after redirects).
    pub url: String,
    /// Its `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// Why a [`get`] failed.
#[derive(Debug, Clone, PartialEq)]
pub enum GetError {
    /// The exchange failed (as for the JSON clients).
    Failure(Failure),
    /// The body is longer than the limit (declared or as read); not retryable.
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// The content type is not one `accept` allows; not retryable.
    ContentType {
        /// The type the server declared.
        content_type: String,
    },
}

/// Gets `url` (HTTP or HTTPS, redirects followed): its body, at most `max_bytes` long, when
/// the answer is 2xx and `accept` allows its content type (a missing one is passed as
/// `None`); `timeout` bounds the whole exchange. A declared length over the limit is refused
/// before the body is read.
pub fn get(
    url: &str,
    timeout: Duration,
    max_bytes: u64,
    accept: &dyn Fn(Option<&str>) -> bool,
) -> Result<Fetched, GetError> {
    let client = JsonClient::new(url.to_owned(), None);
    let resp = client
        .agent
        .get(url)
        .config()
        .timeout_global(Some(timeout))
        .build()
        .call()
        .map_err(|e| GetError::Failure(client.transport(e, timeout)));
    let mut resp = resp?;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let length = header("content-length").and_then(|v| v.trim().parse::<u64>().ok());
    let final_url = ureq::ResponseExt::get_uri(&resp).to_string();
    if !(200..=299).contains(&status) {
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_vec()
            .unwrap_or_default();
        return Err(GetError::Failure(if status == 429 {
            Failure::RateLimited {
                retry_after: retry_after(resp.headers(), SystemTime::now()),
                message: format!("{url} answered 429: {}", snippet(&body)),
            }
        } else {
            Failure::Status {
                status,
                message: format!("{url} answered {status}: {}", snippet(&body)),
                retryable: status == 408 || status >= 500,
            }
        }));
    }
    if !accept(content_type.as_deref()) {
        return Err(GetError::ContentType {
            content_type: content_type.unwrap_or_default(),
        });
    }
    if length.is_some_and(|n| n > max_bytes) {
        return Err(GetError::TooLarge { max_bytes });
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(max_bytes.saturating_add(1))
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => GetError::TooLarge { max_bytes },
            e => GetError::Failure(client.transport(e, timeout)),
        })?;
    if body.len() as u64 > max_bytes {
        return Err(GetError::TooLarge { max_bytes });
    }
    Ok(Fetched {
        url: final_url,
        content_type,
        body,
    })
}
