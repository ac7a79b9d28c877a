//! `ce eval`: retrieval quality on a BEIR-format data set.
//!
//! Three steps, one section each, in the order the command runs them:
//! 1. **load** the data set ([`load_beir`]): `corpus.jsonl`, `queries.jsonl` and a qrels TSV;
//!    a bad line fails with [`CliError::EvalData`] naming its file and line;
//! 2. **map** every document to a node ([`doc_text`] for its layers, [`DocUris`] for its URI
//!    and, for the hits, back to its id);
//! 3. **evaluate** ([`evaluate`]): run every query in every mode through a caller-given search
//!    and score the ranked ids against the qrels with nDCG@k, recall@k, MRR@k and recall@100
//!    (as pytrec_eval and BEIR compute them), timing each search and handing each ranking on
//!    (progress, the TREC run file).
//!
//! The metrics know nothing of the engine: [`run`] (section 4) writes the corpus in a
//! [`Layout`] into a data directory (`--data-dir`, kept, or a temporary one), builds the
//! indexes the modes need one at a time (timed, with progress on stderr) and passes the
//! engine's search as a closure, so the metrics are tested on hand-made rankings.

use ce_core::clock::ms_of;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ce_core::config::{DERIVE_CONSUMER, KEYWORD_CONSUMER, VECTOR_CONSUMER};
use ce_core::uri::RESERVED_SEGMENTS;
use ce_core::{Config, CoreError, CtxUri, Level};
use ce_embed::Embedder as _;
use ce_index::vector::SearchFilter;
use ce_retrieval::{HierarchicalParams, HierarchicalRequest, SearchMode, SearchRequest};
use ce_server::status::DrainProgress;
use ce_server::{Engine, EngineOptions, ServerError, Source};
use ce_store::{PutRequest, WriteOp};
use serde::{Deserialize, Serialize};

use crate::error::{CliError, Result};

// ---------------------------------------------------------------------------------------------
// 1. Loading
// ---------------------------------------------------------------------------------------------

/// One document of `corpus.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeirDoc {
    /// `_id` (numbers are taken as their decimal text).
    pub id: String,
    /// `title`; empty when missing or null.
    pub title: String,
    /// `text`.
    pub text: String,
}

/// One query of `queries.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeirQuery {
    /// `_id`.
    pub id: String,
    /// `text` (never blank).
    pub text: String,
}

/// Relevance judgments: query id → document id → score. A score above 0 is relevant and is
/// the document's gain; 0 or below is judged not relevant.
pub type Qrels = BTreeMap<String, BTreeMap<String, i64>>;

/// A loaded BEIR data set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BeirData {
    /// The documents, in file order (ids unique).
    pub corpus: Vec<BeirDoc>,
    /// The queries, in file order (ids unique).
    pub queries: Vec<BeirQuery>,
    /// The judgments.
    pub qrels: Qrels,
}

/// Loads a BEIR data set: `corpus` and `queries` are JSON Lines, `qrels` is
/// `query-id<TAB>corpus-id<TAB>score` with an optional header line. Blank lines are skipped;
/// fields other than `_id`, `title` and `text` are ignored.
pub fn load_beir(corpus: &Path, queries: &Path, qrels: &Path) -> Result<BeirData> {
    let open = |p: &Path| -> Result<_> { Ok(std::io::BufReader::new(fs_err::File::open(p)?)) };
    Ok(BeirData {
        corpus: read_corpus(open(corpus)?, &corpus.display().to_string())?,
        queries: read_queries(open(queries)?, &queries.display().to_string())?,
        qrels: read_qrels(open(qrels)?, &qrels.display().to_string())?,
    })
}

/// A JSON `_id`: BEIR writes strings, a few converted sets write numbers.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawId {
    Text(String),
    Number(serde_json::Number),
}

impl RawId {
    fn into_string(self) -> String {
        match self {
            RawId::Text(s) => s,
            RawId::Number(n) => n.to_string(),
        }
    }
}

#[derive(Deserialize)]
struct RawDoc {
    #[serde(rename = "_id")]
    id: RawId,
    #[serde(default)]
    title: Option<String>,
    text: String,
}

#[derive(Deserialize)]
struct RawQuery {
    #[serde(rename = "_id")]
    id: RawId,
    text: String,
}

/// Points at one line of one file, to build [`CliError::EvalData`].
struct At<'a> {
    path: &'a str,
    line: usize,
}

impl At<'_> {
    fn err(&self, message: impl Into<String>) -> CliError {
        CliError::EvalData {
            path: self.path.to_owned(),
            line: self.line,
            message: message.into(),
        }
    }
}

/// Calls `each` with every non-blank line (BOM and `\r` stripped) and its position.
fn for_each_line(
    mut reader: impl BufRead,
    path: &str,
    mut each: impl FnMut(&At<'_>, &str) -> Result<()>,
) -> Result<()> {
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            return Ok(());
        }
        line += 1;
        let at = At { path, line };
        let text = std::str::from_utf8(&buf).map_err(|e| at.err(format!("not UTF-8: {e}")))?;
        let text = if line == 1 {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        let text = text.trim_end_matches(['\n', '\r']);
        if !text.trim().is_empty() {
            each(&at, text)?;
        }
    }
}

/// Rejects an empty id or one seen before (`seen` maps ids to their line).
fn check_new_id(at: &At<'_>, id: &str, seen: &mut HashMap<String, usize>) -> Result<()> {
    if id.is_empty() {
        return Err(at.err("_id is empty"));
    }
    if let Some(first) = seen.insert(id.to_owned(), at.line) {
        return Err(at.err(format!("_id {id:?} already appears on line {first}")));
    }
    Ok(())
}

fn read_corpus(reader: impl BufRead, path: &str) -> Result<Vec<BeirDoc>> {
    let mut docs = Vec::new();
    let mut seen = HashMap::new();
    for_each_line(reader, path, |at, line| {
        let raw: RawDoc = serde_json::from_str(line)
            .map_err(|e| at.err(format!("not a corpus document {{\"_id\", \"text\"}}: {e}")))?;
        let id = raw.id.into_string();
        check_new_id(at, &id, &mut seen)?;
        docs.push(BeirDoc {
            id,
            title: raw.title.unwrap_or_default(),
            text: raw.text,
        });
        Ok(())
    })?;
    Ok(docs)
}

fn read_queries(reader: impl BufRead, path: &str) -> Result<Vec<BeirQuery>> {
    let mut queries = Vec::new();
    let mut seen = HashMap::new();
    for_each_line(reader, path, |at, line| {
        let raw: RawQuery = serde_json::from_str(line)
            .map_err(|e| at.err(format!("not a query {{\"_id\", \"text\"}}: {e}")))?;
        let id = raw.id.into_string();
        check_new_id(at, &id, &mut seen)?;
        if raw.text.trim().is_empty() {
            return Err(at.err(format!("query {id:?} has an empty text")));
        }
        queries.push(BeirQuery { id, text: raw.text });
        Ok(())
    })?;
    Ok(queries)
}

fn read_qrels(reader: impl BufRead, path: &str) -> Result<Qrels> {
    let mut qrels = Qrels::new();
    let mut first = true;
    for_each_line(reader, path, |at, line| {
        let cols: Vec<&str> = line.split('\t').map(str::trim).collect();
        let is_first = std::mem::replace(&mut first, false);
        if cols.len() != 3 {
            return Err(at.err(format!(
                "expected 3 tab-separated columns (query-id, corpus-id, score), found {}",
                cols.len()
            )));
        }
        let Ok(score) = cols[2].parse::<i64>() else {
            // The first line may be a header such as `query-id corpus-id score`.
            if is_first {
                return Ok(());
            }
            return Err(at.err(format!("score {:?} is not an integer", cols[2])));
        };
        let (query, doc) = (cols[0], cols[1]);
        if query.is_empty() || doc.is_empty() {
            return Err(at.err("query-id and corpus-id must not be empty"));
        }
        let judged = qrels.entry(query.to_owned()).or_default();
        match judged.insert(doc.to_owned(), score) {
            Some(previous) if previous != score => Err(at.err(format!(
                "({query:?}, {doc:?}) is judged {previous} earlier and {score} here"
            ))),
            _ => Ok(()),
        }
    })?;
    Ok(qrels)
}

// ---------------------------------------------------------------------------------------------
// 2. Documents as nodes
// ---------------------------------------------------------------------------------------------

/// Longest abstract taken from a document's text when it has no title, in characters.
pub const MAX_DERIVED_ABSTRACT_CHARS: usize = 200;

/// The layers a document becomes, `(abstract, content)`: the title is the L0 abstract, or,
/// without a title, the first sentence of the text (at most
/// [`MAX_DERIVED_ABSTRACT_CHARS`]); the text is the L2 content. There is no L1.
pub fn doc_text(doc: &BeirDoc) -> (String, String) {
    let title = doc.title.trim();
    let abstract_text = if title.is_empty() {
        first_sentence(&doc.text, MAX_DERIVED_ABSTRACT_CHARS)
    } else {
        title.to_owned()
    };
    (abstract_text, doc.text.clone())
}

