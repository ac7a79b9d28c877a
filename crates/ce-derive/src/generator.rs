//! The generator trait and its inputs, outputs and errors.

use std::fmt;
use std::time::Duration;

use ce_core::projector::ProjectorConfig;
use ce_core::{Classify, ErrorCode, sha256_tagged};
use serde::{Deserialize, Serialize};

/// Which generator produced a derived layer; a change of any field re-derives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GeneratorIdentity {
    /// `extractive` or `llm`.
    pub generator: String,
    /// The generator's algorithm version (for `llm`: the prompt version).
    pub version: u32,
    /// The model, for generators that call one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl GeneratorIdentity {
    /// `generator:version[:model]`, the key stored with each derived layer.
    pub fn key(&self) -> String {
        match &self.model {
            Some(m) => format!("{}:{}:{m}", self.generator, self.version),
            None => format!("{}:{}", self.generator, self.version),
        }
    }
}

impl fmt::Display for GeneratorIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// The length limits of derived layers, in characters (Unicode scalar values): the same as
/// the projector's fallbacks, so a derived layer is never longer than the fallback it
/// replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Budget {
    /// The longest L0.
    pub l0_chars: usize,
    /// The longest L1.
    pub l1_chars: usize,
}

impl From<ProjectorConfig> for Budget {
    fn from(c: ProjectorConfig) -> Self {
        Budget {
            l0_chars: c.l0_fallback_chars,
            l1_chars: c.l1_fallback_chars,
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        ProjectorConfig::default().into()
    }
}

/// One child of a container, as the roll-up sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Child {
    /// Its last URI segment.
    pub name: String,
    /// Its L0 (user-written or derived).
    pub abstract_text: String,
}

/// What one node's derivation reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeriveInput {
    /// A leaf: its L2.
    Leaf {
        /// The content.
        content: String,
    },
    /// A container: its children's abstracts and its own L2, if any.
    Container {
        /// Its own content (often empty).
        content: String,
        /// Its children, in URI order.
        children: Vec<Child>,
    },
}

impl DeriveInput {
    /// The hash of everything a derivation of this input by `generator` within `budget`
    /// depends on: equal hashes give equal results, so a derivation whose stored input hash
    /// is current need not run again.
    ///
    /// The hash is of a canonical JSON text: every object's keys in byte order, as a
    /// `serde_json::Value` of `{generator, budget, input}` prints it — written directly, not
    /// through a `Value` (10,000 children made that a tree of 10,000 maps per roll-up).
    pub fn hash(&self, generator: &GeneratorIdentity, budget: Budget) -> String {
        let input = match self {
            DeriveInput::Leaf { content } => CanonicalInput::Leaf {
                content,
                kind: "leaf",
            },
            DeriveInput::Container { content, children } => CanonicalInput::Container {
                children: children
                    .iter()
                    .map(|c| CanonicalChild {
                        abstract_text: &c.abstract_text,
                        name: &c.name,
                    })
                    .collect(),
                content,
                kind: "container",
            },
        };
        let canonical = Canonical {
            budget,
            generator: generator.key(),
            input,
        };
        let text = serde_json::to_string(&canonical)
            .unwrap_or_else(|e| unreachable!("strings and integers always serialise: {e}"));
        sha256_tagged(&text)
    }
}

/// [`DeriveInput::hash`]'s text: fields declared in byte order of their names.
#[derive(Serialize)]
struct Canonical<'a> {
    budget: Budget,
    generator: String,
    input: CanonicalInput<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum CanonicalInput<'a> {
    Leaf {
        content: &'a str,
        kind: &'static str,
    },
    Container {
        children: Vec<CanonicalChild<'a>>,
        content: &'a str,
        kind: &'static str,
    },
}

#[derive(Serialize)]
struct CanonicalChild<'a> {
    abstract_text: &'a str,
    name: &'a str,
}

/// What a derivation produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Derived {
    /// The L0, or `None` when the input holds nothing to summarise.
    pub abstract_text: Option<String>,
    /// The L1, or `None` when the input holds nothing to summarise.
    pub overview: Option<String>,
    /// Model tokens read (0 for generators without a model).
    pub tokens_in: u64,
    /// Model tokens written (0 for generators without a model).
    pub tokens_out: u64,
}

/// Why a derivation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeriveError {
    /// The call did not finish in time (retryable).
    #[error("derivation timed out after {after:?}")]
    Timeout {
        /// The timeout that expired.
        after: Duration,
    },
    /// The provider rate-limited us (retryable; pause for `retry_after` when given).
    #[error("generator rate-limited{}: {message}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
    RateLimited {
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The provider failed: 5xx and transport errors are retryable, 4xx are not.
    #[error("generator provider error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Provider {
        /// HTTP status, if the provider answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// The answer is unusable for this node (empty, a refusal, malformed, over the
    /// length limit): permanent for this input.
    #[error("generator answer unusable: {0}")]
    InvalidAnswer(String),
    /// The generator's configuration is unusable: not retryable.
    #[error("invalid configuration {key}: {reason}")]
    Config {
        /// The configuration key, e.g. `derive.llm.base_url`.
        key: String,
        /// What is wrong, and how to fix it.
        reason: String,
    },
}

