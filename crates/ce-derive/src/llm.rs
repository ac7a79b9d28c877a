//! The `llm` generator: any OpenAI-compatible `/v1/chat/completions` endpoint writes a node's
//! L0 / L1 (docs/derive.md).
//!
//! - Prompts are files with a version (`prompts/leaf.md`, `prompts/container.md` built in;
//!   `derive.llm.prompts_dir` replaces them). The first line is `version: N`; the identity
//!   is `llm:{leaf version}.{container version}:{model}` folded into one number, so a new
//!   prompt version or model re-derives on `ce reindex --consumer derive`.
//! - The model answers one JSON object `{"abstract": …, "overview": …}`. An answer that is
//!   not that object, a refusal, or an answer cut at `max_tokens` is permanent for the node
//!   (the consumer then keeps the extractive result); text over the length limit is cut at
//!   a word boundary, as the extractive generator cuts.
//! - Token counts are the endpoint's `usage`; an endpoint that reports none counts 0 — the
//!   budget then cannot hold, and status shows 0 tokens rather than a guess.
//! - Input longer than `derive.llm.max_input_chars` is cut at a block boundary and the
//!   prompt says it was cut.

use std::path::Path;
use std::time::{Duration, Instant};

use ce_core::config::DeriveLlmConfig;
use ce_llm::{ChatClient, ChatConfig, LlmError, Message, Role};
use serde::Deserialize;

use crate::extractive::truncate;
use crate::{Budget, DeriveError, DeriveInput, Derived, Generator, GeneratorIdentity};

const LEAF_PROMPT: &str = include_str!("../prompts/leaf.md");
const CONTAINER_PROMPT: &str = include_str!("../prompts/container.md");

/// A prompt file: its version and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The `version: N` of its first line.
    pub version: u32,
    /// The instructions (the rest of the file); `{l0_chars}` and `{l1_chars}` are replaced
    /// by the limits.
    pub text: String,
}

impl Prompt {
    /// Parses a prompt file; `name` names it in errors.
    pub fn parse(name: &str, file: &str) -> Result<Self, DeriveError> {
        let bad = |reason: String| DeriveError::Config {
            key: "derive.llm.prompts_dir".into(),
            reason: format!("{name}: {reason}"),
        };
        let (first, rest) = file.split_once('\n').unwrap_or((file, ""));
        let version = first
            .strip_prefix("version:")
            .ok_or_else(|| bad("the first line must be `version: N`".into()))?
            .trim()
            .parse::<u32>()
            .map_err(|e| bad(format!("bad version: {e}")))?;
        if rest.trim().is_empty() {
            return Err(bad("the prompt is empty".into()));
        }
        Ok(Prompt {
            version,
            text: rest.trim().to_owned(),
        })
    }

    fn render(&self, budget: Budget) -> String {
        self.text
            .replace("{l0_chars}", &budget.l0_chars.to_string())
            .replace("{l1_chars}", &budget.l1_chars.to_string())
    }
}

/// The leaf and container prompts.
#[derive(Debug, Clone)]
pub struct Prompts {
    /// For a leaf (a document).
    pub leaf: Prompt,
    /// For a container (a folder roll-up).
    pub container: Prompt,
}

impl Prompts {
    /// The built-in prompts.
    pub fn builtin() -> Self {
        Prompts {
            leaf: Prompt::parse("leaf.md", LEAF_PROMPT).expect("built-in prompt"),
            container: Prompt::parse("container.md", CONTAINER_PROMPT).expect("built-in prompt"),
        }
    }

    /// The prompts of `dir` (`leaf.md`, `container.md`).
    pub fn from_dir(dir: &Path) -> Result<Self, DeriveError> {
        let read = |name: &str| {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| DeriveError::Config {
                key: "derive.llm.prompts_dir".into(),
                reason: format!("cannot read {}: {e}", path.display()),
            })?;
            Prompt::parse(name, &text)
        };
        Ok(Prompts {
            leaf: read("leaf.md")?,
            container: read("container.md")?,
        })
    }

    /// The generator version both prompts make: leaf × 1000 + container.
    fn version(&self) -> u32 {
        self.leaf.version * 1000 + self.container.version
    }
}