/// The first sentence of `text`, cut to `max_chars` (at a space when there is one).
fn first_sentence(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    let mut chars = text.char_indices().peekable();
    let mut end = text.len();
    while let Some((i, c)) = chars.next() {
        let ends = match c {
            '。' | '！' | '？' => true,
            // `3.5` and `a.b` do not end a sentence; `. ` and a final `.` do.
            '.' | '!' | '?' => chars.peek().is_none_or(|&(_, next)| next.is_whitespace()),
            _ => false,
        };
        if ends {
            end = i + c.len_utf8();
            break;
        }
    }
    let sentence = &text[..end];
    match sentence.char_indices().nth(max_chars) {
        None => sentence.to_owned(),
        Some((cut, _)) => {
            let head = &sentence[..cut];
            match head.rfind(char::is_whitespace) {
                Some(space) if space > 0 => head[..space].trim_end().to_owned(),
                _ => head.to_owned(),
            }
        }
    }
}

/// The URI segment naming the document `id`: `A–Z a–z 0–9 - _ .` are kept and every other
/// byte is percent-encoded (`%XX`, upper-case hex), as are a leading `.` (so `.`, `..` and
/// dot-names never appear) and the first byte of a name the node layout reserves. The empty
/// id (which [`load_beir`] rejects) maps to `%`.
///
/// The result is always a valid segment ([`CtxUri::join`]), and decoding `%XX` gives back
/// `id`, so the mapping is injective.
pub fn doc_uri_segment(id: &str) -> String {
    if id.is_empty() {
        return "%".to_owned();
    }
    let mut out = String::with_capacity(id.len());
    for (i, b) in id.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if RESERVED_SEGMENTS.contains(&out.as_str()) {
        // Only `content.md` can get here (the others start with `.`).
        let first = out.as_bytes()[0];
        out.replace_range(..1, &format!("%{first:02X}"));
    }
    out
}

/// The node URI of every document under one base, and the way back from a hit's URI to the
/// document id.
#[derive(Debug, Clone)]
pub struct DocUris {
    uris: Vec<CtxUri>,
    ids: HashMap<CtxUri, String>,
    folders: Vec<CtxUri>,
    folder_set: HashSet<CtxUri>,
}

impl DocUris {
    /// Maps every document of `corpus` to `base/<doc_uri_segment(id)>`, or with a
    /// `folder_size` of n > 0 to `base/<folder>/<doc_uri_segment(id)>`, the documents in
    /// corpus order n to a folder ([`folder_segment`]): BEIR corpora have no folders, and a
    /// corpus grouped by topic in its order (as `eval/ce-small` is, ten per topic) gets
    /// one folder per topic, for hierarchical search to descend into. Fails only when a URI
    /// would exceed the URI length limit.
    pub fn new(base: &CtxUri, corpus: &[BeirDoc], folder_size: usize) -> Result<Self> {
        let mut uris = Vec::with_capacity(corpus.len());
        let mut ids = HashMap::with_capacity(corpus.len());
        let mut folders = Vec::new();
        for (i, doc) in corpus.iter().enumerate() {
            let parent = match folder_size {
                0 => base.clone(),
                n => {
                    if i % n == 0 {
                        folders.push(base.join(&folder_segment(i / n)).map_err(CoreError::from)?);
                    }
                    folders.last().expect("pushed at i % n == 0").clone()
                }
            };
            let uri = parent
                .join(&doc_uri_segment(&doc.id))
                .map_err(CoreError::from)?;
            ids.insert(uri.clone(), doc.id.clone());
            uris.push(uri);
        }
        debug_assert_eq!(ids.len(), uris.len(), "doc_uri_segment is injective");
        let folder_set = folders.iter().cloned().collect();
        Ok(DocUris {
            uris,
            ids,
            folders,
            folder_set,
        })
    }

    /// The node URI of each document, in corpus order.
    pub fn uris(&self) -> &[CtxUri] {
        &self.uris
    }

    /// The folders the documents are grouped in, in order (none without a folder size).
    pub fn folders(&self) -> &[CtxUri] {
        &self.folders
    }

    /// The document stored at `uri`; `None` for a node that is not a document of the corpus.
    pub fn doc_id(&self, uri: &CtxUri) -> Option<&str> {
        self.ids.get(uri).map(String::as_str)
    }

    /// Whether `uri` is one of [`DocUris::folders`].
    pub fn is_folder(&self, uri: &CtxUri) -> bool {
        self.folder_set.contains(uri)
    }
}

/// The name of the `i`-th folder (from 0) of a `--folder-size` layout: `group-0001`, … A
/// folder and a document never share a parent, so the names cannot collide.
pub fn folder_segment(i: usize) -> String {
    format!("group-{:04}", i + 1)
}

// ---------------------------------------------------------------------------------------------
// 3. Evaluation
// ---------------------------------------------------------------------------------------------

/// The cutoff of the recall reported beside the metrics at k (BEIR's recall@100).
pub const RECALL_DEPTH: usize = 100;

/// Largest cutoff `k`.
pub const MAX_K: usize = 1000;

/// The search under evaluation: `(mode, query text, n)` → up to `n` `(document id, score)`
/// pairs, best first.
pub type SearchFn<'a> = dyn FnMut(&str, &str, usize) -> Result<Vec<(String, f32)>> + 'a;

/// One query's ranking in one mode, as [`evaluate`] scored it.
#[derive(Debug, Clone, Copy)]
pub struct QueryRun<'a> {
    /// The mode.
    pub mode: &'a str,
    /// The query's id.
    pub query_id: &'a str,
    /// Up to [`EvalReport::depth`] distinct document ids with their scores, best first
    /// (without the query's own id).
    pub ranking: &'a [(&'a str, f32)],
    /// Queries of this mode run so far, this one included.
    pub done: usize,
    /// Queries of this mode in all.
    pub total: usize,
}

/// Called by [`evaluate`] after every query (progress, run files).
pub type OnQuery<'a> = dyn FnMut(&QueryRun<'_>) -> Result<()> + 'a;

/// What [`evaluate`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// The cutoff of nDCG, recall and MRR.
    pub k: usize,
    /// Documents ranked per query: the larger of `k` and [`RECALL_DEPTH`].
    pub depth: usize,
    /// Documents in the corpus.
    pub documents: usize,
    /// Queries in the queries file.
    pub queries: usize,
    /// Queries run and scored: those with at least one relevant judgment.
    pub evaluated_queries: usize,
    /// Queries skipped because no qrel judges a document relevant (score > 0) for them.
    pub skipped_queries: usize,
    /// Relevant judgments (score > 0) of the evaluated queries.
    pub relevant_judgments: usize,
    /// Qrel lines whose query is not in the queries file (ignored).
    pub qrels_unknown_queries: usize,
    /// Relevant judgments of evaluated queries whose document is not in the corpus (kept:
    /// they count as relevant and can never be found).
    pub qrels_unknown_documents: usize,
    /// One entry per mode, in the order asked.
    pub modes: Vec<ModeReport>,
}

/// Quality and speed of one search mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeReport {
    /// The mode (`vector`, `keyword`, `hybrid`, ...).
    pub mode: String,
    /// Mean nDCG@k.
    pub ndcg: f64,
    /// Mean recall@k.
    pub recall: f64,
    /// Mean MRR@k (reciprocal rank of the first relevant hit within k, else 0).
    pub mrr: f64,
    /// Mean recall@100 ([`RECALL_DEPTH`]), whatever k is.
    pub recall_100: f64,
    /// Latency of one search call (asking for [`EvalReport::depth`] documents).
    pub latency: LatencyReport,
}

/// Latency percentiles (nearest rank) over a mode's search calls, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyReport {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

impl EvalReport {
    /// The report as a text table, one row per mode.
    pub fn human(&self) -> String {
        let mut out = format!(
            "{} documents, {} of {} queries evaluated ({} without a relevant qrel)\n",
            self.documents, self.evaluated_queries, self.queries, self.skipped_queries
        );
        if self.qrels_unknown_queries + self.qrels_unknown_documents > 0 {
            out.push_str(&format!(
                "qrels: {} lines name an unknown query, {} relevant documents are not in the \
                 corpus\n",
                self.qrels_unknown_queries, self.qrels_unknown_documents
            ));
        }
        let k = self.k;
        out.push_str(&format!(
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "mode",
            format!("nDCG@{k}"),
            format!("R@{k}"),
            format!("MRR@{k}"),
            format!("R@{RECALL_DEPTH}"),
            "p50 ms",
            "p99 ms"
        ));
        for m in &self.modes {
            out.push_str(&format!(
                "{:<10} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.2} {:>9.2}\n",
                m.mode, m.ndcg, m.recall, m.mrr, m.recall_100, m.latency.p50_ms, m.latency.p99_ms
            ));
        }
        out
    }
}

/// Refuses an empty list of modes or one that names a mode twice.
pub fn check_modes(modes: &[String]) -> Result<()> {
    if modes.is_empty() {
        return Err(CliError::Usage("no search mode to evaluate".into()));
    }
    if let Some((i, dup)) = modes
        .iter()
        .enumerate()
        .find(|(i, m)| modes[..*i].contains(m))
    {
        return Err(CliError::Usage(format!(
            "search mode {dup:?} is listed twice (positions {} and {})",
            modes[..i].iter().position(|m| m == dup).unwrap_or(0) + 1,
            i + 1
        )));
    }
    Ok(())
}