impl Classify for DeriveError {
    fn code(&self) -> ErrorCode {
        match self {
            DeriveError::RateLimited { .. } => ErrorCode::RateLimited,
            DeriveError::Timeout { .. }
            | DeriveError::Provider { .. }
            | DeriveError::InvalidAnswer(_) => ErrorCode::Upstream,
            DeriveError::Config { .. } => ErrorCode::InvalidConfig,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            DeriveError::Timeout { .. } | DeriveError::RateLimited { .. } => true,
            DeriveError::Provider { retryable, .. } => *retryable,
            DeriveError::InvalidAnswer(_) | DeriveError::Config { .. } => false,
        }
    }
}

/// A generator of L0 / L1 layers.
pub trait Generator: Send + Sync {
    /// Which generator this is (stored with every layer it derives).
    fn identity(&self) -> &GeneratorIdentity;

    /// Derives every input within `budget`, in one call where the generator can batch;
    /// one result per input, in order. A call that is not done after `timeout` fails its
    /// unfinished inputs with [`DeriveError::Timeout`].
    fn derive(
        &self,
        inputs: &[DeriveInput],
        budget: Budget,
        timeout: Duration,
    ) -> Vec<Result<Derived, DeriveError>>;

    /// The tokens one derivation of `input` would spend, `(in, out at most)`, estimated
    /// without calling anything (the dry run); a generator without a model spends none.
    fn estimate(&self, _input: &DeriveInput, _budget: Budget) -> (u64, u64) {
        (0, 0)
    }

    /// How long the generator's provider asked to be left alone (a rate limit's
    /// `Retry-After`); `None` when it may be called.
    fn paused_for(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_keys_and_input_hashes_change_with_what_a_result_depends_on() {
        let id = |model: Option<&str>| GeneratorIdentity {
            generator: "llm".into(),
            version: 2,
            model: model.map(str::to_owned),
        };
        assert_eq!(id(None).key(), "llm:2");
        assert_eq!(id(Some("m")).key(), "llm:2:m");
        let leaf = DeriveInput::Leaf {
            content: "a".into(),
        };
        let b = Budget::default();
        let h = leaf.hash(&id(None), b);
        assert_eq!(h, leaf.hash(&id(None), b), "deterministic");
        assert_ne!(h, leaf.hash(&id(Some("m")), b));
        assert_ne!(h, leaf.hash(&id(None), Budget { l0_chars: 10, ..b }));
        let other = DeriveInput::Leaf {
            content: "b".into(),
        };
        assert_ne!(h, other.hash(&id(None), b));
    }

    #[test]
    fn errors_are_classified() {
        let cases = [
            (
                DeriveError::Timeout {
                    after: Duration::from_secs(1),
                },
                ErrorCode::Upstream,
                true,
            ),
            (
                DeriveError::RateLimited {
                    retry_after: None,
                    message: "slow".into(),
                },
                ErrorCode::RateLimited,
                true,
            ),
            (
                DeriveError::Provider {
                    status: Some(503),
                    message: "down".into(),
                    retryable: true,
                },
                ErrorCode::Upstream,
                true,
            ),
            (
                DeriveError::InvalidAnswer("empty".into()),
                ErrorCode::Upstream,
                false,
            ),
            (
                DeriveError::Config {
                    key: "derive.llm.model".into(),
                    reason: "missing".into(),
                },
                ErrorCode::InvalidConfig,
                false,
            ),
        ];
        for (e, code, retryable) in cases {
            assert_eq!((e.code(), e.is_retryable()), (code, retryable), "{e}");
        }
    }

    proptest::proptest! {
        /// The hash is the one of the `serde_json::Value` text it was first defined by (stored
        /// input hashes stay valid): leaves and containers, text that JSON must escape.
        #[test]
        fn input_hashes_are_those_of_the_value_text(
            content in "[a-z \"\\\n\u{1}é中]{0,12}",
            children in proptest::option::of(proptest::collection::vec(
                ("[a-z0-9._-]{1,6}", "[a-z \"\\\t\u{7f}é]{0,10}"),
                0..6,
            )),
            model in proptest::option::of("[a-z]{1,4}"),
            l0 in 0_usize..1000,
            l1 in 0_usize..5000,
        ) {
            let input = match children {
                None => DeriveInput::Leaf { content },
                Some(children) => DeriveInput::Container {
                    content,
                    children: children
                        .into_iter()
                        .map(|(name, abstract_text)| Child { name, abstract_text })
                        .collect(),
                },
            };
            let generator = GeneratorIdentity { generator: "llm".into(), version: 3, model };
            let budget = Budget { l0_chars: l0, l1_chars: l1 };
            let value = serde_json::json!({
                "generator": generator.key(),
                "budget": budget,
                "input": input,
            });
            proptest::prop_assert_eq!(
                input.hash(&generator, budget),
                sha256_tagged(&value.to_string())
            );
        }
    }
}
