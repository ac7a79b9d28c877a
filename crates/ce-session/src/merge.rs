//! The merge rule (docs/sessions.md, "Merge"): every extracted candidate is compared with
//! the owner's memories as the source of truth holds them — including those written by
//! earlier candidates of the same commit — and becomes one of
//!
//! | op | when | what is written |
//! |---|---|---|
//! | `add` | no memory of its slot, none saying the same | a new memory |
//! | `update` | its slot restates (or another memory says the same) | the memory, evidence merged |
//! | `supersede` | its slot's fact changed (or, slotless, it changes a close memory) | a new memory `supersedes` the old, which is kept, marked superseded |
//! | `noop` | the same fact and evidence are held already | nothing |
//!
//! A memory's slot is (category, key). How two facts relate is [`Sameness::relation`]:
//! *close* when their distinctive terms agree ([`anchors_agree`]: names, places) and their
//! terms overlap ([`similarity`], a Jaccard overlap with the keyword index's tokenizer) or
//! their embeddings are close (the engine's embedder through its cache, on the source's
//! text — it sees memories written a moment ago that no index holds yet); close facts say
//! the same unless one [`changes`] the other (numbers, a negation, a one-word swap), and a
//! candidate without a slot of its own that changes a close memory supersedes it. Whether a
//! restated slot is the same fact or a changed one is the model's `change` when it gives one
//! (it saw the existing memories), else the term overlap. The merge is deterministic given
//! the embeddings.
//!
//! Invariants ([`check_invariants`], checked by the property test): MM1 no two current
//! memories of an owner share a slot; MM2 no two current memories say the same; MM3 every
//! superseded memory names its successor, which exists and `supersedes` it.

use std::collections::{BTreeMap, BTreeSet};

use ce_core::{ContextNode, CtxUri, Meta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::extract::{Candidate, Change, Shown};
use crate::layout::{CATEGORIES, check_memory_key, memory_meta};

/// The default similarity at or above which two facts say the same.
pub const DEFAULT_THRESHOLD: f64 = 0.75;

/// One memory, as stored (or as the plan will store it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemoryState {
    /// Its node.
    pub uri: CtxUri,
    /// Its category.
    pub category: String,
    /// Its slot within the category.
    pub key: String,
    /// The fact (L0).
    pub fact: String,
    /// Context (L1).
    #[serde(default)]
    pub context: String,
    /// Evidence excerpts (L2).
    #[serde(default)]
    pub evidence: String,
    /// 0..=1.
    pub confidence: f64,
    /// The archive of its last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_archive: Option<String>,
    /// Every archive that stated it.
    #[serde(default)]
    pub sources: Vec<String>,
    /// The messages that are its evidence, as `{archive}#{message id}`.
    #[serde(default)]
    pub source_messages: Vec<String>,
    /// The candidates merged into it, as `{archive}#c{index}`.
    #[serde(default)]
    pub merged_from: Vec<String>,
    /// Since when it holds.
    pub valid_from_ms: i64,
    /// Until when it held (superseded memories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until_ms: Option<i64>,
    /// Its successor, when superseded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<CtxUri>,
    /// The memory it replaced (its `supersedes` edge), when the plan created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<CtxUri>,
}