/// Runs every query that has a relevant judgment through `search(mode, query, n)` for each
/// mode (all queries of a mode, then the next mode), scores the ranking it returns (nDCG,
/// recall and MRR at `k`, recall at [`RECALL_DEPTH`]) and hands it to `on_query`.
///
/// Each search is asked for `depth` = max(`k`, [`RECALL_DEPTH`]) documents, best first.
/// Repeated ids count once (at their first rank); ids outside the corpus count as not
/// relevant. As BEIR does by default, a document whose id equals the query's id is dropped
/// from the ranking; for such queries `search` is asked for `depth + 1` ids so that `depth`
/// remain.
pub fn evaluate(
    data: &BeirData,
    modes: &[String],
    k: usize,
    search: &mut SearchFn<'_>,
    on_query: &mut OnQuery<'_>,
) -> Result<EvalReport> {
    if k == 0 {
        return Err(CliError::Usage("k must be at least 1".into()));
    }
    check_modes(modes)?;
    let depth = k.max(RECALL_DEPTH);
    let doc_ids: HashSet<&str> = data.corpus.iter().map(|d| d.id.as_str()).collect();
    let query_ids: HashSet<&str> = data.queries.iter().map(|q| q.id.as_str()).collect();
    let qrels_unknown_queries = data
        .qrels
        .iter()
        .filter(|(q, _)| !query_ids.contains(q.as_str()))
        .map(|(_, judged)| judged.len())
        .sum();

    // The queries to run, with their judgments.
    let mut evaluated = Vec::new();
    let mut relevant_judgments = 0;
    let mut qrels_unknown_documents = 0;
    for query in &data.queries {
        let Some(judged) = data.qrels.get(&query.id) else {
            continue;
        };
        let relevant: Vec<&str> = judged
            .iter()
            .filter(|&(_, &score)| score > 0)
            .map(|(d, _)| d.as_str())
            .collect();
        if relevant.is_empty() {
            continue;
        }
        relevant_judgments += relevant.len();
        qrels_unknown_documents += relevant.iter().filter(|d| !doc_ids.contains(*d)).count();
        evaluated.push((query, judged));
    }
    if evaluated.is_empty() {
        return Err(CliError::Usage(
            "no query has a relevant judgment (a qrel with score > 0): nothing to evaluate".into(),
        ));
    }

    let mut reports = Vec::with_capacity(modes.len());
    for mode in modes {
        let (mut ndcg, mut recall, mut mrr, mut recall_100) = (0.0, 0.0, 0.0, 0.0);
        let mut latencies = Vec::with_capacity(evaluated.len());
        for (done, &(query, judged)) in evaluated.iter().enumerate() {
            let fetch = if doc_ids.contains(query.id.as_str()) {
                depth + 1
            } else {
                depth
            };
            let started = Instant::now();
            let hits = search(mode, &query.text, fetch)?;
            latencies.push(started.elapsed());
            let ranked = ranking(&hits, &query.id, depth);
            let ids: Vec<&str> = ranked.iter().map(|&(id, _)| id).collect();
            ndcg += ndcg_at_k(&ids, judged, k);
            recall += recall_at_k(&ids, judged, k);
            mrr += mrr_at_k(&ids, judged, k);
            recall_100 += recall_at_k(&ids, judged, RECALL_DEPTH);
            on_query(&QueryRun {
                mode,
                query_id: &query.id,
                ranking: &ranked,
                done: done + 1,
                total: evaluated.len(),
            })?;
        }
        let n = evaluated.len() as f64;
        reports.push(ModeReport {
            mode: mode.clone(),
            ndcg: ndcg / n,
            recall: recall / n,
            mrr: mrr / n,
            recall_100: recall_100 / n,
            latency: latency_report(&mut latencies),
        });
    }
    Ok(EvalReport {
        k,
        depth,
        documents: data.corpus.len(),
        queries: data.queries.len(),
        evaluated_queries: evaluated.len(),
        skipped_queries: data.queries.len() - evaluated.len(),
        relevant_judgments,
        qrels_unknown_queries,
        qrels_unknown_documents,
        modes: reports,
    })
}

/// The first `depth` distinct ids of `hits` with their scores, without `query_id`.
fn ranking<'a>(hits: &'a [(String, f32)], query_id: &str, depth: usize) -> Vec<(&'a str, f32)> {
    let mut seen = HashSet::new();
    hits.iter()
        .map(|(id, score)| (id.as_str(), *score))
        .filter(|&(id, _)| id != query_id && seen.insert(id))
        .take(depth)
        .collect()
}

/// The gain of a document: its score when relevant (> 0), else 0.
fn gain(judged: &BTreeMap<String, i64>, id: &str) -> f64 {
    match judged.get(id) {
        Some(&score) if score > 0 => score as f64,
        _ => 0.0,
    }
}

/// The discount of the 0-based `rank`: 1 / log2(rank + 2), i.e. log2(position + 1).
fn discount(rank: usize) -> f64 {
    1.0 / ((rank + 2) as f64).log2()
}

/// nDCG@k with linear gains (the qrel score) and a log2 discount, normalized by the DCG of
/// the ideal ranking of all judged documents (trec_eval `ndcg_cut`).
fn ndcg_at_k(ranked: &[&str], judged: &BTreeMap<String, i64>, k: usize) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(rank, id)| gain(judged, id) * discount(rank))
        .sum();
    let mut ideal: Vec<f64> = judged
        .values()
        .filter(|&&s| s > 0)
        .map(|&s| s as f64)
        .collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(rank, g)| g * discount(rank))
        .sum();
    if idcg > 0.0 { dcg / idcg } else { 0.0 }
}

/// Relevant documents in the top `k` over all relevant documents.
fn recall_at_k(ranked: &[&str], judged: &BTreeMap<String, i64>, k: usize) -> f64 {
    let relevant = judged.values().filter(|&&s| s > 0).count();
    if relevant == 0 {
        return 0.0;
    }
    let found = ranked
        .iter()
        .take(k)
        .filter(|id| gain(judged, id) > 0.0)
        .count();
    found as f64 / relevant as f64
}

/// 1 / position of the first relevant document within the top `k`, else 0.
fn mrr_at_k(ranked: &[&str], judged: &BTreeMap<String, i64>, k: usize) -> f64 {
    ranked
        .iter()
        .take(k)
        .position(|id| gain(judged, id) > 0.0)
        .map_or(0.0, |rank| 1.0 / (rank + 1) as f64)
}

