//! A scripted memory extractor behind the loopback chat-completions server: it reads the
//! conversation a session commit sends (docs/sessions.md, "Phase 2") and answers the
//! extraction schema from what the conversation says, citing the messages that say it — the
//! stand-in for a paid LLM in the session tests of `ce-server` (in process) and `ce-cli`
//! (through the binary).

use serde_json::json;

use crate::http::{Recorded, Reply};

/// The model name the scripted answers carry.
pub const MODEL: &str = "scripted";

/// A chat-completions answer whose message is `content` (100 tokens in, 20 out).
pub fn answer(content: &str) -> Reply {
    Reply::chat_completion(MODEL, content, 100, 20)
}

/// The user part of an extraction request: the memories shown, then the conversation.
pub fn request_text(r: &Recorded) -> String {
    r.body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// The conversation of an extraction request (after its `Conversation:` label).
pub fn conversation(r: &Recorded) -> String {
    let text = request_text(r);
    text.split_once("Conversation:")
        .map_or(text.as_str(), |(_, c)| c)
        .to_owned()
}

/// The id of the first message of `conv` that mentions `needle` (empty when none does).
pub fn id_of(conv: &str, needle: &str) -> String {
    conv.split("\n\n")
        .find(|b| b.contains(needle))
        .and_then(|b| b.trim_start().strip_prefix('[')?.split_once(']'))
        .map(|(id, _)| id.to_owned())
        .unwrap_or_default()
}

/// Extracts what the conversation states: the editor (Helix), the home city (Lyon) and a
/// switch of editor ("switched to Zed", a change of the editor memory).
pub fn editor_and_city(r: &Recorded) -> Reply {
    let conv = conversation(r);
    let mut memories = Vec::new();
    if conv.contains("Helix") {
        memories.push(json!({"category": "preferences", "key": "editor",
            "fact": "The user writes code in the Helix editor",
            "evidence": [id_of(&conv, "Helix")], "confidence": 0.9, "change": "same"}));
    }
    if conv.contains("Lyon") {
        memories.push(json!({"category": "profile", "key": "home_city",
            "fact": "The user lives in Lyon", "context": "mentioned while planning a trip",
            "evidence": [id_of(&conv, "Lyon")], "confidence": 0.8}));
    }
    if conv.contains("switched to Zed") {
        memories.push(json!({"category": "preferences", "key": "editor",
            "fact": "The user writes code in the Zed editor",
            "evidence": [id_of(&conv, "switched to Zed")], "confidence": 0.9,
            "change": "changed"}));
    }
    answer(&json!({ "memories": memories }).to_string())
}