fn meta_str(meta: &Meta, key: &str) -> Option<String> {
    meta.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn meta_strings(meta: &Meta, key: &str) -> Vec<String> {
    meta.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl MemoryState {
    /// The memory a node under `memories/` holds: `memories/{category}/{name}` leaves only. A
    /// memory a client wrote by hand (no memory meta) counts too — its key is its name, its
    /// fact its L0 or else its content — so extraction does not duplicate it.
    pub fn from_node(memories: &CtxUri, node: &ContextNode) -> Option<Self> {
        let rel = node.uri.relative_to(memories)?;
        let (category, name) = rel.split_once('/')?;
        if name.contains('/') || !CATEGORIES.contains(&category) {
            return None;
        }
        let key = meta_str(&node.meta, memory_meta::KEY)
            .filter(|k| check_memory_key(k).is_ok())
            .unwrap_or_else(|| name.to_owned());
        let fact = if node.layers.abstract_text.trim().is_empty() {
            node.layers
                .content
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        } else {
            node.layers.abstract_text.trim().to_owned()
        };
        if fact.is_empty() {
            return None;
        }
        let superseded_by = meta_str(&node.meta, memory_meta::SUPERSEDED_BY)
            .and_then(|u| CtxUri::parse_stored(&u).ok());
        Some(MemoryState {
            uri: node.uri.clone(),
            category: category.to_owned(),
            key,
            fact,
            context: node.layers.overview.clone(),
            evidence: node.layers.content.clone(),
            confidence: node
                .meta
                .get(memory_meta::CONFIDENCE)
                .and_then(Value::as_f64)
                .unwrap_or(1.0),
            source_archive: meta_str(&node.meta, memory_meta::SOURCE_ARCHIVE),
            sources: meta_strings(&node.meta, memory_meta::SOURCES),
            source_messages: meta_strings(&node.meta, memory_meta::SOURCE_MESSAGES),
            merged_from: meta_strings(&node.meta, memory_meta::MERGED_FROM),
            valid_from_ms: node
                .meta
                .get(memory_meta::VALID_FROM)
                .and_then(Value::as_i64)
                .unwrap_or(node.created_at_ms),
            valid_until_ms: node
                .meta
                .get(memory_meta::VALID_UNTIL)
                .and_then(Value::as_i64),
            superseded_by,
            supersedes: None,
        })
    }

    /// Whether it is current (not superseded).
    pub fn is_current(&self) -> bool {
        self.superseded_by.is_none()
    }

    /// The meta its node carries (merged over the node's other keys).
    pub fn meta(&self) -> Meta {
        let mut m = Meta::new();
        m.insert(memory_meta::KEY.into(), self.key.clone().into());
        m.insert(
            memory_meta::STATUS.into(),
            if self.is_current() {
                memory_meta::CURRENT
            } else {
                memory_meta::SUPERSEDED
            }
            .into(),
        );
        m.insert(memory_meta::CONFIDENCE.into(), self.confidence.into());
        m.insert(
            memory_meta::SOURCE_ARCHIVE.into(),
            self.source_archive.clone().map_or(Value::Null, Value::from),
        );
        m.insert(memory_meta::SOURCES.into(), self.sources.clone().into());
        m.insert(
            memory_meta::SOURCE_MESSAGES.into(),
            self.source_messages.clone().into(),
        );
        m.insert(
            memory_meta::MERGED_FROM.into(),
            self.merged_from.clone().into(),
        );
        m.insert(memory_meta::VALID_FROM.into(), self.valid_from_ms.into());
        m.insert(
            memory_meta::VALID_UNTIL.into(),
            self.valid_until_ms.map_or(Value::Null, Value::from),
        );
        m.insert(
            memory_meta::SUPERSEDED_BY.into(),
            self.superseded_by
                .as_ref()
                .map_or(Value::Null, |u| Value::from(u.as_str())),
        );
        m
    }
}

/// English function words left out of [`similarity`]: they make two different facts about
/// the same thing look alike ("… in the Zed editor" / "… in the Helix editor").
const FUNCTION_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "is",
    "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "with",
];

/// The terms of `text`, as a set (function words left out).
fn terms(text: &str) -> BTreeSet<String> {
    ce_core::text::tokenize(text)
        .into_iter()
        .map(|t| t.to_lowercase())
        .filter(|t| !FUNCTION_WORDS.contains(&t.as_str()))
        .collect()
}

/// How much two facts share their terms: the Jaccard overlap of their term sets (1: the same
/// terms; two texts without terms are compared as trimmed, lower-cased strings).
pub fn similarity(a: &str, b: &str) -> f64 {
    let (ta, tb) = (terms(a), terms(b));
    if ta.is_empty() || tb.is_empty() {
        return f64::from(u8::from(a.trim().to_lowercase() == b.trim().to_lowercase()));
    }
    let inter = ta.intersection(&tb).count() as f64;
    let union = ta.union(&tb).count() as f64;
    inter / union
}

/// The words of `text` (runs of letters and digits) as written, in order.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

fn stem(word: &str) -> String {
    ce_core::text::tokenize(word).concat()
}

fn is_number(word: &str) -> bool {
    word.chars().any(|c| c.is_ascii_digit()) || NUMBER_WORDS.contains(&word.to_lowercase().as_str())
}

/// Number words: "two children" and "three children" differ as "2" and "3" do.
const NUMBER_WORDS: &[&str] = &[
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "twenty", "thirty", "hundred", "thousand", "million", "once", "twice",
];

/// Stems of words that negate or end what a fact says: "is vegetarian" / "is not
/// vegetarian", "drinks coffee" / "stopped drinking coffee".
const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "neither", "nor", "without", "cannot", "doesn", "don", "didn",
    "isn", "wasn", "aren", "weren", "won", "hasn", "haven", "stop", "quit", "anymor", "longer",
    "former", "formerli",
];

/// The distinctive terms of `a` with respect to `b` (stemmed): capitalised words — names,
/// places, products — that neither text also uses as a common, lower-case word (so a
/// capitalised sentence start like "Restarting" is not one when the other text says
/// "restarting") and that are not function words or numbers (numbers are [`changes`]).
fn anchors(a: &str, b: &str) -> BTreeSet<String> {
    let common: BTreeSet<String> = words(a)
        .chain(words(b))
        .filter(|w| w.chars().next().is_some_and(char::is_lowercase))
        .map(stem)
        .collect();
    words(a)
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase) && !is_number(w))
        .map(stem)
        .filter(|t| !FUNCTION_WORDS.contains(&t.as_str()) && !common.contains(t))
        .collect()
}

/// Whether the distinctive terms of one fact are all named by the other (one may add detail:
/// "Maria lives in Porto" / "Maria lives in Porto, Portugal"). Two facts of one template
/// about different people or places ("sister Maria lives in Porto" / "sister Ines lives in
/// Porto") fail it, however alike their words and embeddings are.
pub fn anchors_agree(a: &str, b: &str) -> bool {
    let (x, y) = (anchors(a, b), anchors(b, a));
    x.is_subset(&y) || y.is_subset(&x)
}

