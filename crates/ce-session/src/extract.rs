//! Memory extraction (docs/sessions.md, "Phase 2"): one chat call per window of an
//! archive's transcript (consecutive messages within the input limit, [`windows`]), answered
//! as JSON and validated against [`Answer`]'s schema. An answer that
//! fails validation is never stored in part: the call is repeated (with the reason, so the
//! model can correct itself) up to `attempts` times, then the extraction fails with the
//! reason ([`SessionError::InvalidExtraction`], not retryable).

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Duration;

use ce_llm::{ChatClient, LlmError, Message as ChatMessage, Role as ChatRole};
use serde::{Deserialize, Serialize};

use crate::error::SessionError;
use crate::layout::{check_category, check_memory_key};
use crate::merge::MemoryState;

const EXTRACT_PROMPT: &str = include_str!("../prompts/extract.md");

/// The longest fact, in characters.
pub const MAX_FACT_CHARS: usize = 300;
/// The longest context, in characters.
pub const MAX_CONTEXT_CHARS: usize = 1000;
/// The most memories one answer may hold.
pub const MAX_CANDIDATES: usize = 64;
/// The existing memories shown to the model.
pub const MAX_EXISTING_SHOWN: usize = 50;
/// The memories shown take at most this fraction (1/N) of the input limit; the window of
/// messages gets the rest, less [`LABELS`].
pub const SHOWN_SHARE: usize = 8;
/// Characters kept for the input's labels (the part line, "Conversation:").
const LABELS: usize = 300;

/// The characters of messages one window holds under `max_input_chars` (the input limit of
/// one call, `[derive.llm] max_input_chars`).
pub fn window_chars(max_input_chars: usize) -> usize {
    max_input_chars
        .saturating_sub(max_input_chars / SHOWN_SHARE + LABELS)
        .max(1)
}

/// Splits `blocks[from..]` (a transcript's messages, [`crate::transcript_blocks`]) into
/// windows of consecutive messages of at most `budget` characters, blank lines between
/// included: ranges of block indexes, in order. A message longer than `budget` is a window
/// alone (cut when sent). Deterministic: the same blocks and budget give the same windows,
/// so a resumed extraction continues where the saved one stopped.
pub fn windows(blocks: &[(&str, &str)], from: usize, budget: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = from;
    let mut used = 0;
    for (i, (_, block)) in blocks.iter().enumerate().skip(from) {
        let len = block.chars().count() + if i > start { 2 } else { 0 };
        if i > start && used + len > budget {
            out.push(start..i);
            start = i;
            used = block.chars().count();
        } else {
            used += len;
        }
    }
    if start < blocks.len() {
        out.push(start..blocks.len());
    }
    out
}

/// A memory shown to the model: one of the owner's, or one an earlier window of the same
/// archive extracted — so it can reuse the key and say whether the fact changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shown<'a> {
    /// Its category.
    pub category: &'a str,
    /// Its key.
    pub key: &'a str,
    /// Its fact.
    pub fact: &'a str,
}

impl<'a> From<&'a MemoryState> for Shown<'a> {
    fn from(m: &'a MemoryState) -> Self {
        Shown {
            category: &m.category,
            key: &m.key,
            fact: &m.fact,
        }
    }
}

impl<'a> From<&'a Candidate> for Shown<'a> {
    fn from(c: &'a Candidate) -> Self {
        Shown {
            category: &c.category,
            key: &c.key,
            fact: &c.fact,
        }
    }
}

/// Whether a candidate restates an existing memory or replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// It restates or refines the memory of its key.
    Same,
    /// The memory of its key is no longer true; this replaces it.
    Changed,
}

/// One memory the model proposes (validated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// One of [`crate::CATEGORIES`].
    pub category: String,
    /// Its slot within the category.
    pub key: String,
    /// The fact (the memory's L0).
    pub fact: String,
    /// When and why it came up (L1).
    #[serde(default)]
    pub context: String,
    /// The ids of the messages stating it.
    pub evidence: Vec<String>,
    /// 0..=1.
    pub confidence: f64,
    /// Against the memory of the same key, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// The answer's schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The memories.
    pub memories: Vec<Candidate>,
}

