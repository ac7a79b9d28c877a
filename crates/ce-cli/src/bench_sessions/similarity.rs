//! The `similarity` section of `ce bench sessions`: how the merge's "says the same"
//! (`ce_session::merge::Sameness`) separates measured pairs of facts, with the engine's
//! embedder (the local model by default) — the calibration of `sessions.semantic_threshold`
//! (docs/sessions.md, "Merge").
//!
//! - `generator`: every pair of wordings of one planted fact (paraphrases: they must be
//!   merged) and every pair of wordings of two facts of one template (a different name and
//!   thing: they must not be), for the bench's `--facts` facts;
//! - `hand_written`: real-world pairs, paraphrases and near misses (a changed value, another
//!   person, a number), each with what the rule decides.
//!
//! Reported per set: the cosine distribution, how many pairs pass the distinctive-terms gate,
//! and how many the rule merges; the pairs it decides wrongly are listed.

use std::collections::HashMap;
use std::time::Duration;

use ce_embed::Embedder;
use ce_session::merge::{
    FactVectors, Relation, Sameness, Semantic, SemanticSimilarity as _, anchors_agree, changes,
    similarity,
};
use serde_json::{Value, json};

use super::Fact;
use crate::bench::round;

/// Real-world pairs: (a, b, whether they state the same fact).
const HAND_WRITTEN: &[(&str, &str, bool)] = &[
    (
        "The user prefers dark mode in every editor.",
        "In all of their editors the user likes to use a dark theme.",
        true,
    ),
    (
        "The user is allergic to peanuts.",
        "The user has a peanut allergy.",
        true,
    ),
    (
        "The user works at Stripe as a backend engineer.",
        "The user is a backend engineer employed by Stripe.",
        true,
    ),
    (
        "The user's daughter Emma started school in September.",
        "Emma, the user's daughter, began school in September.",
        true,
    ),
    (
        "The user wants answers in British English.",
        "The user asks for replies written in British English.",
        true,
    ),
    (
        "The user's team deploys on Thursdays.",
        "Deployments of the user's team happen every Thursday.",
        true,
    ),
    (
        "The user runs PostgreSQL 16 in production.",
        "In production the user uses PostgreSQL version 16.",
        true,
    ),
    (
        "The user is vegetarian.",
        "The user does not eat meat.",
        true,
    ),
    (
        "The user lives in Lisbon.",
        "The user is based in Lisbon.",
        true,
    ),
    (
        "The user's cat is named Miso.",
        "Miso is the name of the user's cat.",
        true,
    ),
    (
        "The user prefers tabs over spaces for indentation.",
        "For indentation, the user uses tabs rather than spaces.",
        true,
    ),
    (
        "The user's manager is Priya Shah.",
        "Priya Shah manages the user.",
        true,
    ),
    (
        "The user's sister Maria lives in Porto.",
        "Maria, the user's sister, is based in Porto, Portugal.",
        true,
    ),
    (
        "用户的妹妹玛丽亚住在波尔图。",
        "玛丽亚是用户的妹妹，她住在波尔图。",
        true,
    ),
    (
        "The user prefers dark mode in every editor.",
        "The user prefers light mode in every editor.",
        false,
    ),
    (
        "The user is allergic to peanuts.",
        "The user is allergic to shellfish.",
        false,
    ),
    (
        "The user works at Stripe as a backend engineer.",
        "The user works at Stripe as a frontend engineer.",
        false,
    ),
    (
        "The user's daughter Emma started school in September.",
        "The user's son Liam started school in September.",
        false,
    ),
    (
        "The user drinks coffee every morning.",
        "The user drinks tea every morning.",
        false,
    ),
    (
        "The user's team deploys on Thursdays.",
        "The user's team deploys on Mondays.",
        false,
    ),
    (
        "The user runs PostgreSQL 16 in production.",
        "The user runs PostgreSQL 14 in production.",
        false,
    ),
    ("The user is vegetarian.", "The user is vegan.", false),
    (
        "The user lives in Lisbon.",
        "The user lived in Lisbon until 2020.",
        false,
    ),
    (
        "The user's cat is named Miso.",
        "The user's dog is named Miso.",
        false,
    ),
    (
        "The user's sister Maria lives in Porto.",
        "The user's brother Tom lives in Lyon.",
        false,
    ),
    (
        "The user has two children.",
        "The user has three children.",
        false,
    ),
    (
        "The user's flight to Tokyo leaves on Friday.",
        "The user's flight to Osaka leaves on Friday.",
        false,
    ),
    (
        "The user uses Python for data analysis.",
        "The user uses R for data analysis.",
        false,
    ),
    (
        "The user prefers tabs over spaces for indentation.",
        "The user prefers spaces over tabs for indentation.",
        false,
    ),
    (
        "用户的妹妹玛丽亚住在波尔图。",
        "用户的哥哥汤姆住在里昂。",
        false,
    ),
    ("用户喜欢喝咖啡。", "用户喜欢喝茶。", false),
];