/// Whether `b`, close to `a`, states a change of it rather than the same fact: their
/// numbers differ ("PostgreSQL 16" / "14", "two" / "three children"), one negates or ends
/// what the other says ("not", "stopped", "no longer"), or one word of each is swapped for
/// another and the rest is the same ("dark" / "light mode", "coffee" / "tea"). Embeddings
/// rate such pairs as close as paraphrases (0.82–0.98 with the default model); a one-word
/// swap that is a paraphrase ("lives" / "is based") is taken for a change too — the merge
/// then keeps the old memory as history, which loses nothing.
pub fn changes(a: &str, b: &str) -> bool {
    let numbers = |t: &str| -> BTreeSet<String> {
        words(t)
            .filter(|w| is_number(w))
            .map(str::to_lowercase)
            .collect()
    };
    if numbers(a) != numbers(b) {
        return true;
    }
    let (ta, tb) = (terms(a), terms(b));
    let negated = |t: &BTreeSet<String>| t.iter().any(|w| NEGATIONS.contains(&w.as_str()));
    if negated(&ta) != negated(&tb) {
        return true;
    }
    // Content terms only: a lone letter is a split possessive or contraction ("user's").
    let only = |x: &BTreeSet<String>, y: &BTreeSet<String>| {
        x.difference(y).filter(|t| t.chars().count() > 1).count()
    };
    only(&ta, &tb) == 1 && only(&tb, &ta) == 1
}

/// Whether the embedding signal applies to `text`: its letters are Latin (the default
/// model is English; other scripts — Chinese has no capitals to find names by — use term
/// overlap alone).
fn latin(text: &str) -> bool {
    text.chars()
        .filter(|c| c.is_alphabetic())
        .all(|c| c.is_ascii_alphabetic() || ('\u{00C0}'..='\u{024F}').contains(&c))
}

/// The similarity of two facts' embeddings, as the engine computes it through its embedder
/// and embedding cache (the property test injects its own).
pub trait SemanticSimilarity {
    /// The cosine similarity of `a`'s and `b`'s embeddings; `None` when either has none.
    fn cosine(&self, a: &str, b: &str) -> Option<f64>;
}

/// Facts' embeddings by text: what the engine hands the merge.
#[derive(Debug, Clone, Default)]
pub struct FactVectors(pub std::collections::HashMap<String, Vec<f32>>);

impl SemanticSimilarity for FactVectors {
    fn cosine(&self, a: &str, b: &str) -> Option<f64> {
        let (x, y) = (self.0.get(a)?, self.0.get(b)?);
        // The embedders' vectors are unit length: the dot product is the cosine.
        Some(
            x.iter()
                .zip(y)
                .map(|(p, q)| f64::from(*p) * f64::from(*q))
                .sum(),
        )
    }
}

/// The embedding signal of [`Sameness`].
#[derive(Clone, Copy)]
pub struct Semantic<'a> {
    /// The embeddings' similarity.
    pub similarity: &'a dyn SemanticSimilarity,
    /// Cosine at or above which two facts are close.
    pub threshold: f64,
}

/// How two facts relate, by [`Sameness::relation`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Relation {
    /// They say the same (how strongly, 0..=1).
    Same(f64),
    /// They are close, and one [`changes`] the other.
    Changed(f64),
    /// Neither.
    Unrelated,
}

/// How the merge relates two facts (docs/sessions.md, "Merge"). Two facts are **close**
/// when their distinctive terms agree ([`anchors_agree`]) and their terms overlap
/// ([`similarity`] at or above `terms`) or — both in Latin script — their embeddings are
/// close (the [`Semantic`] signal, when an embedder is there). Close facts say the same
/// unless one [`changes`] the other.
#[derive(Clone, Copy)]
pub struct Sameness<'a> {
    /// [`similarity`] at or above which two facts are close.
    pub terms: f64,
    /// The embedding signal; `None`: term overlap alone.
    pub semantic: Option<Semantic<'a>>,
}

impl std::fmt::Debug for Sameness<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sameness")
            .field("terms", &self.terms)
            .field("semantic", &self.semantic.map(|s| s.threshold))
            .finish()
    }
}

impl Sameness<'_> {
    /// Term overlap alone at `terms`.
    pub fn terms(terms: f64) -> Sameness<'static> {
        Sameness {
            terms,
            semantic: None,
        }
    }

    /// The term overlap of `a` and `b` when it alone says they are the same.
    pub fn overlap(&self, a: &str, b: &str) -> Option<f64> {
        let x = similarity(a, b);
        (x >= self.terms && anchors_agree(a, b) && !changes(a, b)).then_some(x)
    }

    /// How `a` and `b` relate.
    pub fn relation(&self, a: &str, b: &str) -> Relation {
        let overlap = similarity(a, b);
        let overlap = (overlap >= self.terms).then_some(overlap);
        let cosine = self
            .semantic
            .filter(|_| latin(a) && latin(b))
            .and_then(|s| s.similarity.cosine(a, b).filter(|c| *c >= s.threshold));
        let close = match (overlap, cosine) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        // The gates last: they are the dearest to compute and most pairs are not close.
        match close {
            Some(score) if anchors_agree(a, b) => {
                if changes(a, b) {
                    Relation::Changed(score)
                } else {
                    Relation::Same(score)
                }
            }
            Some(_) | None => Relation::Unrelated,
        }
    }

    /// Whether `a` and `b` say the same.
    pub fn same(&self, a: &str, b: &str) -> bool {
        matches!(self.relation(a, b), Relation::Same(_))
    }
}