/// The `llm` generator.
pub struct LlmGenerator {
    client: ChatClient,
    prompts: Prompts,
    identity: GeneratorIdentity,
    max_input_chars: usize,
}

impl std::fmt::Debug for LlmGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmGenerator")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl LlmGenerator {
    /// A generator on `[derive.llm]`, the key read from its `api_key_env`.
    pub fn from_config(c: &DeriveLlmConfig) -> Result<Self, DeriveError> {
        let prompts = match &c.prompts_dir {
            Some(dir) => Prompts::from_dir(Path::new(dir))?,
            None => Prompts::builtin(),
        };
        let api_key = std::env::var(&c.api_key_env).ok().filter(|k| !k.is_empty());
        let client = ChatClient::new(ChatConfig {
            base_url: c.base_url.clone(),
            api_key,
            model: c.model.clone(),
            temperature: c.temperature as f32,
            max_tokens: c.max_tokens,
        })
        .map_err(derive_error)?;
        Ok(Self::new(client, prompts, c.max_input_chars))
    }

    /// A generator on `client` with `prompts`.
    pub fn new(client: ChatClient, prompts: Prompts, max_input_chars: usize) -> Self {
        let identity = GeneratorIdentity {
            generator: "llm".into(),
            version: prompts.version(),
            model: Some(client.model().to_owned()),
        };
        LlmGenerator {
            client,
            prompts,
            identity,
            max_input_chars,
        }
    }

    fn messages(&self, input: &DeriveInput, budget: Budget) -> Vec<Message> {
        let (prompt, body) = match input {
            DeriveInput::Leaf { content } => (&self.prompts.leaf, self.bounded(content)),
            DeriveInput::Container { content, children } => {
                let mut body = String::new();
                if !content.trim().is_empty() {
                    body.push_str("Folder notes:\n");
                    body.push_str(content.trim());
                    body.push_str("\n\n");
                }
                body.push_str("Entries:\n");
                for c in children {
                    body.push_str("- ");
                    body.push_str(&c.name);
                    if !c.abstract_text.is_empty() {
                        body.push_str(": ");
                        body.push_str(&c.abstract_text);
                    }
                    body.push('\n');
                }
                (&self.prompts.container, self.bounded(&body))
            }
        };
        vec![
            Message::new(Role::System, prompt.render(budget)),
            Message::new(Role::User, body),
        ]
    }

    /// `text` within `max_input_chars`, cut at the last paragraph (or line) break before
    /// the limit, with a note saying so.
    fn bounded(&self, text: &str) -> String {
        let max = self.max_input_chars;
        if text.chars().count() <= max {
            return text.to_owned();
        }
        let end = text.char_indices().nth(max).map_or(text.len(), |(i, _)| i);
        let head = &text[..end];
        let cut = head
            .rfind("\n\n")
            .or_else(|| head.rfind('\n'))
            .filter(|&i| i * 2 >= end)
            .unwrap_or(end);
        format!(
            "{}\n\n[The text was cut here: {} of {} characters are shown.]",
            &text[..cut],
            text[..cut].chars().count(),
            text.chars().count()
        )
    }

    fn derive_one(
        &self,
        input: &DeriveInput,
        budget: Budget,
        timeout: Duration,
    ) -> Result<Derived, DeriveError> {
        let answer = self
            .client
            .complete(&self.messages(input, budget), timeout)
            .map_err(derive_error)?;
        let parsed = parse_answer(&answer.content)?;
        let (tokens_in, tokens_out) = answer
            .usage
            .map_or((0, 0), |u| (u.prompt_tokens, u.completion_tokens));
        let layer = |t: String, max: usize| {
            let t = t.trim();
            (!t.is_empty()).then(|| truncate(t, max))
        };
        Ok(Derived {
            abstract_text: layer(parsed.abstract_text, budget.l0_chars),
            overview: layer(parsed.overview, budget.l1_chars),
            tokens_in,
            tokens_out,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    #[serde(rename = "abstract")]
    abstract_text: String,
    overview: String,
}

/// The JSON object of an answer (a Markdown code fence around it is accepted).
fn parse_answer(content: &str) -> Result<Answer, DeriveError> {
    serde_json::from_str(ce_llm::json_body(content)).map_err(|e| {
        let shown: String = content.chars().take(200).collect();
        DeriveError::InvalidAnswer(format!(
            "expected {{\"abstract\": …, \"overview\": …}} ({e}); the model answered {shown:?}"
        ))
    })
}

fn derive_error(e: LlmError) -> DeriveError {
    match e {
        LlmError::Timeout { after } => DeriveError::Timeout { after },
        LlmError::RateLimited {
            retry_after,
            message,
        } => DeriveError::RateLimited {
            retry_after,
            message,
        },
        LlmError::Provider {
            status,
            message,
            retryable,
        } => DeriveError::Provider {
            status,
            message,
            retryable,
        },
        LlmError::Refused(m) => DeriveError::InvalidAnswer(format!("the model refused: {m}")),
        LlmError::InvalidAnswer(m) => DeriveError::InvalidAnswer(m),
        LlmError::Config { key, reason } => DeriveError::Config { key, reason },
    }
}

impl Generator for LlmGenerator {
    fn identity(&self) -> &GeneratorIdentity {
        &self.identity
    }

    /// One chat call per input, in order; the inputs left when `timeout` has passed fail
    /// with a timeout (retryable) without a call.
    fn derive(
        &self,
        inputs: &[DeriveInput],
        budget: Budget,
        timeout: Duration,
    ) -> Vec<Result<Derived, DeriveError>> {
        let started = Instant::now();
        inputs
            .iter()
            .map(|input| {
                let left = timeout.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(DeriveError::Timeout { after: timeout });
                }
                if let Some(wait) = self.client.paused_for() {
                    return Err(DeriveError::RateLimited {
                        retry_after: Some(wait),
                        message: "the endpoint asked to wait".into(),
                    });
                }
                self.derive_one(input, budget, left)
            })
            .collect()
    }

    /// The messages' text at about 4 characters per token and 1 per CJK character, plus a
    /// few per message for the chat framing; the answer at most its JSON of two layers
    /// within `budget`, capped by `max_tokens`.
    fn estimate(&self, input: &DeriveInput, budget: Budget) -> (u64, u64) {
        const PER_MESSAGE: u64 = 4;
        let tokens_in = self
            .messages(input, budget)
            .iter()
            .map(|m| PER_MESSAGE + approx_tokens(&m.content))
            .sum();
        let answer = (budget.l0_chars + budget.l1_chars) as u64 / 4 + 16;
        (tokens_in, answer.min(u64::from(self.client.max_tokens())))
    }

    fn paused_for(&self) -> Option<Duration> {
        self.client.paused_for()
    }
}

/// Roughly how many tokens a chat model's tokenizer makes of `text`: one per CJK
/// character, one per 4 other characters.
fn approx_tokens(text: &str) -> u64 {
    let (cjk, other) = text.chars().fold((0u64, 0u64), |(c, o), ch| {
        if ce_core::text::is_cjk(ch) {
            (c + 1, o)
        } else {
            (c, o + 1)
        }
    });
    cjk + other.div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_files_carry_a_version_and_bad_ones_are_config_errors() {
        let p = Prompts::builtin();
        assert_eq!((p.leaf.version, p.container.version), (1, 1));
        assert!(
            p.leaf
                .render(Budget::default())
                .contains("at most 200 characters")
        );
        for bad in ["no version\ntext", "version: x\ntext", "version: 2\n  \n"] {
            let e = Prompt::parse("leaf.md", bad).expect_err(bad);
            assert!(matches!(e, DeriveError::Config { .. }), "{e}");
        }
    }

    #[test]
    fn answers_are_one_json_object_and_anything_else_is_unusable() {
        let a =
            parse_answer("```json\n{\"abstract\": \"a\", \"overview\": \"o\"}\n```").expect("ok");
        assert_eq!((a.abstract_text.as_str(), a.overview.as_str()), ("a", "o"));
        for bad in ["Sure! Here is a summary.", "{\"abstract\": \"a\"}", "[]"] {
            assert!(
                matches!(parse_answer(bad), Err(DeriveError::InvalidAnswer(_))),
                "{bad}"
            );
        }
    }
}