/// Embeds `texts` (deduplicated) in batches of 32.
fn embed(embedder: &dyn Embedder, texts: &[&str]) -> anyhow::Result<FactVectors> {
    let mut unique: Vec<&str> = texts.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let mut out = HashMap::new();
    for chunk in unique.chunks(32) {
        let v = embedder.embed_texts(chunk, Duration::from_secs(120))?;
        for (t, v) in chunk.iter().zip(v) {
            out.insert((*t).to_owned(), v);
        }
    }
    Ok(FactVectors(out))
}

fn distribution(mut xs: Vec<f64>) -> Value {
    if xs.is_empty() {
        return Value::Null;
    }
    xs.sort_by(f64::total_cmp);
    let q = |p: f64| round(xs[((xs.len() - 1) as f64 * p).round() as usize], 3);
    json!({"n": xs.len(), "min": q(0.0), "p5": q(0.05), "p50": q(0.5), "p95": q(0.95),
           "p99": q(0.99), "max": q(1.0)})
}

fn relation_name(r: Relation) -> &'static str {
    match r {
        Relation::Same(_) => "same",
        Relation::Changed(_) => "changed",
        Relation::Unrelated => "unrelated",
    }
}

/// One set of pairs, judged.
fn judge(pairs: &[(String, String)], vectors: &FactVectors, rule: &Sameness<'_>) -> Value {
    let cosines: Vec<f64> = pairs
        .iter()
        .filter_map(|(a, b)| vectors.cosine(a, b))
        .collect();
    let gated: Vec<f64> = pairs
        .iter()
        .filter(|(a, b)| anchors_agree(a, b))
        .filter_map(|(a, b)| vectors.cosine(a, b))
        .collect();
    let overlaps: Vec<f64> = pairs.iter().map(|(a, b)| similarity(a, b)).collect();
    let mut relations = std::collections::BTreeMap::new();
    for (a, b) in pairs {
        *relations
            .entry(relation_name(rule.relation(a, b)))
            .or_insert(0u64) += 1;
    }
    json!({
        "pairs": pairs.len(),
        "cosine": distribution(cosines),
        "anchors_agree": gated.len(),
        "cosine_when_anchors_agree": distribution(gated),
        "term_overlap": distribution(overlaps),
        "relation": relations,
    })
}

/// The section (see the module docs), for the first `facts` planted facts.
pub(super) fn calibrate(
    embedder: &dyn Embedder,
    facts: usize,
    terms: f64,
    semantic: f64,
) -> anyhow::Result<Value> {
    let facts: Vec<Fact> = (0..facts).map(Fact::new).collect();
    let mut paraphrases = Vec::new();
    let mut different = Vec::new();
    let mut other_templates = Vec::new();
    for (i, f) in facts.iter().enumerate() {
        for k in 0..3 {
            for l in k + 1..3 {
                paraphrases.push((f.wording(k), f.wording(l)));
            }
        }
        for g in &facts[i + 1..] {
            if !std::ptr::eq(f.template, g.template) {
                other_templates.push((f.wording(i), g.wording(i + 1)));
                continue;
            }
            for k in 0..3 {
                for l in 0..3 {
                    different.push((f.wording(k), g.wording(l)));
                }
            }
        }
    }
    let mut texts: Vec<&str> = Vec::new();
    for (a, b) in paraphrases.iter().chain(&different).chain(&other_templates) {
        texts.push(a);
        texts.push(b);
    }
    for (a, b, _) in HAND_WRITTEN {
        texts.push(a);
        texts.push(b);
    }
    let vectors = embed(embedder, &texts)?;
    let rule = Sameness {
        terms,
        semantic: Some(Semantic {
            similarity: &vectors,
            threshold: semantic,
        }),
    };
    let hand: Vec<Value> = HAND_WRITTEN
        .iter()
        .map(|(a, b, same)| {
            let relation = rule.relation(a, b);
            // A different fact taken for a change is superseded (kept as history): not a
            // merge of two facts. A paraphrase taken for a change is not a duplicate either.
            let right = match relation {
                Relation::Same(_) => *same,
                Relation::Changed(_) => true,
                Relation::Unrelated => !*same,
            };
            json!({
                "a": a, "b": b, "same_fact": same,
                "cosine": vectors.cosine(a, b).map(|c| round(c, 3)),
                "term_overlap": round(similarity(a, b), 3),
                "anchors_agree": anchors_agree(a, b),
                "changes": changes(a, b),
                "relation": relation_name(relation),
                "right": right,
            })
        })
        .collect();
    let wrong = |same: bool| {
        hand.iter()
            .filter(|h| h["same_fact"] == same && h["right"] == false)
            .count()
    };
    Ok(json!({
        "model": embedder.identity().key(),
        "thresholds": {"terms": terms, "semantic": semantic},
        "generator": {
            "paraphrases": judge(&paraphrases, &vectors, &rule),
            "same_template_different_facts": judge(&different, &vectors, &rule),
            "different_templates": judge(&other_templates, &vectors, &rule),
        },
        "hand_written": {
            "pairs": hand.len(),
            "paraphrases_missed": wrong(true),
            "different_facts_merged": wrong(false),
            "each": hand,
        },
    }))
}
