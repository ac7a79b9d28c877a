//! The `llm` generator against a loopback server speaking the chat-completions wire
//! protocol: prompts and limits sent, JSON answers parsed, usage counted, failures classified
//! (429 with Retry-After, 5xx, refusals, unusable answers).

use std::sync::Mutex;
use std::time::Duration;

use ce_core::Classify;
use ce_core::config::DeriveLlmConfig;
use ce_derive::{Budget, Child, DeriveError, DeriveInput, Generator, LlmGenerator};
use ce_testkit::http::{LoopbackServer, Reply};
use serde_json::{Value, json};

fn answer(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
    Reply::chat_completion("m", content, prompt_tokens, completion_tokens)
}

fn generator(server: &LoopbackServer) -> LlmGenerator {
    LlmGenerator::from_config(&DeriveLlmConfig {
        base_url: server.base_url(),
        model: "m".into(),
        api_key_env: "CE_TEST_NO_SUCH_KEY".into(),
        ..DeriveLlmConfig::default()
    })
    .expect("generator")
}

fn leaf(text: &str) -> DeriveInput {
    DeriveInput::Leaf {
        content: text.into(),
    }
}

#[test]
fn a_leaf_and_a_folder_are_derived_from_json_answers_with_their_usage() {
    let server = LoopbackServer::start(|req| {
        let system = req.body["messages"][0]["content"].as_str().unwrap_or("");
        if system.contains("one folder") {
            answer(
                r#"{"abstract": "Guides.", "overview": "- install\n- usage"}"#,
                40,
                9,
            )
        } else {
            answer(
                "```json\n{\"abstract\": \"How to install CE.\", \"overview\": \"- steps\"}\n```",
                120,
                15,
            )
        }
    });
    let g = generator(&server);
    assert_eq!(g.identity().key(), "llm:1001:m");
    let folder = DeriveInput::Container {
        content: String::new(),
        children: vec![Child {
            name: "install".into(),
            abstract_text: "How to install CE.".into(),
        }],
    };
    let out = g.derive(
        &[leaf("Run the script. Then start the server."), folder],
        Budget::default(),
        Duration::from_secs(10),
    );
    let leaf_out = out[0].clone().expect("leaf");
    assert_eq!(
        leaf_out.abstract_text.as_deref(),
        Some("How to install CE.")
    );
    assert_eq!((leaf_out.tokens_in, leaf_out.tokens_out), (120, 15));
    let folder_out = out[1].clone().expect("folder");
    assert_eq!(folder_out.overview.as_deref(), Some("- install\n- usage"));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let body = &reqs[0].body;
    assert_eq!(body["model"], "m");
    assert_eq!(body["temperature"], 0.0);
    assert_eq!(body["stream"], false);
    assert!(
        body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("at most 200 characters"))
    );
    assert_eq!(
        body["messages"][1]["content"],
        "Run the script. Then start the server."
    );
    assert!(
        reqs[1].body["messages"][1]["content"]
            .as_str()
            .is_some_and(|s| s.contains("- install: How to install CE."))
    );
    assert!(
        reqs[0].header("authorization").is_none(),
        "no key, no header"
    );
}

#[test]
fn over_long_text_is_cut_and_long_input_is_bounded() {
    let long = "word ".repeat(200);
    let reply = format!(r#"{{"abstract": "{long}", "overview": "ok"}}"#);
    let server = LoopbackServer::start(move |_| answer(&reply, 1, 1));
    let g = LlmGenerator::from_config(&DeriveLlmConfig {
        base_url: server.base_url(),
        model: "m".into(),
        max_input_chars: 1_000,
        ..DeriveLlmConfig::default()
    })
    .expect("generator");
    let input = leaf(&"A paragraph of text.\n\n".repeat(200));
    let d = g.derive(&[input], Budget::default(), Duration::from_secs(10))[0]
        .clone()
        .expect("ok");
    let l0 = d.abstract_text.expect("l0");
    assert!(l0.chars().count() <= 200 && l0.ends_with('…'), "{l0}");
    let sent = server.requests()[0].body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        sent.chars().count() < 1_100,
        "{} chars sent",
        sent.chars().count()
    );
    assert!(
        sent.contains("[The text was cut here"),
        "the prompt says the text was cut"
    );
}

#[test]
fn failures_are_classified_like_the_embedders() {
    let script: Mutex<Vec<Reply>> = Mutex::new(vec![
        Reply::error(429, "slow down").header("Retry-After", "1"),
        Reply::error(503, "overloaded"),
        Reply::error(400, "bad request"),
        Reply::json(
            200,
            &json!({"choices": [{"finish_reason": "stop",
                "message": {"role": "assistant", "content": null, "refusal": "I can't"}}]}),
        ),
        answer("Sure! Here is a summary of the document.", 5, 5),
        answer(r#"{"abstract": "a", "overview": "b"}"#, 1, 1),
    ]);
    let server = LoopbackServer::start(move |_| {
        let mut s = script.lock().expect("script");
        if s.is_empty() {
            Reply::error(500, "script exhausted")
        } else {
            s.remove(0)
        }
    });
    let g = generator(&server);
    let call = || {
        g.derive(
            &[leaf("text. more text.")],
            Budget::default(),
            Duration::from_secs(10),
        )
        .remove(0)
    };
    let e = call().expect_err("429");
    assert!(
        matches!(e, DeriveError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(1)),
        "{e:?}"
    );
    assert!(e.is_retryable());
    assert!(
        g.paused_for().is_some(),
        "a Retry-After pauses the generator"
    );
    // While paused, no request is sent.
    let paused = call().expect_err("paused");
    assert!(matches!(paused, DeriveError::RateLimited { .. }));
    assert_eq!(server.requests().len(), 1);
    std::thread::sleep(g.paused_for().unwrap_or_default());
    let kinds: Vec<(bool, String)> = (0..4)
        .map(|_| {
            let e = call().expect_err("scripted failure");
            (e.is_retryable(), format!("{e}"))
        })
        .collect();
    assert!(kinds[0].0, "5xx is retryable: {kinds:?}");
    for (retryable, message) in &kinds[1..] {
        assert!(!retryable, "{message}");
    }
    assert!(kinds[2].1.contains("refused"), "{kinds:?}");
    assert!(kinds[3].1.contains("expected {\"abstract\""), "{kinds:?}");
    assert!(call().is_ok(), "the endpoint recovers");
    let _: Value = server.requests()[0].body.clone();
}