/// How much of `fact`'s terms `text` holds (0..=1): which existing memories a conversation
/// is about, to show them to the model first.
pub fn relevance(fact: &str, text: &str) -> f64 {
    relevance_to(fact, &terms(text))
}

fn relevance_to(fact: &str, text_terms: &BTreeSet<String>) -> f64 {
    let f = terms(fact);
    if f.is_empty() {
        return 0.0;
    }
    f.intersection(text_terms).count() as f64 / f.len() as f64
}

/// `shown` ordered by [`relevance`] to `text`, most relevant first (ties by category and
/// key). The text is tokenized once: a window of a transcript is long and the memories many.
pub fn by_relevance<'a>(shown: &[Shown<'a>], text: &str) -> Vec<Shown<'a>> {
    let t = terms(text);
    let mut scored: Vec<(f64, Shown<'a>)> = shown
        .iter()
        .map(|m| (relevance_to(m.fact, &t), *m))
        .collect();
    scored.sort_by(|(a, ma), (b, mb)| {
        b.total_cmp(a)
            .then_with(|| (ma.category, ma.key).cmp(&(mb.category, mb.key)))
    });
    scored.into_iter().map(|(_, m)| m).collect()
}

/// What the merge did with one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MergeOp {
    /// A new memory.
    Add,
    /// An existing memory updated.
    Update,
    /// A new memory replacing an existing one, which is kept and marked superseded.
    Supersede,
    /// Nothing to write.
    Noop,
}

impl MergeOp {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeOp::Add => "add",
            MergeOp::Update => "update",
            MergeOp::Supersede => "supersede",
            MergeOp::Noop => "noop",
        }
    }
}

/// One line of the memory diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiffEntry {
    /// What was done.
    pub op: MergeOp,
    /// The candidate's index in the extraction.
    pub candidate: usize,
    /// The memory written (for `supersede`: the new one; for `noop`: the one that holds it).
    pub uri: CtxUri,
    /// The memory before (`update`: the memory; `supersede`: the superseded one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<MemoryState>,
    /// The memory after (absent for `noop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<MemoryState>,
    /// Why this op.
    pub reason: String,
}

/// What one commit's merge writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MergePlan {
    /// One entry per candidate, in order.
    pub entries: Vec<DiffEntry>,
    /// The memories to write, final states, by URI (a memory touched twice is written once).
    pub writes: BTreeMap<CtxUri, MemoryState>,
}

/// The inputs of a merge besides the memories and candidates.
#[derive(Debug, Clone)]
pub struct MergeContext<'a> {
    /// The owner's memories folder.
    pub memories: &'a CtxUri,
    /// The archive the candidates came from.
    pub archive: &'a CtxUri,
    /// The time of the commit (valid-from of new memories).
    pub now_ms: i64,
    /// When two facts say the same.
    pub sameness: Sameness<'a>,
    /// The text of each archived message by id (evidence excerpts).
    pub messages: &'a BTreeMap<String, String>,
}

struct Work<'a> {
    ctx: &'a MergeContext<'a>,
    all: BTreeMap<CtxUri, MemoryState>,
    /// The memories that existed before this commit (the model saw those).
    before: BTreeSet<CtxUri>,
    plan: MergePlan,
}

/// Candidate `i` of the commit's archive, as memories record what was merged into them.
fn candidate_id(ctx: &MergeContext<'_>, i: usize) -> String {
    format!("{}#c{i}", ctx.archive)
}

/// `id` of the commit's archive, as memories record their evidence.
fn qualified(ctx: &MergeContext<'_>, id: &str) -> String {
    format!("{}#{id}", ctx.archive)
}

