//! Embedded keyword index: one SQLite file (`keywords.db`) holds the records, a postings table
//! and the node versions; BM25 is scored in Rust from the postings (see [`super::Bm25`]), so it
//! agrees with the in-memory reference, and filtered with [`SearchFilter::matches`] itself.
//! (SQLite's FTS5 is not used: its `bm25()` differs from ours and cannot see our filters.)
//!
//! Write path ([`KeywordIndex::write_nodes`]): the records' texts are tokenized first, outside
//! any lock; then one `IMMEDIATE` transaction on the writer connection (WAL,
//! `synchronous=FULL`) applies the writes, each in a savepoint, so a write that fails leaves
//! nothing behind while the others commit together.
//!
//! Search path: one read transaction on the reader connection (a consistent snapshot) →
//! postings of the query terms, rarest first, with MaxScore pruning of records that cannot
//! reach the top `k` (see `score`) → exact scores of the rest → candidates in score order,
//! checked against the filter page by page until `top_k` pass and no unchecked candidate can
//! tie or beat the `top_k`-th → the hits' texts.
//!
//! Everything lives in SQLite, so several connections (or processes) may open the same file.

mod schema;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ce_core::{CtxUri, IndexRecord};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Serialize;

use self::schema::{
    decode, decode_terms, encode_head, encode_terms, init, open_conn, set_meta, sql, stats,
};
use super::{
    Bm25, KeywordHit, KeywordIndex, KeywordWrite, SearchFilter, StoredRecord, SyncOutcome, Terms,
    query_terms,
};
use crate::error::{IndexError, Result};
use crate::records::{SeenVersion, check_node_records};
use crate::sqlite::{self, select_within, within_sql};

pub use self::schema::DB_FILE;

/// Tuning of the embedded keyword index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EmbeddedKeywordOptions {
    /// Candidates checked against the filter in the first page of a search (at least `top_k`
    /// are); each further page is four times larger, up to `max_page`.
    pub first_page: usize,
    /// The largest page.
    pub max_page: usize,
}

impl Default for EmbeddedKeywordOptions {
    fn default() -> Self {
        EmbeddedKeywordOptions {
            first_page: 32,
            max_page: 4096,
        }
    }
}

const PAGE_GROWTH: usize = 4;

/// A write with its records tokenized, ready for the transaction.
enum Prepared {
    Sync {
        uri: CtxUri,
        version: u64,
        records: Vec<(IndexRecord, Terms)>,
    },
    Remove {
        uri: CtxUri,
        version: u64,
    },
    Purge {
        uri: CtxUri,
    },
}

impl Prepared {
    /// Checks and tokenizes `w` (the costly part, done before the write lock is taken).
    fn of(w: KeywordWrite) -> Result<Self> {
        Ok(match w {
            KeywordWrite::Sync {
                uri,
                version,
                records,
            } => {
                check_node_records(&uri, &records)?;
                let records = records
                    .into_iter()
                    .map(|r| {
                        let terms = Terms::of(&r.text);
                        (r, terms)
                    })
                    .collect();
                Prepared::Sync {
                    uri,
                    version,
                    records,
                }
            }
            KeywordWrite::Remove { uri, version } => Prepared::Remove { uri, version },
            KeywordWrite::Purge { uri } => Prepared::Purge { uri },
        })
    }
}

/// One write transaction with the collection statistics it maintains.
struct WriteTx<'c> {
    tx: &'c Transaction<'c>,
    docs: u64,
    total_len: u64,
    stored: (u64, u64),
}

impl<'c> WriteTx<'c> {
    fn new(tx: &'c Transaction<'c>) -> Result<Self> {
        let (docs, total_len) = stats(tx)?;
        Ok(WriteTx {
            tx,
            docs,
            total_len,
            stored: (docs, total_len),
        })
    }