/// Nearest-rank percentiles of `latencies` (sorted in place; not empty).
fn latency_report(latencies: &mut [Duration]) -> LatencyReport {
    latencies.sort_unstable();
    let at = |p: f64| {
        let rank = (p * latencies.len() as f64).ceil() as usize;
        ms_of(latencies[rank.clamp(1, latencies.len()) - 1])
    };
    LatencyReport {
        p50_ms: at(0.50),
        p99_ms: at(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|&(d, s)| (d.to_owned(), s)).collect()
    }

    /// `ids` with decreasing scores, as a search returns them.
    fn scored(ids: &[&str]) -> Vec<(String, f32)> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| ((*id).to_owned(), 1.0 / (i + 1) as f32))
            .collect()
    }

    /// An [`OnQuery`] that keeps nothing.
    fn ignore(_: &QueryRun<'_>) -> Result<()> {
        Ok(())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn corpus_err(input: &str) -> String {
        read_corpus(input.as_bytes(), "corpus.jsonl")
            .expect_err("bad input")
            .to_string()
    }

    fn qrels_err(input: &str) -> String {
        read_qrels(input.as_bytes(), "qrels.tsv")
            .expect_err("bad input")
            .to_string()
    }

    #[test]
    fn ndcg_matches_hand_computed_values() {
        // Graded: d1 = 2, d2 = 1. Ranking [x, d2, d1]:
        // DCG = 0 + 1/log2(3) + 2/log2(4) = 0.6309298 + 1 = 1.6309298
        // IDCG = 2/log2(2) + 1/log2(3) = 2.6309298
        let j = judged(&[("d1", 2), ("d2", 1), ("d3", 0)]);
        let got = ndcg_at_k(&["x", "d2", "d1"], &j, 10);
        assert!(
            close(got, 1.630_929_753_571_457 / 2.630_929_753_571_457),
            "{got}"
        );
        // Perfect ranking.
        assert!(close(ndcg_at_k(&["d1", "d2"], &j, 10), 1.0));
        // Cut at k = 1: the relevant docs are below the cut.
        assert!(close(ndcg_at_k(&["x", "d2", "d1"], &j, 1), 0.0));
        // Judged non-relevant documents have no gain.
        assert!(close(ndcg_at_k(&["d3"], &j, 10), 0.0));
    }

    #[test]
    fn ideal_dcg_is_cut_at_k() {
        // Three relevant docs, k = 2: IDCG uses only the best two gains (1 + 1/log2(3)).
        let j = judged(&[("a", 1), ("b", 1), ("c", 1)]);
        let got = ndcg_at_k(&["a", "x"], &j, 2);
        assert!(close(got, 1.0 / (1.0 + 1.0 / 3f64.log2())), "{got}");
        assert!(close(recall_at_k(&["a", "x"], &j, 2), 1.0 / 3.0));
    }

    #[test]
    fn recall_and_mrr_match_hand_computed_values() {
        let j = judged(&[("d1", 1), ("d2", 2), ("d3", 0)]);
        assert!(close(recall_at_k(&["d3", "d2", "x"], &j, 10), 0.5));
        assert!(close(recall_at_k(&["d1", "d2"], &j, 1), 0.5));
        assert!(close(mrr_at_k(&["d3", "x", "d1"], &j, 10), 1.0 / 3.0));
        assert!(close(mrr_at_k(&["d3", "x", "d1"], &j, 2), 0.0));
        assert!(close(mrr_at_k(&[], &j, 10), 0.0));
    }

    /// Three queries with known rankings, averaged:
    /// - q1 (d1 = 1): ranked [d1] → nDCG 1, recall 1, MRR 1;
    /// - q2 (d2 = 2, d3 = 1): ranked [x, d3, d2] → nDCG (1/log2 3 + 2/2) / (2 + 1/log2 3),
    ///   recall 1, MRR 1/2;
    /// - q3 (d4 = 1): ranked [x, y] → 0, 0, 0.
    #[test]
    fn evaluate_averages_a_three_query_toy_case() {
        let data = toy_data();
        let mut calls = Vec::new();
        let mut search = |mode: &str, query: &str, n: usize| -> Result<Vec<(String, f32)>> {
            calls.push((mode.to_owned(), query.to_owned(), n));
            let ids: &[&str] = match query {
                "first" => &["d1"],
                "second" => &["x", "d3", "d3", "d2"],
                _ => &["x", "y"],
            };
            Ok(scored(ids))
        };
        let modes = vec!["vector".to_owned(), "keyword".to_owned()];
        let mut runs = Vec::new();
        let mut keep = |r: &QueryRun<'_>| -> Result<()> {
            let ids: Vec<String> = r.ranking.iter().map(|(id, _)| (*id).to_owned()).collect();
            runs.push((
                r.mode.to_owned(),
                r.query_id.to_owned(),
                ids,
                r.done,
                r.total,
            ));
            Ok(())
        };
        let report = evaluate(&data, &modes, 10, &mut search, &mut keep).expect("evaluates");

        let l3 = 1.0 / 3f64.log2();
        let q2 = (l3 + 1.0) / (2.0 + l3);
        assert_eq!(report.modes.len(), 2);
        for m in &report.modes {
            assert!(close(m.ndcg, (1.0 + q2) / 3.0), "{m:?}");
            assert!(close(m.recall, 2.0 / 3.0), "{m:?}");
            assert!(close(m.mrr, 1.5 / 3.0), "{m:?}");
            // Everything found is within 10, so recall@100 is recall@10.
            assert!(close(m.recall_100, 2.0 / 3.0), "{m:?}");
            assert!(m.latency.p50_ms <= m.latency.p99_ms);
        }
        assert_eq!(report.modes[0].mode, "vector");
        assert_eq!(report.queries, 5);
        assert_eq!(report.evaluated_queries, 3);
        // q4 has no qrels, q5 only a score-0 judgment.
        assert_eq!(report.skipped_queries, 2);
        assert_eq!(report.relevant_judgments, 4);
        assert_eq!(report.qrels_unknown_queries, 1);
        assert_eq!(report.qrels_unknown_documents, 1);
        // Mode-major order, RECALL_DEPTH ids asked for each query (k is below it).
        assert_eq!(report.depth, RECALL_DEPTH);
        let asked: Vec<_> = calls
            .iter()
            .map(|(m, q, n)| (m.as_str(), q.as_str(), *n))
            .collect();
        assert_eq!(
            asked,
            [
                ("vector", "first", 100),
                ("vector", "second", 100),
                ("vector", "third", 100),
                ("keyword", "first", 100),
                ("keyword", "second", 100),
                ("keyword", "third", 100),
            ]
        );
        // Every query's ranking is handed on, deduplicated, with the progress count.
        assert_eq!(runs.len(), 6);
        assert_eq!(
            runs[1],
            (
                "vector".to_owned(),
                "q2".to_owned(),
                vec!["x".to_owned(), "d3".to_owned(), "d2".to_owned()],
                2,
                3
            )
        );
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["modes"][1]["mode"], "keyword");
        assert!(report.human().contains("nDCG@10"));
    }

    fn toy_data() -> BeirData {
        let doc = |id: &str| BeirDoc {
            id: id.into(),
            title: String::new(),
            text: format!("text of {id}"),
        };
        let query = |id: &str, text: &str| BeirQuery {
            id: id.into(),
            text: text.into(),
        };
        let qrels = "query-id\tcorpus-id\tscore\n\
                     q1\td1\t1\n\
                     q2\td2\t2\nq2\td3\t1\nq2\tx\t0\n\
                     q3\td4\t1\n\
                     q5\td1\t0\n\
                     q9\td1\t1\n";
        BeirData {
            corpus: ["d1", "d2", "d3", "x", "y"].into_iter().map(doc).collect(),
            queries: vec![
                query("q1", "first"),
                query("q2", "second"),
                query("q3", "third"),
                query("q4", "fourth"),
                query("q5", "fifth"),
            ],
            qrels: read_qrels(qrels.as_bytes(), "qrels.tsv").expect("valid qrels"),
        }
    }

    #[test]
    fn a_document_with_the_query_id_is_dropped_and_one_more_is_asked_for() {
        let data = BeirData {
            corpus: ["q1", "d1", "d2"]
                .into_iter()
                .map(|id| BeirDoc {
                    id: id.into(),
                    title: String::new(),
                    text: "t".into(),
                })
                .collect(),
            queries: vec![BeirQuery {
                id: "q1".into(),
                text: "query".into(),
            }],
            qrels: [("q1".to_owned(), judged(&[("d2", 1)]))].into(),
        };
        let mut asked = 0;
        let mut search = |_: &str, _: &str, n: usize| -> Result<Vec<(String, f32)>> {
            asked = n;
            Ok(scored(&["q1", "d1", "d2"]))
        };
        let report = evaluate(&data, &["hybrid".to_owned()], 2, &mut search, &mut ignore)
            .expect("evaluates");
        assert_eq!(asked, RECALL_DEPTH + 1);
        // Ranking without q1 is [d1, d2]: the relevant doc is second.
        assert!(close(report.modes[0].mrr, 0.5));
        assert!(close(report.modes[0].recall, 1.0));
    }

    #[test]
    fn recall_at_100_counts_what_lies_below_k() {
        let ids: Vec<String> = (0..1200).map(|i| format!("d{i}")).collect();
        let data = BeirData {
            corpus: ids
                .iter()
                .map(|id| BeirDoc {
                    id: id.clone(),
                    title: String::new(),
                    text: "t".into(),
                })
                .collect(),
            queries: vec![BeirQuery {
                id: "q1".into(),
                text: "query".into(),
            }],
            // Relevant: rank 50 (outside the top 10, inside the top 100) and rank 600.
            qrels: [("q1".to_owned(), judged(&[("d49", 1), ("d599", 1)]))].into(),
        };
        let all: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut search = |_: &str, _: &str, n: usize| -> Result<Vec<(String, f32)>> {
            Ok(scored(&all[..n.min(all.len())]))
        };
        let one = ["keyword".to_owned()];
        let r = evaluate(&data, &one, 10, &mut search, &mut ignore).expect("evaluates");
        let m = &r.modes[0];
        assert!(close(m.recall, 0.0) && close(m.ndcg, 0.0), "{m:?}");
        assert!(close(m.recall_100, 0.5), "{m:?}");
        // k = 1000 ranks 1000 deep: both relevant documents are found.
        let mut depths = Vec::new();
        let mut keep = |q: &QueryRun<'_>| -> Result<()> {
            depths.push(q.ranking.len());
            Ok(())
        };
        let r = evaluate(&data, &one, MAX_K, &mut search, &mut keep).expect("evaluates");
        assert_eq!((r.depth, depths), (MAX_K, vec![MAX_K]));
        assert!(close(r.modes[0].recall, 1.0) && close(r.modes[0].recall_100, 0.5));
        assert!(r.human().contains("R@1000") && r.human().contains("R@100 "));
    }

    #[test]
    fn evaluate_rejects_what_it_cannot_measure() {
        let data = toy_data();
        let mut search = |_: &str, _: &str, _: usize| -> Result<Vec<(String, f32)>> { Ok(vec![]) };
        let one = ["vector".to_owned()];
        assert!(matches!(
            evaluate(&data, &one, 0, &mut search, &mut ignore),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            evaluate(&data, &[], 10, &mut search, &mut ignore),
            Err(CliError::Usage(_))
        ));
        let twice = [
            "vector".to_owned(),
            "keyword".to_owned(),
            "vector".to_owned(),
        ];
        let err =
            evaluate(&data, &twice, 10, &mut search, &mut ignore).expect_err("duplicate mode");
        assert!(err.to_string().contains("positions 1 and 3"), "{err}");
        let unjudged = BeirData {
            qrels: Qrels::new(),
            ..data.clone()
        };
        assert!(matches!(
            evaluate(&unjudged, &one, 10, &mut search, &mut ignore),
            Err(CliError::Usage(_))
        ));
        // A failing search fails the evaluation.
        let mut failing = |_: &str, _: &str, _: usize| -> Result<Vec<(String, f32)>> {
            Err(CliError::Usage("engine down".into()))
        };
        assert!(evaluate(&data, &one, 10, &mut failing, &mut ignore).is_err());
    }

    #[test]
    fn latency_percentiles_use_nearest_rank() {
        let mut l: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let r = latency_report(&mut l);
        assert!(close(r.p50_ms, 50.0) && close(r.p99_ms, 99.0), "{r:?}");
        let r = latency_report(&mut [Duration::from_micros(1500)]);
        assert!(close(r.p50_ms, 1.5) && close(r.p99_ms, 1.5), "{r:?}");
    }

    #[test]
    fn corpus_loads_with_missing_titles_numeric_ids_and_blank_lines() {
        let input = "\u{feff}{\"_id\":\"a\",\"title\":\"T\",\"text\":\"x\",\"metadata\":{}}\r\n\
                     \n\
                     {\"_id\":7,\"text\":\"y\"}\n\
                     {\"_id\":\"c\",\"title\":null,\"text\":\"\"}";
        let docs = read_corpus(input.as_bytes(), "corpus.jsonl").expect("valid");
        let ids: Vec<_> = docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a", "7", "c"]);
        assert_eq!(docs[0].title, "T");
        assert_eq!(docs[1].title, "");
        assert_eq!(docs[2].title, "");
    }

    #[test]
    fn loader_errors_name_file_and_line() {
        let e = corpus_err("{\"_id\":\"a\",\"text\":\"x\"}\n\n{\"_id\":\"b\"}\n");
        assert!(e.starts_with("corpus.jsonl:3: "), "{e}");
        assert!(e.contains("text"), "{e}");
        let e = corpus_err("{\"_id\":\"a\",\"text\":\"x\"}\nnot json\n");
        assert!(e.starts_with("corpus.jsonl:2: "), "{e}");
        let e = corpus_err("{\"_id\":\"a\",\"text\":\"x\"}\n{\"_id\":\"a\",\"text\":\"y\"}\n");
        assert!(
            e.contains("corpus.jsonl:2: ") && e.contains("line 1"),
            "{e}"
        );
        let e = corpus_err("{\"_id\":\"\",\"text\":\"x\"}\n");
        assert!(e.contains("corpus.jsonl:1: _id is empty"), "{e}");
        let bad_utf8 = read_corpus(&b"\xff\xfe\n"[..], "c.jsonl").expect_err("not utf-8");
        assert!(
            bad_utf8.to_string().starts_with("c.jsonl:1: not UTF-8"),
            "{bad_utf8}"
        );

        let e = read_queries(
            "{\"_id\":\"q\",\"text\":\"  \"}".as_bytes(),
            "queries.jsonl",
        )
        .expect_err("blank query");
        assert!(e.to_string().starts_with("queries.jsonl:1: "), "{e}");

        let e = qrels_err("q1\td1\t1\nq1\td2\n");
        assert!(e.starts_with("qrels.tsv:2: expected 3"), "{e}");
        let e = qrels_err("q1\td1\t1\nq1\td2\thigh\n");
        assert!(e.starts_with("qrels.tsv:2: score \"high\""), "{e}");
        let e = qrels_err("q1\td1\t1\nq1\td1\t2\n");
        assert!(
            e.starts_with("qrels.tsv:2: ") && e.contains("judged 1"),
            "{e}"
        );
        let e = qrels_err("q1\t\t1\n");
        assert!(e.starts_with("qrels.tsv:1: "), "{e}");

        let err = read_qrels("a\tb\tc\nq\td\tx\n".as_bytes(), "qrels.tsv").expect_err("bad");
        assert!(matches!(err, CliError::EvalData { line: 2, .. }), "{err:?}");
        assert_eq!(
            ce_core::Classify::code(&err),
            ce_core::ErrorCode::InvalidField
        );
    }

    #[test]
    fn qrels_load_with_or_without_header() {
        let with = read_qrels(
            "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\nq1\td2\t0\n".as_bytes(),
            "q",
        )
        .expect("valid");
        let without = read_qrels("q1\td1\t1\r\nq1\td2\t0\n".as_bytes(), "q").expect("valid");
        assert_eq!(with, without);
        assert_eq!(with["q1"], judged(&[("d1", 1), ("d2", 0)]));
    }

    #[test]
    fn load_beir_reads_files_and_names_a_missing_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n: &str| dir.path().join(n);
        fs_err::write(p("c.jsonl"), "{\"_id\":\"d1\",\"text\":\"x\"}\n").expect("write");
        fs_err::write(p("q.jsonl"), "{\"_id\":\"q1\",\"text\":\"x\"}\n").expect("write");
        fs_err::write(p("r.tsv"), "q1\td1\t1\n").expect("write");
        let data = load_beir(&p("c.jsonl"), &p("q.jsonl"), &p("r.tsv")).expect("loads");
        assert_eq!((data.corpus.len(), data.queries.len()), (1, 1));
        let err = load_beir(&p("c.jsonl"), &p("missing.jsonl"), &p("r.tsv")).expect_err("missing");
        assert!(matches!(err, CliError::Io(_)), "{err:?}");
        assert!(err.to_string().contains("missing.jsonl"), "{err}");
    }

    /// The shipped set loads, every judgment names a known query and document, every query
    /// is judged, and a ranking that lists the judged documents by grade scores 1 everywhere.
    #[test]
    fn the_shipped_ce_small_set_is_consistent() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../eval/ce-small");
        let data = load_beir(
            &dir.join("corpus.jsonl"),
            &dir.join("queries.jsonl"),
            &dir.join("qrels.tsv"),
        )
        .expect("ce-small loads");
        assert_eq!((data.corpus.len(), data.queries.len()), (300, 85));
        let mut oracle = |_: &str, text: &str, n: usize| -> Result<Vec<(String, f32)>> {
            let query = data.queries.iter().find(|q| q.text == text).expect("known");
            let mut judged: Vec<_> = data.qrels[&query.id].iter().collect();
            judged.sort_by_key(|&(_, score)| std::cmp::Reverse(*score));
            Ok(judged
                .into_iter()
                .take(n)
                .map(|(d, _)| (d.clone(), 1.0))
                .collect())
        };
        let report =
            evaluate(&data, &["oracle".to_owned()], 10, &mut oracle, &mut ignore).expect("runs");
        assert_eq!(report.evaluated_queries, 85);
        assert_eq!(report.relevant_judgments, 94);
        assert_eq!(
            (report.qrels_unknown_queries, report.qrels_unknown_documents),
            (0, 0)
        );
        let m = &report.modes[0];
        assert!(
            close(m.ndcg, 1.0) && close(m.recall, 1.0) && close(m.mrr, 1.0),
            "{m:?}"
        );
        let uris = DocUris::new(
            &CtxUri::parse("ctx://eval/resources").expect("valid"),
            &data.corpus,
            0,
        )
        .expect("every id maps to a uri");
        assert_eq!(uris.uris().len(), 300);
        for doc in &data.corpus {
            let (abstract_text, content) = doc_text(doc);
            assert!(
                !abstract_text.is_empty() && !content.is_empty(),
                "{}",
                doc.id
            );
        }
    }

    #[test]
    fn doc_text_uses_the_title_or_the_first_sentence() {
        let doc = |title: &str, text: &str| BeirDoc {
            id: "d".into(),
            title: title.into(),
            text: text.into(),
        };
        let (a, c) = doc_text(&doc(" Title ", "Body. More."));
        assert_eq!((a.as_str(), c.as_str()), ("Title", "Body. More."));
        let first = |text: &str| doc_text(&doc("", text)).0;
        assert_eq!(
            first("Version 3.5 is out. It is fast."),
            "Version 3.5 is out."
        );
        assert_eq!(first("Really? Yes."), "Really?");
        assert_eq!(first("今天下雨。明天晴。"), "今天下雨。");
        assert_eq!(first("no terminator"), "no terminator");
        let long = "word ".repeat(100);
        let a = first(&long);
        assert!(
            a.chars().count() <= MAX_DERIVED_ABSTRACT_CHARS && a.ends_with("word"),
            "{a}"
        );
        let cjk = "字".repeat(300);
        assert_eq!(first(&cjk).chars().count(), MAX_DERIVED_ABSTRACT_CHARS);
    }

    /// Percent-decoding, the inverse of [`doc_uri_segment`].
    fn decode(segment: &str) -> Vec<u8> {
        if segment == "%" {
            return Vec::new();
        }
        let b = segment.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("ascii");
                out.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    #[test]
    fn doc_uri_segments_are_valid_and_injective() {
        let base = CtxUri::parse("ctx://eval/resources").expect("valid");
        let mut ids: Vec<String> = [
            "",
            ".",
            "..",
            "...",
            ".abstract.md",
            ".overview.md",
            "content.md",
            "Content.md",
            ".meta.json",
            ".relations.json",
            "a/b",
            "a\\b",
            "a b ",
            " ",
            "%",
            "%25",
            "%2F",
            "\u{0}",
            "\n",
            "tab\tid",
            "MED-10",
            "doc.1",
            "文档-1",
            "é",
            "e\u{301}",
            "A",
            "a",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        // Every string of length ≤ 3 over an alphabet of troublesome characters.
        let alphabet = ['.', '%', '/', 'c', '2', 'F', ' ', 'é', '\\'];
        let mut frontier = vec![String::new()];
        for _ in 0..3 {
            frontier = frontier
                .iter()
                .flat_map(|s| {
                    alphabet.iter().map(move |c| {
                        let mut t = s.clone();
                        t.push(*c);
                        t
                    })
                })
                .collect();
            ids.extend(frontier.iter().cloned());
        }
        let mut seen = HashMap::new();
        for id in &ids {
            let seg = doc_uri_segment(id);
            let uri = base
                .join(&seg)
                .unwrap_or_else(|e| panic!("{id:?} → {seg:?}: {e}"));
            assert_eq!(uri.name(), seg, "{id:?} keeps its segment as is");
            assert_eq!(decode(&seg), id.as_bytes(), "{id:?} → {seg:?}");
            if let Some(other) = seen.insert(seg.clone(), id.clone()) {
                assert_eq!(&other, id, "{other:?} and {id:?} share {seg:?}");
            }
        }
        assert_eq!(doc_uri_segment("MED-10"), "MED-10");
        assert_eq!(doc_uri_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(doc_uri_segment(".."), "%2E.");
        assert_eq!(doc_uri_segment("content.md"), "%63ontent.md");
    }

    #[test]
    fn doc_uris_map_hits_back_to_ids() {
        let base = CtxUri::parse("ctx://eval/resources").expect("valid");
        let corpus: Vec<BeirDoc> = ["a/b", "a%2Fb", "x"]
            .into_iter()
            .map(|id| BeirDoc {
                id: id.into(),
                title: String::new(),
                text: "t".into(),
            })
            .collect();
        let uris = DocUris::new(&base, &corpus, 0).expect("valid");
        assert_eq!(uris.uris().len(), 3);
        for (doc, uri) in corpus.iter().zip(uris.uris()) {
            assert_eq!(uris.doc_id(uri), Some(doc.id.as_str()));
        }
        assert_eq!(uris.uris()[0].as_str(), "ctx://eval/resources/a%2Fb");
        assert_eq!(uris.doc_id(&base), None);
        let too_long = [BeirDoc {
            id: "/".repeat(2000),
            title: String::new(),
            text: String::new(),
        }];
        assert!(matches!(
            DocUris::new(&base, &too_long, 0),
            Err(CliError::Core(CoreError::InvalidUri(_)))
        ));
    }

    #[test]
    fn a_folder_size_groups_documents_in_corpus_order() {
        let base = CtxUri::parse("ctx://eval/resources").expect("valid");
        let corpus: Vec<BeirDoc> = (1..=7)
            .map(|i| BeirDoc {
                id: format!("d{i}"),
                title: String::new(),
                text: "t".into(),
            })
            .collect();
        let uris = DocUris::new(&base, &corpus, 3).expect("valid");
        let folders: Vec<&str> = uris.folders().iter().map(CtxUri::as_str).collect();
        assert_eq!(
            folders,
            [
                "ctx://eval/resources/group-0001",
                "ctx://eval/resources/group-0002",
                "ctx://eval/resources/group-0003"
            ]
        );
        let groups: Vec<usize> = uris
            .uris()
            .iter()
            .map(|u| {
                let parent = u.parent().expect("below a folder");
                uris.folders()
                    .iter()
                    .position(|f| *f == parent)
                    .expect("a folder")
                    + 1
            })
            .collect();
        assert_eq!(groups, [1, 1, 1, 2, 2, 2, 3]);
        for (doc, uri) in corpus.iter().zip(uris.uris()) {
            assert_eq!(uris.doc_id(uri), Some(doc.id.as_str()));
        }
        assert_eq!(uris.doc_id(&uris.folders()[0]), None);
    }
}

// ---------------------------------------------------------------------------------------------
// 4. `ce eval`: index the corpus in a data directory, then evaluate every mode
// ---------------------------------------------------------------------------------------------

/// Where the corpus is stored.
pub const EVAL_BASE: &str = "ctx://eval/resources";
/// Documents per write transaction while loading the corpus.
const LOAD_CHUNK: usize = 500;
/// Most index records a node becomes (one per level), hence most texts a delivery embeds.
const RECORDS_PER_DOC: u64 = 3;
/// Shortest time between two progress lines of a stage.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// How a BEIR document becomes a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// CE's layers: the title (or the first sentence) as the L0 abstract, the text as the L2
    /// content; every level is searched.
    Layered,
    /// The standard BEIR document text: `title + " " + text` as the L2 content, the one
    /// text published BEIR baselines embed and index; only L2 is searched.
    Beir,
    /// The BEIR document text as the L2 content and L0 / L1 derived from it by the `derive`
    /// consumer (docs/derive.md), every level searched: what derived layers add to the
    /// `beir` layout.
    Derived,
}

impl Layout {
    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Layered => "layered",
            Layout::Beir => "beir",
            Layout::Derived => "derived",
        }
    }

    /// The write that stores `doc` in this layout (replace mode: nothing of an earlier
    /// layout is left).
    pub fn put_request(self, doc: &BeirDoc) -> PutRequest {
        match self {
            Layout::Layered => {
                let (abstract_text, content) = doc_text(doc);
                PutRequest {
                    abstract_text: Some(abstract_text),
                    content: Some(content),
                    ..PutRequest::default()
                }
            }
            Layout::Beir | Layout::Derived => PutRequest {
                content: Some(beir_text(doc)),
                ..PutRequest::default()
            },
        }
    }

    /// The level searches are restricted to (`None`: every level).
    pub fn level(self) -> Option<Level> {
        match self {
            Layout::Layered | Layout::Derived => None,
            Layout::Beir => Some(Level::L2),
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = CliError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "layered" => Ok(Layout::Layered),
            "beir" => Ok(Layout::Beir),
            "derived" => Ok(Layout::Derived),
            other => Err(CliError::Usage(format!(
                "--layout {other:?} is not one of \"layered\", \"beir\", \"derived\""
            ))),
        }
    }
}