fn excerpts(ctx: &MergeContext<'_>, ids: &[String]) -> String {
    ids.iter()
        .filter_map(|id| ctx.messages.get(id).map(|t| format!("[{id}] {}", t.trim())))
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl Work<'_> {
    fn current(&self) -> impl Iterator<Item = &MemoryState> {
        self.all.values().filter(|m| m.is_current())
    }

    fn slot(&self, category: &str, key: &str) -> Option<CtxUri> {
        self.current()
            .find(|m| m.category == category && m.key == key)
            .map(|m| m.uri.clone())
    }

    /// The current memory saying most nearly what `fact` says, other than `except`.
    fn similar(&self, fact: &str, except: Option<&CtxUri>) -> Option<CtxUri> {
        self.related(fact, except).0
    }

    /// The current memories (other than `except`) most strongly related to `fact`: the one
    /// saying the same, and the one it changes.
    fn related(&self, fact: &str, except: Option<&CtxUri>) -> (Option<CtxUri>, Option<CtxUri>) {
        let mut same: Option<(f64, &CtxUri)> = None;
        let mut changed: Option<(f64, &CtxUri)> = None;
        for m in self.current() {
            if Some(&m.uri) == except {
                continue;
            }
            let (slot, score) = match self.ctx.sameness.relation(fact, &m.fact) {
                Relation::Same(x) => (&mut same, x),
                Relation::Changed(x) => (&mut changed, x),
                Relation::Unrelated => continue,
            };
            if slot.is_none_or(|(b, _)| score > b) {
                *slot = Some((score, &m.uri));
            }
        }
        let uri = |x: Option<(f64, &CtxUri)>| x.map(|(_, u)| u.clone());
        (uri(same), uri(changed))
    }

    /// A URI for a new memory of (`category`, `key`) that no memory has.
    fn fresh_uri(&self, category: &str, key: &str) -> CtxUri {
        let folder = self
            .ctx
            .memories
            .join(category)
            .expect("a category is a valid segment");
        let mut n = 1u32;
        loop {
            let name = if n == 1 {
                key.to_owned()
            } else {
                format!("{key}-{n}")
            };
            let uri = folder.join(&name).expect("a key is a valid segment");
            if !self.all.contains_key(&uri) {
                return uri;
            }
            n += 1;
        }
    }

    fn write(&mut self, m: MemoryState) {
        self.plan.writes.insert(m.uri.clone(), m.clone());
        self.all.insert(m.uri.clone(), m);
    }

    fn entry(
        &mut self,
        op: MergeOp,
        i: usize,
        uri: CtxUri,
        before: Option<MemoryState>,
        after: Option<MemoryState>,
        reason: String,
    ) {
        self.plan.entries.push(DiffEntry {
            op,
            candidate: i,
            uri,
            before,
            after,
            reason,
        });
    }

    fn new_memory(&self, i: usize, c: &Candidate, uri: CtxUri) -> MemoryState {
        MemoryState {
            uri,
            category: c.category.clone(),
            key: c.key.clone(),
            fact: c.fact.clone(),
            context: c.context.clone(),
            evidence: excerpts(self.ctx, &c.evidence),
            confidence: c.confidence,
            source_archive: Some(self.ctx.archive.as_str().to_owned()),
            sources: vec![self.ctx.archive.as_str().to_owned()],
            source_messages: c.evidence.iter().map(|e| qualified(self.ctx, e)).collect(),
            merged_from: vec![candidate_id(self.ctx, i)],
            valid_from_ms: self.ctx.now_ms,
            valid_until_ms: None,
            superseded_by: None,
            supersedes: None,
        }
    }

    /// `target` restated by `c`: evidence and sources merged, the fact reworded unless the
    /// new wording would say what another memory says; `noop` when nothing is new.
    fn update(&mut self, i: usize, c: &Candidate, target: CtxUri, why: &str) {
        let before = self.all[&target].clone();
        let archive = self.ctx.archive.as_str().to_owned();
        let new_ids: Vec<String> = c
            .evidence
            .iter()
            .filter(|e| !before.source_messages.contains(&qualified(self.ctx, e)))
            .cloned()
            .collect();
        let same_text = similarity(&c.fact, &before.fact) >= 1.0 || c.fact == before.fact;
        let context_new = !c.context.is_empty() && !before.context.contains(&c.context);
        // Its messages were merged into this memory already: a rewording of the same
        // evidence is no new information.
        let mut after = before.clone();
        after.merged_from.push(candidate_id(self.ctx, i));
        if new_ids.is_empty() && !context_new {
            // Nothing new to say: only the record that this candidate is held here is kept.
            self.write(after);
            self.entry(
                MergeOp::Noop,
                i,
                target,
                None,
                None,
                format!("{why}; its evidence is held already"),
            );
            return;
        }
        if !same_text && self.similar(&c.fact, Some(&target)).is_none() {
            after.fact = c.fact.clone();
        }
        if context_new {
            after.context = if after.context.is_empty() {
                c.context.clone()
            } else {
                format!("{}\n\n{}", after.context, c.context)
            };
        }
        let more = excerpts(self.ctx, &new_ids);
        if !more.is_empty() && !after.evidence.contains(&more) {
            after.evidence = if after.evidence.is_empty() {
                more
            } else {
                format!("{}\n\n{more}", after.evidence)
            };
        }
        for id in &new_ids {
            after.source_messages.push(qualified(self.ctx, id));
        }
        if !after.sources.contains(&archive) {
            after.sources.push(archive.clone());
        }
        after.source_archive = Some(archive);
        after.confidence = after.confidence.max(c.confidence);
        self.write(after.clone());
        self.entry(
            MergeOp::Update,
            i,
            target,
            Some(before),
            Some(after),
            why.to_owned(),
        );
    }

    fn supersede(&mut self, i: usize, c: &Candidate, old: CtxUri, why: String) {
        let before = self.all[&old].clone();
        let uri = self.fresh_uri(&c.category, &c.key);
        let mut new = self.new_memory(i, c, uri.clone());
        new.supersedes = Some(old.clone());
        let mut retired = before.clone();
        retired.superseded_by = Some(uri.clone());
        retired.valid_until_ms = Some(self.ctx.now_ms);
        self.write(retired);
        self.write(new.clone());
        self.entry(
            MergeOp::Supersede,
            i,
            uri,
            Some(before),
            Some(new),
            format!("{why}: the old memory is kept, marked superseded"),
        );
    }

    /// The memory (current or superseded) candidate `i` of this archive was merged into
    /// before (a repeated merge of the same candidates).
    fn already_holds(&self, i: usize) -> Option<CtxUri> {
        let id = candidate_id(self.ctx, i);
        self.all
            .values()
            .find(|m| m.merged_from.contains(&id))
            .map(|m| m.uri.clone())
    }

    fn merge(&mut self, i: usize, c: &Candidate) {
        if let Some(m) = self.already_holds(i) {
            self.entry(
                MergeOp::Noop,
                i,
                m,
                None,
                None,
                "this candidate was merged already".into(),
            );
            return;
        }
        let slot = self.slot(&c.category, &c.key);
        match slot {
            Some(s) => {
                let old = &self.all[&s].fact;
                // The model's `change` is relative to the memories it was shown: against a
                // memory this commit wrote, only the term overlap decides. Not the embedding
                // signal: within a slot a wrong "changed" keeps the old memory as history,
                // a wrong "same" would overwrite it ("dark theme" / "light theme" embed
                // alike).
                let change = c.change.filter(|_| self.before.contains(&s));
                let same = match change {
                    // A "change" to the very same words is a restatement.
                    Some(Change::Changed) => similarity(&c.fact, old) >= 1.0,
                    Some(Change::Same) => true,
                    None => self.ctx.sameness.overlap(&c.fact, old).is_some(),
                };
                if same {
                    self.update(i, c, s, "restates the memory of its slot");
                } else if let Some(other) = self.similar(&c.fact, Some(&s)) {
                    // The new fact is held by another memory already: it is restated there
                    // rather than written twice.
                    self.update(i, c, other, "the new fact is held by another memory");
                } else {
                    let why = format!("{}/{} changed", c.category, c.key);
                    self.supersede(i, c, s, why);
                }
            }
            None => match self.related(&c.fact, None) {
                (Some(m), _) => self.update(i, c, m, "says what an existing memory says"),
                (None, Some(m)) => {
                    let why = format!("it changes what {m} says");
                    self.supersede(i, c, m, why);
                }
                (None, None) => {
                    let uri = self.fresh_uri(&c.category, &c.key);
                    let new = self.new_memory(i, c, uri.clone());
                    self.write(new.clone());
                    self.entry(MergeOp::Add, i, uri, None, Some(new), "a new memory".into());
                }
            },
        }
    }
}

