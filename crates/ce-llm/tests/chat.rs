//! The chat client against a loopback endpoint that speaks the chat-completions wire
//! protocol: request checks as the real API does them (route, bearer key, JSON body with
//! model and messages), answers with `usage`, 429 with `Retry-After`, 5xx, refusals, cut and
//! empty answers, slow answers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_core::{Classify, ErrorCode};
use ce_llm::{ChatClient, ChatConfig, LlmError, Message, Role, Usage};
use ce_testkit::http::{LoopbackServer, Recorded, Reply};
use serde_json::{Value, json};

const KEY: &str = "sk-test";

/// A chat endpoint whose next answers are scripted (default: an echo of the last message).
struct Endpoint {
    server: LoopbackServer,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

fn answer(content: &str, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model-2026",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null},
            "finish_reason": finish
        }],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    })
}

fn respond(req: &Recorded, script: &Mutex<VecDeque<Reply>>) -> Reply {
    if req.method != "POST" || req.path != "/v1/chat/completions" {
        return Reply::error(404, &format!("no route {} {}", req.method, req.path));
    }
    if req.header("authorization") != Some(&format!("Bearer {KEY}")) {
        return Reply::error(401, "Incorrect API key provided");
    }
    let messages = req.body.get("messages").and_then(Value::as_array);
    let model = req.body.get("model").and_then(Value::as_str);
    let (Some(messages), Some(_)) = (messages, model) else {
        return Reply::error(400, "'model' and 'messages' are required");
    };
    if let Some(reply) = script.lock().expect("script").pop_front() {
        return reply;
    }
    let last = messages
        .last()
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    Reply::json(200, &answer(&format!("echo: {last}"), "stop"))
}

impl Endpoint {
    fn start() -> Self {
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let s = Arc::clone(&script);
        Endpoint {
            server: LoopbackServer::start(move |req| respond(req, &s)),
            script,
        }
    }

    fn push(&self, reply: Reply) {
        self.script.lock().expect("script").push_back(reply);
    }

    fn client(&self, key: Option<&str>) -> ChatClient {
        ChatClient::new(ChatConfig {
            base_url: self.server.base_url(),
            api_key: key.map(str::to_owned),
            model: "test-model".into(),
            temperature: 0.0,
            max_tokens: 64,
        })
        .expect("client")
    }
}

fn ask(client: &ChatClient) -> Result<ce_llm::ChatAnswer, LlmError> {
    client.complete(
        &[
            Message::new(Role::System, "Summarise."),
            Message::new(Role::User, "a text"),
        ],
        Duration::from_secs(5),
    )
}

#[test]
fn an_answer_carries_its_text_and_token_counts_and_the_request_is_well_formed() {
    let e = Endpoint::start();
    let a = ask(&e.client(Some(KEY))).expect("answer");
    assert_eq!(a.content, "echo: a text");
    assert_eq!(a.model.as_deref(), Some("test-model-2026"));
    assert_eq!(
        a.usage,
        Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 5
        })
    );
    let r = &e.server.requests()[0];
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.body,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "Summarise."},
                {"role": "user", "content": "a text"}
            ],
            "temperature": 0.0,
            "max_tokens": 64,
            "stream": false
        })
    );
}

#[test]
fn a_rate_limit_pauses_every_caller_of_the_client_for_its_retry_after() {
    let e = Endpoint::start();
    let client = e.client(Some(KEY));
    e.push(Reply::error(429, "Rate limit reached").header("Retry-After", "1"));
    let err = ask(&client).expect_err("limited");
    assert!(
        matches!(&err, LlmError::RateLimited { retry_after: Some(d), message } if *d == Duration::from_secs(1) && message.contains("Rate limit")),
        "{err:?}"
    );
    assert_eq!(
        (err.code(), err.is_retryable()),
        (ErrorCode::RateLimited, true)
    );
    // During the wait no request is sent.
    let paused = ask(&client).expect_err("paused");
    assert!(matches!(paused, LlmError::RateLimited { .. }), "{paused:?}");
    assert_eq!(e.server.requests().len(), 1);
    assert!(client.paused_for().is_some());
    std::thread::sleep(Duration::from_millis(1100));
    ask(&client).expect("after the wait");
    assert_eq!(e.server.requests().len(), 2);
}

/// Whether an error is the expected one.
type Check = fn(&LlmError) -> bool;