/// Parses and validates an answer; `message_ids` are those sent (evidence must cite them).
pub fn parse_answer(content: &str, message_ids: &[String]) -> Result<Vec<Candidate>, String> {
    let answer: Answer = serde_json::from_str(ce_llm::json_body(content))
        .map_err(|e| format!("not the JSON object {{\"memories\": [...]}} of the schema: {e}"))?;
    if answer.memories.len() > MAX_CANDIDATES {
        return Err(format!(
            "{} memories; at most {MAX_CANDIDATES} per archive",
            answer.memories.len()
        ));
    }
    let known: BTreeSet<&str> = message_ids.iter().map(String::as_str).collect();
    let mut out = Vec::with_capacity(answer.memories.len());
    for (i, mut c) in answer.memories.into_iter().enumerate() {
        let at = |why: String| format!("memories[{i}]: {why}");
        check_category(&c.category).map_err(|e| at(format!("category {e}")))?;
        check_memory_key(&c.key).map_err(|e| at(format!("key {e}")))?;
        c.fact = c.fact.trim().to_owned();
        c.context = c.context.trim().to_owned();
        if c.fact.is_empty() {
            return Err(at("fact is empty".into()));
        }
        if c.fact.chars().count() > MAX_FACT_CHARS {
            return Err(at(format!(
                "fact is longer than {MAX_FACT_CHARS} characters"
            )));
        }
        if c.context.chars().count() > MAX_CONTEXT_CHARS {
            return Err(at(format!(
                "context is longer than {MAX_CONTEXT_CHARS} characters"
            )));
        }
        if c.evidence.is_empty() {
            return Err(at("evidence cites no message".into()));
        }
        if let Some(bad) = c.evidence.iter().find(|e| !known.contains(e.as_str())) {
            return Err(at(format!(
                "evidence cites {bad:?}, which is not one of the messages sent"
            )));
        }
        if !(c.confidence.is_finite() && (0.0..=1.0).contains(&c.confidence)) {
            return Err(at(format!("confidence {} is outside 0..=1", c.confidence)));
        }
        c.evidence.dedup();
        out.push(c);
    }
    Ok(out)
}

/// What an extraction produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Extraction {
    /// The validated candidates, in the model's order.
    pub candidates: Vec<Candidate>,
    /// Chat calls made (more than one when an answer failed validation).
    pub calls: u32,
    /// Tokens read, as the endpoint reported them.
    pub tokens_in: u64,
    /// Tokens written.
    pub tokens_out: u64,
    /// The model that answered.
    pub model: String,
    /// The prompt version.
    pub prompt_version: u32,
}

/// Extracts memories with one chat endpoint.
#[derive(Debug)]
pub struct Extractor {
    client: ChatClient,
    timeout: Duration,
    attempts: u32,
    prompt_version: u32,
    prompt: String,
    max_input_chars: usize,
}