/// A mode `ce eval` evaluates: a flat search mode, or hierarchical search (its default
/// parameters) over the same vector index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalMode {
    /// `vector`, `keyword` or `hybrid`.
    Flat(SearchMode),
    /// `hierarchical`: seeds on L0 records (the folders' roll-ups when derived), descends.
    Hierarchical,
}

impl EvalMode {
    /// The name on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            EvalMode::Flat(m) => m.as_str(),
            EvalMode::Hierarchical => ce_server::wire::HIERARCHICAL_MODE,
        }
    }

    /// Whether this mode reads the index of `consumer`.
    fn reads(self, consumer: &str) -> bool {
        match self {
            EvalMode::Flat(SearchMode::Keyword) => consumer == KEYWORD_CONSUMER,
            EvalMode::Flat(SearchMode::Vector) | EvalMode::Hierarchical => {
                consumer == VECTOR_CONSUMER
            }
            EvalMode::Flat(SearchMode::Hybrid) => true,
        }
    }
}

impl std::str::FromStr for EvalMode {
    type Err = CliError;

    fn from_str(s: &str) -> Result<Self> {
        if s == ce_server::wire::HIERARCHICAL_MODE {
            return Ok(EvalMode::Hierarchical);
        }
        s.parse().map(EvalMode::Flat).map_err(|_| {
            CliError::Usage(format!(
                "mode {s:?} is not one of \"vector\", \"keyword\", \"hybrid\", \"hierarchical\""
            ))
        })
    }
}