    /// `(doc, id)` of the records of node `uri`.
    fn node_docs(&self, uri: &CtxUri) -> Result<Vec<(i64, String)>> {
        self.tx
            .prepare_cached("SELECT doc, id FROM records WHERE uri = ?1")
            .and_then(|mut s| {
                s.query_map([uri.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .map_err(sql)
    }

    /// Deletes record `doc` and its postings; whether it existed.
    fn delete_doc(&mut self, doc: i64) -> Result<bool> {
        let row: Option<(i64, String)> = self
            .tx
            .prepare_cached("DELETE FROM records WHERE doc = ?1 RETURNING len, terms")
            .and_then(|mut s| {
                s.query_row([doc], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(sql)?;
        let Some((len, terms)) = row else {
            return Ok(false);
        };
        let mut st = self
            .tx
            .prepare_cached("DELETE FROM postings WHERE term = ?1 AND doc = ?2")
            .map_err(sql)?;
        for (term, _) in decode_terms(&terms)? {
            st.execute(params![term, doc]).map_err(sql)?;
        }
        self.docs -= 1;
        self.total_len -= len as u64;
        Ok(true)
    }

    /// Deletes every record of node `uri`; how many.
    fn delete_node(&mut self, uri: &CtxUri) -> Result<u64> {
        let mut n = 0;
        for (doc, _) in self.node_docs(uri)? {
            n += u64::from(self.delete_doc(doc)?);
        }
        Ok(n)
    }

    /// Deletes every record within `uri`; how many.
    fn delete_within(&mut self, uri: &CtxUri) -> Result<u64> {
        let docs: Vec<i64> = select_within(
            self.tx,
            DB_FILE,
            &format!("SELECT uri, doc FROM records WHERE {}", within_sql("uri")),
            uri,
            |r| r.get(1),
        )?;
        let mut n = 0;
        for doc in docs {
            n += u64::from(self.delete_doc(doc)?);
        }
        Ok(n)
    }

    /// Inserts or replaces (by id) record `r` with its terms. Replacing rewrites only the
    /// postings that changed (none when the text did not: a payload-only update).
    fn put(&mut self, r: &IndexRecord, node_version: u64, terms: &Terms) -> Result<()> {
        let old: Option<(i64, i64, String)> = self
            .tx
            .prepare_cached("SELECT doc, len, terms FROM records WHERE id = ?1")
            .and_then(|mut s| {
                s.query_row([&r.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(sql)?;
        let head = encode_head(r)?;
        // Replacing keeps the record's `doc`; a new record gets a fresh one.
        self.tx
            .prepare_cached(
                "INSERT OR REPLACE INTO records (doc, id, uri, level, node_version, len, terms,
                     head, text)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    old.as_ref().map(|(doc, ..)| doc),
                    r.id,
                    r.uri.as_str(),
                    r.level.as_u8(),
                    node_version as i64,
                    terms.len,
                    encode_terms(terms),
                    head,
                    r.text,
                ])
            })
            .map_err(sql)?;
        let doc = self.tx.last_insert_rowid();
        // The postings as they are: none for a new record.
        let mut stale = BTreeMap::new();
        match &old {
            Some((_, old_len, old_terms)) => {
                let old_len = *old_len as u64;
                if old_len == u64::from(terms.len) {
                    stale = decode_terms(old_terms)?;
                } else {
                    // Every posting carries the length: all of them change.
                    let mut st = self
                        .tx
                        .prepare_cached("DELETE FROM postings WHERE term = ?1 AND doc = ?2")
                        .map_err(sql)?;
                    for (term, _) in decode_terms(old_terms)? {
                        st.execute(params![term, doc]).map_err(sql)?;
                    }
                }
                self.total_len -= old_len;
            }
            None => self.docs += 1,
        }
        self.total_len += u64::from(terms.len);
        let mut put = self
            .tx
            .prepare_cached(
                "INSERT OR REPLACE INTO postings (term, doc, tf, len) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(sql)?;
        for (term, tf) in &terms.tf {
            if stale.remove(term.as_str()) != Some(*tf) {
                put.execute(params![term, doc, tf, terms.len])
                    .map_err(sql)?;
            }
        }
        let mut delete = self
            .tx
            .prepare_cached("DELETE FROM postings WHERE term = ?1 AND doc = ?2")
            .map_err(sql)?;
        for term in stale.keys() {
            delete.execute(params![term, doc]).map_err(sql)?;
        }
        Ok(())
    }

    /// Applies one prepared write.
    fn apply(&mut self, w: Prepared) -> Result<SyncOutcome> {
        match w {
            Prepared::Sync {
                uri,
                version,
                records,
            } => {
                if !SeenVersion::admits_write(
                    sqlite::seen_version(self.tx, DB_FILE, &uri)?,
                    version,
                ) {
                    return Ok(SyncOutcome::Stale);
                }
                let keep: HashSet<&str> = records.iter().map(|(r, _)| r.id.as_str()).collect();
                for (doc, id) in self.node_docs(&uri)? {
                    if !keep.contains(id.as_str()) {
                        self.delete_doc(doc)?;
                    }
                }
                for (r, terms) in &records {
                    self.put(r, version, terms)?;
                }
                sqlite::set_seen_version(self.tx, DB_FILE, &uri, SeenVersion::live(version))?;
            }
            Prepared::Remove { uri, version } => {
                if !SeenVersion::admits_removal(
                    sqlite::seen_version(self.tx, DB_FILE, &uri)?,
                    version,
                ) {
                    return Ok(SyncOutcome::Stale);
                }
                self.delete_node(&uri)?;
                sqlite::set_seen_version(self.tx, DB_FILE, &uri, SeenVersion::removed(version))?;
            }
            Prepared::Purge { uri } => {
                self.delete_node(&uri)?;
            }
        }
        Ok(SyncOutcome::Applied)
    }

    /// Runs `f` in a savepoint (see [`sqlite::savepoint`]): if it fails, its rows and
    /// statistics are rolled back and its error is returned inside `Ok`.
    fn isolated<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Result<T>> {
        let saved = (self.docs, self.total_len);
        let out = sqlite::savepoint(self.tx, DB_FILE, || f(self))?;
        if out.is_err() {
            (self.docs, self.total_len) = saved;
        }
        Ok(out)
    }

    /// Writes the statistics if they changed.
    fn finish(self) -> Result<()> {
        if (self.docs, self.total_len) != self.stored {
            set_meta(self.tx, "docs", self.docs)?;
            set_meta(self.tx, "total_len", self.total_len)?;
        }
        Ok(())
    }
}

/// The embedded keyword index (see the module documentation).
pub struct EmbeddedKeywordIndex {
    dir: PathBuf,
    options: EmbeddedKeywordOptions,
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

impl std::fmt::Debug for EmbeddedKeywordIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedKeywordIndex")
            .field("dir", &self.dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A candidate of a search that passed the filter.
struct Passed {
    score: f32,
    id: String,
    doc: i64,
}

impl EmbeddedKeywordIndex {
    /// Opens (creating if needed) the index stored in `dir` with default options.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, EmbeddedKeywordOptions::default())
    }

    /// Opens the index with explicit options.
    pub fn open_with(dir: &Path, options: EmbeddedKeywordOptions) -> Result<Self> {
        fs_err::create_dir_all(dir)
            .map_err(|e| IndexError::Unavailable(format!("keyword index directory: {e}")))?;
        let path = dir.join(DB_FILE);
        let mut writer = open_conn(&path)?;
        init(&mut writer)?;
        let reader = sqlite::read_only(open_conn(&path)?, DB_FILE)?;
        Ok(EmbeddedKeywordIndex {
            dir: dir.to_owned(),
            options,
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
        })
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the index was opened with.
    pub fn options(&self) -> &EmbeddedKeywordOptions {
        &self.options
    }

    /// Runs `f` in one write transaction.
    fn write<T>(&self, f: impl FnOnce(&mut WriteTx<'_>) -> Result<T>) -> Result<T> {
        sqlite::write(&self.writer, DB_FILE, |tx| {
            let mut w = WriteTx::new(tx)?;
            let out = f(&mut w)?;
            w.finish()?;
            Ok(out)
        })
    }

    /// Runs `f` in one read transaction (a consistent snapshot) on the reader connection.
    fn read<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        sqlite::read(&self.reader, DB_FILE, f)
    }

    /// Checks that the postings agree with the stored texts (re-tokenizing every record) and
    /// the collection statistics with the records. Returns [`IndexError::Corrupt`] describing
    /// the first differences. Costs a full scan: for tests and maintenance.
    pub fn check_consistency(&self) -> Result<()> {
        self.read(|tx| {
            let mut problems = Vec::new();
            let (docs, total_len) = stats(tx)?;
            let (n, sum): (i64, i64) = tx
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(len), 0) FROM records",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(sql)?;
            if (n as u64, sum as u64) != (docs, total_len) {
                problems.push(format!(
                    "statistics say {docs} records of {total_len} terms, the table holds {n} of {sum}"
                ));
            }
            // Every record's `terms` lines match its text and each has its posting; with as
            // many postings as lines in all, there is no other posting.
            let mut st = tx
                .prepare("SELECT doc, id, len, text, terms FROM records ORDER BY doc")
                .map_err(sql)?;
            let mut posting = tx
                .prepare("SELECT tf, len FROM postings WHERE term = ?1 AND doc = ?2")
                .map_err(sql)?;
            let mut lines = 0u64;
            let mut rows = st.query([]).map_err(sql)?;
            while let Some(r) = rows.next().map_err(sql)? {
                let (doc, id, len, text, terms): (i64, String, u32, String, String) = (
                    r.get(0).map_err(sql)?,
                    r.get(1).map_err(sql)?,
                    r.get(2).map_err(sql)?,
                    r.get(3).map_err(sql)?,
                    r.get(4).map_err(sql)?,
                );
                let want = Terms::of(&text);
                if terms != encode_terms(&want) || len != want.len {
                    problems.push(format!("terms of record {id} differ from its text"));
                }
                for (term, tf) in decode_terms(&terms)? {
                    lines += 1;
                    let got: Option<(u32, u32)> = posting
                        .query_row(params![term, doc], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                        .map_err(sql)?;
                    if got != Some((tf, len)) {
                        problems.push(format!("posting {term:?} of record {id} is {got:?}"));
                    }
                }
            }
            let postings: i64 = tx
                .query_row("SELECT COUNT(*) FROM postings", [], |r| r.get(0))
                .map_err(sql)?;
            if postings as u64 != lines {
                problems.push(format!(
                    "{postings} postings, the records list {lines}"
                ));
            }
            if problems.is_empty() {
                return Ok(());
            }
            problems.truncate(5);
            Err(IndexError::Corrupt(problems.join("; ")))
        })
    }
}

/// Head lookups spent looking for `top_k` filter-passing candidates before pruning is tried.
const PRUNE_PROBES: usize = 256;

/// The exact BM25 score of every record that can still be among the `top_k` best records
/// passing `filter` (MaxScore-style dynamic pruning; records that provably cannot are left
/// out, so callers rank what is returned exactly as if everything had been scored).
///
/// Terms are read rarest first (`df` by an index count). A term contributes less than its
/// upper bound `idf·(k1+1)`; once the upper bounds of the terms not read yet sum to less than
/// the `top_k`-th best partial score among filter-passing candidates (a lower bound of the
/// final `top_k`-th score), no record outside the candidates can enter the top `k`: the
/// remaining terms are then only looked up, posting by posting, for the candidates whose
/// partial score plus those bounds still reaches that threshold. Contributions are kept per
/// term and summed in ascending term order, so scores are bit-identical to the reference's.
fn score(
    tx: &Transaction<'_>,
    terms: &[String],
    filter: &SearchFilter,
    top_k: usize,
) -> Result<HashMap<i64, f64>> {
    let (docs, total_len) = stats(tx)?;
    let bm25 = Bm25::new(docs, total_len);
    let mut count = tx
        .prepare_cached("SELECT count(*) FROM postings WHERE term = ?1")
        .map_err(sql)?;
    let mut plan: Vec<(usize, u64, f64)> = Vec::with_capacity(terms.len());
    for (i, t) in terms.iter().enumerate() {
        let df: i64 = count.query_row([t], |r| r.get(0)).map_err(sql)?;
        let df = df as u64;
        if df > 0 {
            plan.push((i, df, bm25.idf(df)));
        }
    }
    plan.sort_by_key(|&(i, df, _)| (df, i));
    // rest[j]: the sum of the upper bounds of plan[j..].
    let mut rest = vec![0.0; plan.len() + 1];
    for j in (0..plan.len()).rev() {
        rest[j] = rest[j + 1] + plan[j].2 * (super::K1 + 1.0);
    }

    let mut all = tx
        .prepare_cached("SELECT doc, tf, len FROM postings WHERE term = ?1")
        .map_err(sql)?;
    let mut one = tx
        .prepare_cached("SELECT tf, len FROM postings WHERE term = ?1 AND doc = ?2")
        .map_err(sql)?;
    let mut parts: HashMap<i64, Vec<f64>> = HashMap::new();
    let mut passes: HashMap<i64, bool> = HashMap::new();
    let mut pruned_from = plan.len();
    for (j, &(i, _, idf)) in plan.iter().enumerate() {
        if j > 0
            && let Some(theta) = threshold(tx, &parts, &mut passes, filter, top_k)?
            && rest[j] < theta
        {
            pruned_from = j;
            // Only candidates that can still reach the threshold are completed.
            parts.retain(|_, p| p.iter().sum::<f64>() + rest[j] >= theta);
            break;
        }
        let postings: Vec<(i64, u32, u32)> = all
            .query_map([&terms[i]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|it| it.collect())
            .map_err(sql)?;
        for (doc, tf, len) in postings {
            parts.entry(doc).or_insert_with(|| vec![0.0; terms.len()])[i] = bm25.term(idf, tf, len);
        }
    }
    for &(i, _, idf) in &plan[pruned_from..] {
        for (doc, p) in parts.iter_mut() {
            let hit: Option<(u32, u32)> = one
                .query_row(params![&terms[i], doc], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(sql)?;
            if let Some((tf, len)) = hit {
                p[i] = bm25.term(idf, tf, len);
            }
        }
    }
    Ok(parts
        .into_iter()
        .map(|(doc, p)| (doc, p.iter().sum::<f64>()))
        .collect())
}

/// The `top_k`-th best partial score among filter-passing candidates, if `top_k` of them are
/// found within [`PRUNE_PROBES`] head lookups (best partial scores first; results cached).
fn threshold(
    tx: &Transaction<'_>,
    parts: &HashMap<i64, Vec<f64>>,
    passes: &mut HashMap<i64, bool>,
    filter: &SearchFilter,
    top_k: usize,
) -> Result<Option<f64>> {
    let mut best: Vec<(f64, i64)> = parts
        .iter()
        .map(|(doc, p)| (p.iter().sum::<f64>(), *doc))
        .collect();
    // At most `top_k` passes, `PRUNE_PROBES` new lookups and every cached failure are
    // examined below: only that many best candidates need ordering, not all of them (any `k`
    // passing candidates give a valid threshold, so ties at the cut do not matter).
    let examined = top_k + PRUNE_PROBES + passes.len() + 1;
    if examined < best.len() {
        best.select_nth_unstable_by(examined - 1, |a, b| b.0.total_cmp(&a.0));
        best.truncate(examined);
    }
    best.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    let (mut found, mut probes) = (0, 0);
    for (partial, doc) in best {
        let pass = match passes.get(&doc) {
            Some(&p) => p,
            None => {
                probes += 1;
                if probes > PRUNE_PROBES {
                    return Ok(None);
                }
                let p = head(tx, doc)?.is_some_and(|r| filter.matches(&r));
                passes.insert(doc, p);
                p
            }
        };
        if pass {
            found += 1;
            if found == top_k {
                return Ok(Some(partial));
            }
        }
    }
    Ok(None)
}

/// The head (record without text) of record `doc`.
fn head(tx: &Transaction<'_>, doc: i64) -> Result<Option<IndexRecord>> {
    let head: Option<String> = tx
        .prepare_cached("SELECT head FROM records WHERE doc = ?1")
        .and_then(|mut s| s.query_row([doc], |r| r.get(0)).optional())
        .map_err(sql)?;
    head.map(|h| decode(&h, String::new())).transpose()
}

/// Decodes a stored row `(head, text, node_version)`.
fn stored(head: &str, text: String, node_version: i64) -> Result<StoredRecord> {
    Ok(StoredRecord {
        record: decode(head, text)?,
        node_version: node_version as u64,
    })
}

impl KeywordIndex for EmbeddedKeywordIndex {
    fn write_nodes(&self, writes: Vec<KeywordWrite>) -> Result<Vec<Result<SyncOutcome>>> {
        let prepared: Vec<Result<Prepared>> = writes.into_iter().map(Prepared::of).collect();
        self.write(|w| {
            prepared
                .into_iter()
                .map(|p| match p {
                    Ok(p) => w.isolated(|w| w.apply(p)),
                    Err(e) => Ok(Err(e)),
                })
                .collect()
        })
    }

    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        self.write(|w| {
            if subtree {
                w.delete_within(uri)
            } else {
                w.delete_node(uri)
            }
        })
    }

    fn search(&self, query: &str, filter: &SearchFilter, top_k: usize) -> Result<Vec<KeywordHit>> {
        let terms = query_terms(query);
        if terms.is_empty() || top_k == 0 {
            return Ok(Vec::new());
        }
        self.read(|tx| {
            let mut candidates: Vec<(f32, i64)> = score(tx, &terms, filter, top_k)?
                .into_iter()
                .map(|(doc, s)| (s as f32, doc))
                .collect();
            candidates.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
            // Candidates are checked in score order, so `passed` is in score order too; its
            // `top_k`-th entry bounds what an unchecked candidate must reach to be a hit.
            let mut passed: Vec<Passed> = Vec::new();
            let mut next = 0;
            let mut page = self.options.first_page.max(top_k).max(1);
            while next < candidates.len() {
                if let Some(kth) = passed.get(top_k - 1)
                    && candidates[next].0 < kth.score
                {
                    break;
                }
                let end = next.saturating_add(page).min(candidates.len());
                for &(score, doc) in &candidates[next..end] {
                    // Filters never read the text: the head is enough to check them.
                    if let Some(r) = head(tx, doc)?
                        && filter.matches(&r)
                    {
                        passed.push(Passed {
                            score,
                            id: r.id,
                            doc,
                        });
                    }
                }
                next = end;
                page = page
                    .saturating_mul(PAGE_GROWTH)
                    .min(self.options.max_page.max(1));
            }
            passed.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
            passed.truncate(top_k);
            let mut st = tx
                .prepare_cached("SELECT head, text FROM records WHERE doc = ?1")
                .map_err(sql)?;
            let mut hits = Vec::with_capacity(passed.len());
            for p in passed {
                let (head, text): (String, String) = st
                    .query_row([p.doc], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(sql)?;
                let record = decode(&head, text)?;
                debug_assert!(filter.matches(&record), "filters do not read the text");
                hits.push(KeywordHit {
                    record,
                    score: p.score,
                });
            }
            Ok(hits)
        })
    }

    fn get(&self, ids: &[String]) -> Result<Vec<StoredRecord>> {
        self.read(|tx| {
            let mut st = tx
                .prepare_cached("SELECT head, text, node_version FROM records WHERE id = ?1")
                .map_err(sql)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let row: Option<(String, String, i64)> = st
                    .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
                    .map_err(sql)?;
                if let Some((head, text, v)) = row {
                    out.push(stored(&head, text, v)?);
                }
            }
            Ok(out)
        })
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        self.read(|tx| {
            let rows: Vec<(String, String, i64)> = select_within(
                tx,
                DB_FILE,
                &format!(
                    "SELECT uri, head, text, node_version FROM records WHERE {}
                     ORDER BY uri, level, id",
                    within_sql("uri")
                ),
                uri,
                |r| Ok((r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
            rows.into_iter()
                .map(|(head, text, v)| stored(&head, text, v))
                .collect()
        })
    }

    fn count(&self) -> Result<u64> {
        self.read(|tx| sqlite::count_rows(tx, DB_FILE, "records"))
    }

    fn clear(&self) -> Result<()> {
        self.write(|w| {
            w.tx.execute_batch(
                "DELETE FROM postings; DELETE FROM records; DELETE FROM uri_versions;",
            )
            .map_err(sql)?;
            w.docs = 0;
            w.total_len = 0;
            Ok(())
        })
    }
}