/// Plans the merge of `candidates` into `existing` (the owner's memories, current and
/// superseded, as the source holds them), in candidate order.
pub fn plan_merge(
    ctx: &MergeContext<'_>,
    existing: Vec<MemoryState>,
    candidates: &[Candidate],
) -> MergePlan {
    let mut w = Work {
        ctx,
        before: existing.iter().map(|m| m.uri.clone()).collect(),
        all: existing.into_iter().map(|m| (m.uri.clone(), m)).collect(),
        plan: MergePlan::default(),
    };
    for (i, c) in candidates.iter().enumerate() {
        w.merge(i, c);
    }
    w.plan
}

/// Applies `plan`'s writes to `memories` (a model of the store).
pub fn apply_plan(memories: &mut BTreeMap<CtxUri, MemoryState>, plan: &MergePlan) {
    for (u, m) in &plan.writes {
        memories.insert(u.clone(), m.clone());
    }
}

/// The invariants MM1–MM3 over an owner's memories; the first violation found.
pub fn check_invariants(
    memories: &BTreeMap<CtxUri, MemoryState>,
    sameness: &Sameness<'_>,
    supersedes: &BTreeMap<CtxUri, CtxUri>,
) -> Result<(), String> {
    let current: Vec<&MemoryState> = memories.values().filter(|m| m.is_current()).collect();
    for (i, a) in current.iter().enumerate() {
        for b in &current[i + 1..] {
            if a.category == b.category && a.key == b.key {
                return Err(format!("MM1: {} and {} share a slot", a.uri, b.uri));
            }
            if sameness.same(&a.fact, &b.fact) {
                return Err(format!(
                    "MM2: {} ({:?}) and {} ({:?}) say the same",
                    a.uri, a.fact, b.uri, b.fact
                ));
            }
        }
    }
    for m in memories.values() {
        if let Some(s) = &m.superseded_by {
            if !memories.contains_key(s) {
                return Err(format!("MM3: {} is superseded by a missing {s}", m.uri));
            }
            if supersedes.get(s) != Some(&m.uri) {
                return Err(format!("MM3: {s} does not link {} as superseded", m.uri));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn cand(category: &str, key: &str, fact: &str, ev: &str, change: Option<Change>) -> Candidate {
        Candidate {
            category: category.into(),
            key: key.into(),
            fact: fact.into(),
            context: String::new(),
            evidence: vec![ev.into()],
            confidence: 0.8,
            change,
        }
    }

    fn run(
        existing: Vec<MemoryState>,
        archive: &str,
        candidates: &[Candidate],
    ) -> (MergePlan, BTreeMap<CtxUri, MemoryState>) {
        let mem = u("ctx://a/users/u/memories");
        let arch = u(archive);
        let msgs: BTreeMap<String, String> = [("q1", "I use Helix"), ("q2", "now I use Zed")]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        let ctx = MergeContext {
            memories: &mem,
            archive: &arch,
            now_ms: 1000,
            sameness: Sameness::terms(DEFAULT_THRESHOLD),
            messages: &msgs,
        };
        let mut all: BTreeMap<CtxUri, MemoryState> = existing
            .iter()
            .map(|m| (m.uri.clone(), m.clone()))
            .collect();
        let plan = plan_merge(&ctx, existing, candidates);
        apply_plan(&mut all, &plan);
        (plan, all)
    }

    fn ops(p: &MergePlan) -> Vec<MergeOp> {
        p.entries.iter().map(|e| e.op).collect()
    }

    #[test]
    fn duplicates_within_one_commit_are_merged_and_a_restatement_updates() {
        let a1 = "ctx://a/users/u/sessions/s/archives/000001";
        let editor = cand(
            "preferences",
            "editor",
            "The user edits code in Helix",
            "q1",
            None,
        );
        let (p, all) = run(Vec::new(), a1, &[editor.clone(), editor.clone()]);
        assert_eq!(ops(&p), [MergeOp::Add, MergeOp::Noop]);
        let m = &all[&u("ctx://a/users/u/memories/preferences/editor")];
        assert_eq!(m.evidence, "[q1] I use Helix");
        // A second commit restating it: update (a new source), not add.
        let (p2, all2) = run(
            all.values().cloned().collect(),
            "ctx://a/users/u/sessions/s/archives/000002",
            &[cand(
                "preferences",
                "editor",
                "The user edits code in Helix",
                "q1",
                Some(Change::Same),
            )],
        );
        assert_eq!(ops(&p2), [MergeOp::Update]);
        assert_eq!(all2.len(), 1);
        assert_eq!(all2.values().next().expect("one").sources.len(), 2);
    }

    #[test]
    fn a_changed_fact_supersedes_and_keeps_the_old_memory_linked() {
        let a1 = "ctx://a/users/u/sessions/s/archives/000001";
        let (_, all) = run(
            Vec::new(),
            a1,
            &[cand(
                "preferences",
                "editor",
                "The user edits code in Helix",
                "q1",
                None,
            )],
        );
        let (p, all) = run(
            all.values().cloned().collect(),
            "ctx://a/users/u/sessions/s/archives/000002",
            &[cand(
                "preferences",
                "editor",
                "The user switched to Zed",
                "q2",
                Some(Change::Changed),
            )],
        );
        assert_eq!(ops(&p), [MergeOp::Supersede]);
        let old = &all[&u("ctx://a/users/u/memories/preferences/editor")];
        let new = &all[&u("ctx://a/users/u/memories/preferences/editor-2")];
        assert_eq!(old.superseded_by.as_ref(), Some(&new.uri));
        assert_eq!(new.supersedes.as_ref(), Some(&old.uri));
        assert_eq!(old.valid_until_ms, Some(1000));
        let links: BTreeMap<CtxUri, CtxUri> = all
            .values()
            .filter_map(|m| m.supersedes.clone().map(|s| (m.uri.clone(), s)))
            .collect();
        check_invariants(&all, &Sameness::terms(DEFAULT_THRESHOLD), &links).expect("invariants");
    }

    #[test]
    fn a_fact_under_another_key_that_says_the_same_updates_instead_of_adding() {
        let a1 = "ctx://a/users/u/sessions/s/archives/000001";
        let (p, all) = run(
            Vec::new(),
            a1,
            &[
                cand(
                    "profile",
                    "home_city",
                    "The user lives in Lyon, France",
                    "q1",
                    None,
                ),
                cand(
                    "profile",
                    "residence",
                    "The user lives in Lyon, France",
                    "q2",
                    None,
                ),
            ],
        );
        assert_eq!(ops(&p), [MergeOp::Add, MergeOp::Update]);
        assert_eq!(all.len(), 1);
        assert_eq!(
            all.values().next().expect("one").source_messages,
            [format!("{a1}#q1"), format!("{a1}#q2")]
        );
    }

    #[test]
    fn the_models_change_hint_holds_only_against_memories_it_was_shown() {
        // Within one commit: Lyon, then Kyoto ("changed" against the Lyon it was shown),
        // then Lyon again marked "same" against that stale view — the slot now holds the
        // Kyoto memory this commit wrote, so the similarity decides: Kyoto is superseded,
        // kept as history, not overwritten.
        let a1 = "ctx://a/users/u/sessions/s/archives/000001";
        let (_, all) = run(
            Vec::new(),
            a1,
            &[cand(
                "profile",
                "home_city",
                "The user lives in Lyon",
                "q1",
                None,
            )],
        );
        let (p, all) = run(
            all.values().cloned().collect(),
            "ctx://a/users/u/sessions/s/archives/000002",
            &[
                cand(
                    "profile",
                    "home_city",
                    "The user lives in Kyoto",
                    "q1",
                    Some(Change::Changed),
                ),
                cand(
                    "profile",
                    "home_city",
                    "The user lives in Lyon",
                    "q2",
                    Some(Change::Same),
                ),
            ],
        );
        assert_eq!(ops(&p), [MergeOp::Supersede, MergeOp::Supersede]);
        let facts: Vec<(&str, bool)> = all
            .values()
            .map(|m| (m.fact.as_str(), m.is_current()))
            .collect();
        assert_eq!(
            facts,
            [
                ("The user lives in Lyon", false),
                ("The user lives in Kyoto", false),
                ("The user lives in Lyon", true)
            ]
        );
    }

    #[test]
    fn memories_are_ordered_by_relevance_to_the_text() {
        let m = |name: &str, fact: &str| MemoryState {
            uri: u(&format!("ctx://a/users/u/memories/profile/{name}")),
            category: "profile".into(),
            key: name.into(),
            fact: fact.into(),
            context: String::new(),
            evidence: String::new(),
            confidence: 1.0,
            source_archive: None,
            sources: Vec::new(),
            source_messages: Vec::new(),
            merged_from: Vec::new(),
            valid_from_ms: 0,
            valid_until_ms: None,
            superseded_by: None,
            supersedes: None,
        };
        let (a, b, c) = (
            m("a", "Deploys run on Fridays"),
            m("b", "The user lives in Lyon"),
            m("c", "The user lives in Kyoto"),
        );
        let text = "[q1] user: I moved, I live in Kyoto now, not Lyon";
        let order: Vec<&str> = by_relevance(&[(&a).into(), (&b).into(), (&c).into()], text)
            .iter()
            .map(|m| m.key)
            .collect();
        // b and c hold every term; ties by slot; a none.
        assert_eq!(order, ["b", "c", "a"]);
        assert!(relevance(&c.fact, text) > relevance(&a.fact, text));
    }

    #[test]
    fn names_gate_closeness_and_changed_values_are_told_from_rewordings() {
        // Names and places: one may add detail, neither may differ.
        assert!(anchors_agree(
            "The user's sister Maria lives in Porto.",
            "Maria, the user's sister, is based in Porto, Portugal."
        ));
        assert!(!anchors_agree(
            "The user's sister Maria lives in Porto.",
            "The user's sister Ines lives in Porto."
        ));
        // A capitalised sentence start the other text uses in lower case is not a name.
        assert!(anchors_agree(
            "Restarting the Kofi service solved the outage.",
            "The outage ended after restarting the Kofi service."
        ));
        for (a, b) in [
            (
                "The user runs PostgreSQL 16.",
                "The user runs PostgreSQL 14.",
            ),
            ("The user has two children.", "The user has three children."),
            ("The user is vegetarian.", "The user is not vegetarian."),
            (
                "The user prefers dark mode.",
                "The user prefers light mode.",
            ),
        ] {
            assert!(changes(a, b), "{a} / {b}");
        }
        assert!(!changes(
            "The user prefers dark mode in every editor.",
            "In all of their editors the user likes to use a dark theme."
        ));
    }

    /// The listed pairs of facts embed close (0.9), the others far apart (0.1).
    struct Close<'a>(&'a [(&'a str, &'a str)]);

    impl SemanticSimilarity for Close<'_> {
        fn cosine(&self, a: &str, b: &str) -> Option<f64> {
            let listed = self
                .0
                .iter()
                .any(|(x, y)| (a, b) == (*x, *y) || (a, b) == (*y, *x));
            Some(if listed { 0.9 } else { 0.1 })
        }
    }

    #[test]
    fn with_the_embedding_signal_a_rewording_updates_a_change_supersedes_a_name_stays_apart() {
        let mem = u("ctx://a/users/u/memories");
        let arch = u("ctx://a/users/u/sessions/s/archives/000001");
        let msgs = BTreeMap::new();
        let (maria, reworded, ines) = (
            "The user's sister Maria lives in Porto.",
            "Maria, the user's sister, is in Porto these days.",
            "The user's sister Ines lives in Porto.",
        );
        let (two, three) = ("The user has two cats.", "The user has three cats.");
        let pairs = [(maria, reworded), (maria, ines), (two, three)];
        let close = Close(&pairs);
        let ctx = MergeContext {
            memories: &mem,
            archive: &arch,
            now_ms: 1000,
            sameness: Sameness {
                terms: DEFAULT_THRESHOLD,
                semantic: Some(Semantic {
                    similarity: &close,
                    threshold: 0.7,
                }),
            },
            messages: &msgs,
        };
        let c = |key: &str, fact: &str, ev: &str| cand("profile", key, fact, ev, None);
        let plan = plan_merge(
            &ctx,
            Vec::new(),
            &[
                c("sister", maria, "q1"),
                // Reworded under a fresh key: the same fact.
                c("sister_2", reworded, "q2"),
                // Another sister, close in embedding: her name differs.
                c("sister_3", ines, "q3"),
                // A changed value under a fresh key: supersedes.
                c("pets", two, "q4"),
                c("pets_2", three, "q5"),
            ],
        );
        assert_eq!(
            ops(&plan),
            [
                MergeOp::Add,
                MergeOp::Update,
                MergeOp::Add,
                MergeOp::Add,
                MergeOp::Supersede
            ]
        );
        let mut all = BTreeMap::new();
        apply_plan(&mut all, &plan);
        let links = all
            .values()
            .filter_map(|m| m.supersedes.clone().map(|s| (m.uri.clone(), s)))
            .collect();
        check_invariants(&all, &ctx.sameness, &links).expect("invariants");
        let two = &all[&u("ctx://a/users/u/memories/profile/pets")];
        assert_eq!(
            two.superseded_by,
            Some(u("ctx://a/users/u/memories/profile/pets_2"))
        );
    }

    #[test]
    fn similarity_is_term_overlap() {
        assert!((similarity("The user likes tea", "the user LIKES tea") - 1.0).abs() < 1e-9);
        assert!(similarity("The user likes tea", "Deploys run on Fridays") < 0.2);
        assert!(similarity("用户喜欢喝绿茶", "用户喜欢喝绿茶") >= 1.0);
    }
}