/// BEIR's document text: title and text joined by a space, trimmed (as BEIR's dense
/// retrieval models encode `title + " " + text`).
pub fn beir_text(doc: &BeirDoc) -> String {
    format!("{} {}", doc.title, doc.text).trim().to_owned()
}

/// Options of `ce eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// BEIR corpus (JSON lines: `_id`, `title`, `text`)
    #[arg(long, value_name = "FILE")]
    pub corpus: PathBuf,
    /// BEIR queries (JSON lines: `_id`, `text`)
    #[arg(long, value_name = "FILE")]
    pub queries: PathBuf,
    /// BEIR qrels (TSV: query-id, corpus-id, score; header optional)
    #[arg(long, value_name = "FILE")]
    pub qrels: PathBuf,
    /// Modes to evaluate, comma-separated: `vector`, `keyword`, `hybrid`, `hierarchical`
    #[arg(
        long,
        value_name = "M,..",
        value_delimiter = ',',
        default_value = "vector,keyword,hybrid"
    )]
    pub modes: Vec<String>,
    /// Cutoff of nDCG, recall and MRR (1-1000); recall@100 is reported as well
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub k: usize,
    /// Document layout: `layered` (title as L0, text as L2) or `beir` (title and text as one
    /// text, searched at L2 only, as published BEIR baselines index them)
    #[arg(long, value_name = "L", default_value = "layered")]
    pub layout: String,
    /// Documents per folder: 0 stores the corpus flat under one folder; N > 0 puts the
    /// documents, in corpus order, N to a folder (`group-0001`, …), so hierarchical search
    /// has folders to descend into (`eval/ce-small` is in topic groups of 10)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub folder_size: usize,
    /// Write every query's ranking to FILE as a TREC run (`qid Q0 docid rank score run_tag`,
    /// run tag `ce-<mode>`)
    #[arg(long, value_name = "FILE")]
    pub run_file: Option<PathBuf>,
    /// Directory in which the temporary data directory is created when no --data-dir is given
    /// [default: the system temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