impl Extractor {
    /// An extractor on `client`; an answer failing validation is asked again up to
    /// `attempts` times in all (at least 1).
    pub fn new(
        client: ChatClient,
        timeout: Duration,
        attempts: u32,
        max_input_chars: usize,
    ) -> Self {
        let (first, rest) = EXTRACT_PROMPT
            .split_once('\n')
            .unwrap_or(("", EXTRACT_PROMPT));
        let prompt_version = first
            .strip_prefix("version:")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1);
        Extractor {
            client,
            timeout,
            attempts: attempts.max(1),
            prompt_version,
            prompt: rest.trim().to_owned(),
            max_input_chars,
        }
    }

    /// The model asked.
    pub fn model(&self) -> &str {
        self.client.model()
    }

    /// The user message of one call: the memories shown (most relevant first, within
    /// [`SHOWN_SHARE`] of the input limit), the part, and the window's messages.
    fn input(&self, window: &[(&str, &str)], part: (usize, usize), shown: &[Shown<'_>]) -> String {
        let mut body = String::new();
        if shown.is_empty() {
            body.push_str("Existing memories: none.\n\n");
        } else {
            body.push_str("Existing memories (category/key: fact):\n");
            let budget = self.max_input_chars / SHOWN_SHARE;
            let mut used = 0;
            for m in shown.iter().take(MAX_EXISTING_SHOWN) {
                let line = format!("- {}/{}: {}\n", m.category, m.key, m.fact);
                used += line.chars().count();
                if used > budget {
                    break;
                }
                body.push_str(&line);
            }
            body.push('\n');
        }
        let (n, of) = part;
        if of > 1 {
            body.push_str(&format!(
                "This is part {n} of {of} of a long conversation, sent in parts; the memories \
                 listed include those extracted from its earlier parts.\n\n"
            ));
        }
        body.push_str("Conversation:\n");
        let text: Vec<&str> = window.iter().map(|(_, b)| *b).collect();
        let text = text.join("\n\n");
        let max = window_chars(self.max_input_chars);
        match text.char_indices().nth(max) {
            // One message longer than a window (windows end at message boundaries).
            Some((end, _)) => {
                body.push_str(&text[..end]);
                body.push_str("\n\n[The message was cut here: it is longer than the input limit.]");
            }
            None => body.push_str(&text),
        }
        body
    }

    /// Extracts the memories of one window of an archive — `window` its messages' (id,
    /// block), `part` its number and the archive's count of windows — showing the model
    /// `shown` (the owner's current memories and the earlier windows' candidates, most
    /// relevant first). Evidence must cite the window's messages.
    pub fn extract(
        &self,
        window: &[(&str, &str)],
        part: (usize, usize),
        shown: &[Shown<'_>],
    ) -> Result<Extraction, SessionError> {
        let message_ids: Vec<String> = window.iter().map(|(id, _)| (*id).to_owned()).collect();
        let mut messages = vec![
            ChatMessage::new(ChatRole::System, self.prompt.clone()),
            ChatMessage::new(ChatRole::User, self.input(window, part, shown)),
        ];
        let mut out = Extraction {
            candidates: Vec::new(),
            calls: 0,
            tokens_in: 0,
            tokens_out: 0,
            model: self.client.model().to_owned(),
            prompt_version: self.prompt_version,
        };
        let mut last_reason = String::new();
        for _ in 0..self.attempts {
            out.calls += 1;
            let (content, reason) = match self.client.complete(&messages, self.timeout) {
                Ok(a) => {
                    if let Some(u) = a.usage {
                        out.tokens_in += u.prompt_tokens;
                        out.tokens_out += u.completion_tokens;
                    }
                    if let Some(m) = a.model {
                        out.model = m;
                    }
                    match parse_answer(&a.content, &message_ids) {
                        Ok(c) => {
                            out.candidates = c;
                            return Ok(out);
                        }
                        Err(reason) => (a.content, reason),
                    }
                }
                // An unusable answer (empty, cut, malformed) is asked again like an invalid
                // one; every other failure is the endpoint's, classified by the client.
                Err(LlmError::InvalidAnswer(reason)) => (String::new(), reason),
                Err(e) => return Err(SessionError::Llm(e)),
            };
            last_reason = reason;
            if !content.is_empty() {
                messages.push(ChatMessage::new(ChatRole::Assistant, content));
            }
            messages.push(ChatMessage::new(
                ChatRole::User,
                format!(
                    "That answer is invalid: {last_reason}. Answer again with only the JSON \
                     object of the schema."
                ),
            ));
        }
        Err(SessionError::InvalidExtraction {
            attempts: out.calls,
            reason: last_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Vec<String> {
        vec!["q1".into(), "a1".into()]
    }

    #[test]
    fn a_valid_answer_parses_with_its_fence_and_whitespace_trimmed() {
        let c = parse_answer(
            "```json\n{\"memories\": [{\"category\": \"preferences\", \"key\": \"editor\", \
             \"fact\": \" Uses Helix. \", \"evidence\": [\"q1\"], \"confidence\": 0.9}]}\n```",
            &ids(),
        )
        .expect("valid");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].fact, "Uses Helix.");
        assert_eq!(c[0].change, None);
        assert!(
            parse_answer("{\"memories\": []}", &ids())
                .expect("empty")
                .is_empty()
        );
    }

    #[test]
    fn windows_end_at_message_boundaries_and_a_resume_continues_the_same_split() {
        let texts: Vec<String> = [30, 50, 10, 200, 20, 20, 45]
            .iter()
            .map(|n| "x".repeat(*n))
            .collect();
        let blocks: Vec<(&str, &str)> = texts.iter().map(|t| ("id", t.as_str())).collect();
        // 30 + 2 + 50 = 82 fits 100, + 2 + 10 = 94 too; 200 is over alone; 20 + 2 + 20 + 2
        // + 45 = 89.
        let all = windows(&blocks, 0, 100);
        assert_eq!(all, [0..3, 3..4, 4..7]);
        for w in &all {
            let tail = windows(&blocks, w.end, 100);
            let expected: Vec<_> = all.iter().filter(|r| r.start >= w.end).cloned().collect();
            assert_eq!(tail, expected, "resumed at {}", w.end);
        }
        assert!(windows(&blocks, blocks.len(), 100).is_empty());
        assert_eq!(window_chars(24_000), 24_000 - 3_000 - LABELS);
        assert_eq!(window_chars(1_000), 575);
    }

    #[test]
    fn every_schema_violation_is_refused_with_its_reason() {
        let one = |fields: &str| format!("{{\"memories\": [{{{fields}}}]}}");
        let ok = "\"category\": \"preferences\", \"key\": \"editor\", \"fact\": \"f\", \
                  \"evidence\": [\"q1\"], \"confidence\": 0.5";
        assert!(parse_answer(&one(ok), &ids()).is_ok());
        let cases = [
            ("Sure, here you go", "not the JSON object"),
            ("{\"memories\": [], \"note\": 1}", "unknown field"),
            (&one(&ok.replace("preferences", "hobbies")), "category"),
            (&one(&ok.replace("editor", "Editor Name")), "key"),
            (&one(&ok.replace("\"f\"", "\"  \"")), "fact is empty"),
            (&one(&ok.replace("[\"q1\"]", "[]")), "cites no message"),
            (
                &one(&ok.replace("[\"q1\"]", "[\"zz\"]")),
                "not one of the messages sent",
            ),
            (&one(&ok.replace("0.5", "1.5")), "outside 0..=1"),
            (&one(&format!("{ok}, \"extra\": true")), "unknown field"),
            (&one(&ok.replace(", \"confidence\": 0.5", "")), "confidence"),
        ];
        for (answer, why) in cases {
            let e = parse_answer(answer, &ids()).expect_err(answer);
            assert!(e.contains(why), "{answer}: {e}");
        }
    }
}