#[test]
fn failures_are_classified() {
    let e = Endpoint::start();
    let client = e.client(Some(KEY));
    let cases: Vec<(Reply, Check, bool)> = vec![
        (
            Reply::error(503, "overloaded"),
            |e| {
                matches!(
                    e,
                    LlmError::Provider {
                        status: Some(503),
                        ..
                    }
                )
            },
            true,
        ),
        (
            Reply::error(400, "context length exceeded"),
            |e| matches!(e, LlmError::Provider { status: Some(400), message, .. } if message.contains("context length")),
            false,
        ),
        (
            Reply::json(
                200,
                &json!({"choices": [{"message": {"role": "assistant", "content": null, "refusal": "I can't help with that."}, "finish_reason": "stop"}]}),
            ),
            |e| matches!(e, LlmError::Refused(r) if r.contains("can't help")),
            false,
        ),
        (
            Reply::json(200, &answer("partial", "content_filter")),
            |e| matches!(e, LlmError::Refused(_)),
            false,
        ),
        (
            Reply::json(200, &answer("cut mid-sen", "length")),
            |e| matches!(e, LlmError::InvalidAnswer(m) if m.contains("max_tokens")),
            false,
        ),
        (
            Reply::json(200, &answer("   ", "stop")),
            |e| matches!(e, LlmError::InvalidAnswer(m) if m.contains("empty")),
            false,
        ),
        (
            Reply::json(200, &json!({"choices": []})),
            |e| matches!(e, LlmError::InvalidAnswer(m) if m.contains("no choices")),
            false,
        ),
        (
            Reply {
                status: 200,
                headers: Vec::new(),
                body: "{\"choices\": [oops".into(),
                delay: None,
            },
            |e| matches!(e, LlmError::InvalidAnswer(m) if m.contains("unexpected JSON")),
            false,
        ),
    ];
    for (reply, is, retryable) in cases {
        let shown = format!("{} {}", reply.status, reply.body);
        e.push(reply);
        let err = ask(&client).expect_err(&shown);
        assert!(is(&err), "{shown}: {err:?}");
        assert_eq!(err.is_retryable(), retryable, "{shown}: {err:?}");
    }
    // A wrong key is the endpoint's 401: permanent.
    let err = ask(&e.client(Some("sk-wrong"))).expect_err("401");
    assert!(
        matches!(
            &err,
            LlmError::Provider {
                status: Some(401),
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_slow_endpoint_times_out_and_answers_without_usage_report_none() {
    let e = Endpoint::start();
    let client = e.client(Some(KEY));
    e.push(Reply {
        delay: Some(Duration::from_millis(800)),
        ..Reply::json(200, &answer("late", "stop"))
    });
    let err = client
        .complete(&[Message::new(Role::User, "x")], Duration::from_millis(200))
        .expect_err("timeout");
    assert!(matches!(err, LlmError::Timeout { .. }), "{err:?}");
    assert!(err.is_retryable());

    let mut no_usage = answer("fine", "stop");
    no_usage.as_object_mut().expect("object").remove("usage");
    e.push(Reply::json(200, &no_usage));
    let a = ask(&client).expect("answer");
    assert_eq!((a.content.as_str(), a.usage), ("fine", None));
}

#[test]
fn bad_configuration_is_refused_before_any_request() {
    let ok = ChatConfig {
        base_url: "http://127.0.0.1:9".into(),
        api_key: Some("sk-secret".into()),
        model: "m".into(),
        temperature: 0.0,
        max_tokens: 10,
    };
    assert!(!format!("{ok:?}").contains("sk-secret"));
    for (cfg, key) in [
        (
            ChatConfig {
                base_url: "localhost:11434".into(),
                ..ok.clone()
            },
            "base_url",
        ),
        (
            ChatConfig {
                model: " ".into(),
                ..ok.clone()
            },
            "model",
        ),
        (
            ChatConfig {
                max_tokens: 0,
                ..ok.clone()
            },
            "max_tokens",
        ),
        (
            ChatConfig {
                temperature: 3.0,
                ..ok.clone()
            },
            "temperature",
        ),
    ] {
        let err = ChatClient::new(cfg).expect_err(key);
        assert!(
            matches!(&err, LlmError::Config { key: k, .. } if k == key),
            "{err:?}"
        );
        assert_eq!(err.code(), ErrorCode::InvalidConfig);
    }
    // Nothing listens on port 9: a retryable transport failure.
    let err = ask(&ChatClient::new(ok).expect("client")).expect_err("refused");
    assert!(
        matches!(
            &err,
            LlmError::Provider {
                status: None,
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
}