/// Indexing of one index, as [`run`] measured it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexReport {
    /// The index (its consumer): `keyword` or `vector`.
    pub index: String,
    /// Deliveries applied: one per node written or changed since the index was last brought
    /// up to date — the documents, and on the first run their two ancestors (0 when a kept
    /// data directory already held this corpus).
    pub deliveries: u64,
    /// Time to apply them.
    pub ms: f64,
    /// Deliveries per second; `None` when there was nothing to do.
    pub per_second: Option<f64>,
    /// `vector`: texts the model embedded (the others came from the embedding cache).
    pub texts_embedded: Option<u64>,
    /// `vector`: texts answered from the embedding cache.
    pub cache_hits: Option<u64>,
    /// `vector`: the model (`provider:model:dimension`).
    pub model: Option<String>,
}

/// Time spent in each stage of [`run`], in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StageTimings {
    /// Reading the data set.
    pub load_ms: f64,
    /// Writing the corpus into the store.
    pub write_ms: f64,
    /// Building the indexes (every index, see [`EvalOutput::indexes`]).
    pub index_ms: f64,
    /// Running the queries of every mode.
    pub search_ms: f64,
    /// The whole command.
    pub total_ms: f64,
}

/// What `ce eval` reports: the quality figures and how they were obtained.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalOutput {
    /// The figures.
    #[serde(flatten)]
    pub quality: EvalReport,
    /// How documents became nodes.
    pub layout: Layout,
    /// Documents per folder (0: flat).
    pub folder_size: usize,
    /// The data directory the corpus was indexed in.
    pub data_dir: String,
    /// Whether it is kept (`--data-dir`) or was a temporary one, now removed.
    pub data_dir_kept: bool,
    /// The TREC run file written, if any.
    pub run_file: Option<String>,
    /// One entry per index built, in the order they were built.
    pub indexes: Vec<IndexReport>,
    /// Time per stage.
    pub timings: StageTimings,
}

impl EvalOutput {
    /// The report as text: how it was obtained, indexing, then the quality table.
    pub fn human(&self) -> String {
        let layout = match self.layout {
            Layout::Layered => "layered (title as L0, text as L2, every level searched)",
            Layout::Beir => "beir (title and text as one L2 text, L2 searched)",
            Layout::Derived => {
                "derived (title and text as one L2 text, L0 / L1 derived from it, every level searched)"
            }
        };
        let kept = if self.data_dir_kept {
            "kept"
        } else {
            "temporary, removed"
        };
        let folders = match self.folder_size {
            0 => String::new(),
            n => format!(", {n} documents per folder"),
        };
        let mut out = format!(
            "layout {layout}{folders}; data directory {} ({kept})\n",
            self.data_dir
        );
        out.push_str(&format!(
            "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}  model\n",
            "index", "deliveries", "seconds", "per s", "embedded", "cached"
        ));
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        for i in &self.indexes {
            out.push_str(&format!(
                "{:<10} {:>10} {:>10.1} {:>10} {:>10} {:>10}  {}\n",
                i.index,
                i.deliveries,
                i.ms / 1e3,
                i.per_second
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.0}")),
                opt(i.texts_embedded),
                opt(i.cache_hits),
                i.model.as_deref().unwrap_or("-")
            ));
        }
        out.push_str(&self.quality.human());
        if let Some(path) = &self.run_file {
            out.push_str(&format!("run file {path}\n"));
        }
        let t = &self.timings;
        out.push_str(&format!(
            "time: load {:.1} s, write {:.1} s, index {:.1} s, search {:.1} s, total {:.1} s\n",
            t.load_ms / 1e3,
            t.write_ms / 1e3,
            t.index_ms / 1e3,
            t.search_ms / 1e3,
            t.total_ms / 1e3
        ));
        out
    }
}

/// Progress lines on stderr (`eval: …`): at most one per [`PROGRESS_EVERY`] while a stage
/// runs, and always its last one.
struct Progress {
    last: Mutex<Option<Instant>>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            last: Mutex::new(None),
        }
    }

    /// Prints `line()` now.
    fn say(&self, line: impl std::fmt::Display) {
        eprintln!("eval: {line}");
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// Prints `stage done/total unit (elapsed)` unless a line went out less than
    /// [`PROGRESS_EVERY`] ago and the stage is not finished.
    fn tick(&self, stage: &str, done: u64, total: u64, unit: &str, started: Instant) {
        {
            let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if done < total && last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
                return;
            }
        }
        self.say(format_args!(
            "{stage} {done}/{total} {unit} ({:.1} s)",
            started.elapsed().as_secs_f64()
        ));
    }
}

/// The data directory of a run: the user's (`--data-dir`, kept) or a temporary one.
enum WorkDir {
    Kept(PathBuf),
    Temporary(tempfile::TempDir),
}

impl WorkDir {
    fn path(&self) -> &Path {
        match self {
            WorkDir::Kept(p) => p,
            WorkDir::Temporary(t) => t.path(),
        }
    }
}

/// A TREC run file being written.
struct RunFile {
    path: PathBuf,
    out: std::io::BufWriter<fs_err::File>,
}

impl RunFile {
    fn create(path: &Path) -> Result<Self> {
        Ok(RunFile {
            path: path.to_owned(),
            out: std::io::BufWriter::new(fs_err::File::create(path)?),
        })
    }

    /// One line per ranked document: `qid Q0 docid rank score ce-<mode>`.
    fn write(&mut self, run: &QueryRun<'_>) -> Result<()> {
        for (rank, (doc, score)) in run.ranking.iter().enumerate() {
            writeln!(
                self.out,
                "{} Q0 {doc} {} {score} ce-{}",
                run.query_id,
                rank + 1,
                run.mode
            )?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<String> {
        self.out.flush()?;
        Ok(self.path.display().to_string())
    }
}

/// A TREC run file separates its columns by white space: no id may contain any.
fn check_trec_ids(data: &BeirData) -> Result<()> {
    let docs = data.corpus.iter().map(|d| ("document", &d.id));
    let queries = data.queries.iter().map(|q| ("query", &q.id));
    match docs
        .chain(queries)
        .find(|(_, id)| id.chars().any(char::is_whitespace))
    {
        Some((what, id)) => Err(CliError::Usage(format!(
            "{what} id {id:?} contains white space, which a TREC run file (--run-file) cannot \
             hold"
        ))),
        None => Ok(()),
    }
}

/// Refuses a data directory that holds nodes outside `ctx://eval` (the user's own data).
fn check_eval_only(store: &Source, dir: &Path) -> Result<()> {
    let root = CtxUri::parse("ctx://").map_err(CoreError::from)?;
    let eval = CtxUri::parse("ctx://eval").map_err(CoreError::from)?;
    let foreign: Vec<String> = store
        .ls(&root)?
        .into_iter()
        .filter(|n| n.uri != eval)
        .map(|n| n.uri.to_string())
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "the data directory {} holds nodes outside ctx://eval ({}): ce eval works in an empty \
         or eval-only data directory; give another --data-dir, or none for a temporary one",
        dir.display(),
        foreign.join(", ")
    )))
}

/// Writes the corpus under [`EVAL_BASE`] and removes the nodes there that are not in it (a
/// kept data directory may hold another corpus); returns the documents that changed.
fn write_corpus(
    store: &Source,
    data: &BeirData,
    uris: &DocUris,
    layout: Layout,
    progress: &Progress,
) -> Result<u64> {
    let base = CtxUri::parse(EVAL_BASE).map_err(CoreError::from)?;
    // What the base holds that is neither a document nor a folder of this layout, and what
    // this layout's folders hold that is not one of their documents.
    let mut stale = Vec::new();
    if store.read_node(&base)?.is_some() {
        for n in store.ls(&base)? {
            if uris.is_folder(&n.uri) {
                stale.extend(
                    store
                        .ls(&n.uri)?
                        .into_iter()
                        .filter(|c| uris.doc_id(&c.uri).is_none())
                        .map(|c| c.uri),
                );
            } else if uris.doc_id(&n.uri).is_none() {
                stale.push(n.uri);
            }
        }
    }
    let stale: Vec<WriteOp> = stale
        .into_iter()
        .map(|uri| WriteOp::Rm {
            uri,
            recursive: true,
            expect_version: None,
            trace_id: None,
        })
        .collect();
    if !stale.is_empty() {
        progress.say(format_args!(
            "removing {} nodes of another corpus under {EVAL_BASE}",
            stale.len()
        ));
        for chunk in stale.chunks(LOAD_CHUNK) {
            store.apply_batch(chunk.to_vec())?;
        }
    }
    let started = Instant::now();
    let total = data.corpus.len() as u64;
    let (mut done, mut changed) = (0, 0);
    let docs: Vec<(&BeirDoc, &CtxUri)> = data.corpus.iter().zip(uris.uris()).collect();
    for chunk in docs.chunks(LOAD_CHUNK) {
        let ops = chunk
            .iter()
            .map(|(doc, uri)| WriteOp::Put {
                uri: (*uri).clone(),
                req: layout.put_request(doc),
            })
            .collect();
        let outcomes = store.apply_batch(ops)?;
        changed += outcomes.iter().filter(|o| o.changed).count() as u64;
        done += chunk.len() as u64;
        progress.tick("writing", done, total, "documents", started);
    }
    Ok(changed)
}

/// Applies what `consumer` has pending with `engine`'s workers, saying first how much (and,
/// for the vector index, how many texts at most it embeds with which model).
fn build_index(engine: &Engine, consumer: &str, progress: &Progress) -> Result<IndexReport> {
    let lag = engine
        .store()
        .stats()?
        .into_iter()
        .find(|s| s.consumer == consumer)
        .map_or(0, |s| s.pending + s.claimed + s.retry_wait);
    let vector = consumer == VECTOR_CONSUMER;
    let embedder = engine.embedder().ok().filter(|_| vector);
    let model = embedder.map(|e| e.identity().key());
    let before = embedder.map(|e| e.stats());
    match &model {
        Some(model) => progress.say(format_args!(
            "indexing {consumer}: {lag} deliveries, up to {} texts to embed with {model} \
             (texts already in the embedding cache are not embedded again)",
            lag * RECORDS_PER_DOC
        )),
        None => progress.say(format_args!("indexing {consumer}: {lag} deliveries")),
    }
    let started = Instant::now();
    let label = format!("indexing {consumer}");
    let drained = engine.drain(&|p: &DrainProgress| {
        progress.tick(&label, p.succeeded.min(lag), lag, "deliveries", started);
    })?;
    let elapsed = started.elapsed();
    if let Some(blocked) = drained
        .remaining
        .iter()
        .find(|r| r.lag_events > 0 || r.dead > 0)
    {
        let reason = format!(
            "the {} index could not be built: {}",
            blocked.consumer, blocked.validation_reason
        );
        return Err(if engine.readiness().ready {
            CliError::Usage(reason)
        } else {
            ServerError::NotReady {
                reason,
                code: engine.not_ready_code(),
            }
            .into()
        });
    }
    let after = embedder.map(|e| e.stats());
    let delta = |f: fn(&ce_embed::CacheStats) -> u64| {
        before
            .as_ref()
            .zip(after.as_ref())
            .map(|(b, a)| f(a).saturating_sub(f(b)))
    };
    Ok(IndexReport {
        index: consumer.to_owned(),
        deliveries: drained.progress.succeeded,
        ms: ms_of(elapsed),
        per_second: (drained.progress.succeeded > 0)
            .then(|| drained.progress.succeeded as f64 / elapsed.as_secs_f64().max(1e-9)),
        texts_embedded: delta(|s| s.texts_embedded),
        cache_hits: delta(|s| s.hits),
        model,
    })
}

/// Loads the data set, indexes the corpus with `config` (its embedding model, its fusion
/// settings) and evaluates each mode.
///
/// The corpus goes into `data_dir` when given (kept afterwards: a later run on the same
/// corpus and layout finds it indexed; the directory must hold nothing outside
/// `ctx://eval`), else into a temporary directory that is removed. Only the indexes the
/// modes read are built, one after the other (keyword, then vector), so each is timed on its
/// own; without a vector mode no embedder is opened at all.
pub fn run(args: &EvalArgs, mut config: Config, data_dir: Option<&Path>) -> Result<EvalOutput> {
    let started = Instant::now();
    if !(1..=MAX_K).contains(&args.k) {
        return Err(CliError::Usage(format!(
            "--k {} is outside 1..={MAX_K}",
            args.k
        )));
    }
    let layout: Layout = args.layout.parse()?;
    let modes: Vec<EvalMode> = args
        .modes
        .iter()
        .map(|m| m.parse())
        .collect::<Result<_>>()?;
    let names: Vec<String> = modes.iter().map(|m| m.as_str().to_owned()).collect();
    check_modes(&names)?;
    let mut run_file = args.run_file.as_deref().map(RunFile::create).transpose()?;

    // The indexes the modes read: keyword first (seconds), then vector (embedding); in the
    // derived layout, the derivation before them.
    let derives = (layout == Layout::Derived).then_some(DERIVE_CONSUMER);
    let consumers: Vec<&str> = derives
        .into_iter()
        .chain(
            [KEYWORD_CONSUMER, VECTOR_CONSUMER]
                .into_iter()
                .filter(|c| modes.iter().any(|m| m.reads(c))),
        )
        .collect();
    let dir = match data_dir {
        Some(d) => WorkDir::Kept(d.to_owned()),
        None => WorkDir::Temporary(
            tempfile::Builder::new()
                .prefix("ce-eval-")
                .tempdir_in(args.work_dir.clone().unwrap_or_else(std::env::temp_dir))
                .map_err(CliError::Io)?,
        ),
    };
    // The corpus goes into the data directory's own SQLite store and embedded indexes, never
    // into a configured database.
    config.store.url.clear();
    config.index.vector.destination = "embedded".into();
    config.index.vector.pgvector_url.clear();
    config.index.outbox.consumers = consumers.iter().map(|c| (*c).to_owned()).collect();
    config.index.worker.dry_run_consumers.clear();
    let data = load_beir(&args.corpus, &args.queries, &args.qrels)?;
    if run_file.is_some() {
        check_trec_ids(&data)?;
    }
    let load_ms = ms_of(started.elapsed());
    // Refused before anything is written: a directory holding the user's own data.
    check_eval_only(&Source::open(dir.path(), &config)?, dir.path())?;
    let progress = Progress::new();
    progress.say(format_args!(
        "loaded {} documents, {} queries, {} judged query-document pairs ({:.1} s)",
        data.corpus.len(),
        data.queries.len(),
        data.qrels.values().map(BTreeMap::len).sum::<usize>(),
        load_ms / 1e3
    ));

    let open = |only: &[&str]| {
        Engine::open_with(
            dir.path(),
            config.clone(),
            EngineOptions {
                workers: 2,
                run_workers: false,
                role: "eval".into(),
                consumers: only.iter().map(|c| (*c).to_owned()).collect(),
            },
        )
    };
    let base = CtxUri::parse(EVAL_BASE).map_err(CoreError::from)?;
    let uris = DocUris::new(&base, &data.corpus, args.folder_size)?;
    let folders = match uris.folders().len() {
        0 => String::new(),
        n => format!(" in {n} folders"),
    };
    progress.say(format_args!(
        "writing {} documents{folders} ({} layout) into {}",
        data.corpus.len(),
        layout.as_str(),
        dir.path().display()
    ));

    let t = Instant::now();
    let mut engine = open(&consumers[..1])?;
    let changed = write_corpus(engine.store(), &data, &uris, layout, &progress)?;
    let write_ms = ms_of(t.elapsed());
    progress.say(format_args!(
        "{changed} documents written or changed, {} unchanged",
        data.corpus.len() as u64 - changed
    ));

    let t = Instant::now();
    let mut indexes = vec![build_index(&engine, consumers[0], &progress)?];
    for (i, consumer) in consumers.iter().enumerate().skip(1) {
        // The next index is built by an engine serving it and the earlier ones (which have
        // nothing left to do), the last one by an engine serving every index, which then
        // also serves the searches.
        engine.shutdown();
        drop(engine);
        engine = if i + 1 == consumers.len() {
            open(&[])?
        } else {
            open(&consumers[..=i])?
        };
        indexes.push(build_index(&engine, consumer, &progress)?);
    }
    let index_ms = ms_of(t.elapsed());

    let t = Instant::now();
    let filter = SearchFilter {
        subtree: Some(base.clone()),
        level: layout.level(),
        ..SearchFilter::default()
    };
    let mut search = |mode: &str, query: &str, n: usize| -> Result<Vec<(String, f32)>> {
        let mode: EvalMode = mode.parse()?;
        let req = SearchRequest {
            mode: match mode {
                EvalMode::Flat(m) => Some(m),
                EvalMode::Hierarchical => None,
            },
            top_k: n,
            filter: filter.clone(),
            ..SearchRequest::new(query)
        };
        let hits: Vec<(CtxUri, f32)> = match mode {
            EvalMode::Flat(_) => engine
                .search(&req)?
                .hits
                .into_iter()
                .map(|h| (h.uri, h.score))
                .collect(),
            EvalMode::Hierarchical => engine
                .hierarchical(&HierarchicalRequest {
                    search: req,
                    params: HierarchicalParams::default(),
                })?
                .hits
                .into_iter()
                .map(|h| (h.uri, h.score))
                .collect(),
        };
        Ok(hits
            .iter()
            .filter_map(|(uri, score)| uris.doc_id(uri).map(|id| (id.to_owned(), *score)))
            .collect())
    };
    let mut on_query = |q: &QueryRun<'_>| -> Result<()> {
        if let Some(f) = run_file.as_mut() {
            f.write(q)?;
        }
        progress.tick(
            &format!("searching {}", q.mode),
            q.done as u64,
            q.total as u64,
            "queries",
            t,
        );
        Ok(())
    };
    let quality = evaluate(&data, &names, args.k, &mut search, &mut on_query)?;
    let search_ms = ms_of(t.elapsed());
    engine.shutdown();
    let run_file = run_file.map(RunFile::finish).transpose()?;
    Ok(EvalOutput {
        quality,
        layout,
        folder_size: args.folder_size,
        data_dir: dir.path().display().to_string(),
        data_dir_kept: matches!(dir, WorkDir::Kept(_)),
        run_file,
        indexes,
        timings: StageTimings {
            load_ms,
            write_ms,
            index_ms,
            search_ms,
            total_ms: ms_of(started.elapsed()),
        },
    })
}
