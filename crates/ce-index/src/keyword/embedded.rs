//! Embedded keyword index: one SQLite file (`keywords.db`) holds the records, the postings in
//! blocks with each term's document frequency ([`blocks`]) and the node versions; BM25 is
//! scored in Rust from the postings (see [`super::Bm25`]), so it agrees with the in-memory
//! reference, and filtered with [`SearchFilter::matches`] itself. (SQLite's FTS5 is not used:
//! its `bm25()` differs from ours and cannot see our filters.)
//!
//! Write path ([`KeywordIndex::write_nodes`]): the records' texts are tokenized first, outside
//! any lock; then one `IMMEDIATE` transaction on the writer connection (WAL,
//! `synchronous=FULL`) applies the writes ([`sqlite::write_batch`]: without savepoints, and
//! only if one fails again with each in a savepoint), so a write that fails leaves nothing
//! behind while the others commit together. The records' rows change at once; their
//! posting changes are logged and applied to the blocks in one pass before the commit
//! ([`blocks::flush`]), so a batch removing thousands of records rewrites each affected block
//! once.
//!
//! Search path: one read transaction on the reader connection (a consistent snapshot) → each
//! query term's `df` from `terms` (one row) → postings of the query terms, rarest first, with
//! MaxScore pruning of records that cannot reach the top `k`, and block-max bounds for the
//! candidates left (see `score`) → exact scores of the rest → candidates in score order,
//! checked against the filter page by page until `top_k` pass and no unchecked candidate can
//! tie or beat the `top_k`-th → the hits' texts.
//!
//! Everything lives in SQLite, so several connections (or processes) may open the same file.

mod blocks;
mod schema;

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ce_core::{CtxUri, IndexRecord};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Serialize;

use self::blocks::{Frontier, Posting, PostingLog};
use self::schema::{
    RECORD_READ, RawRecord, decode_terms, decode_view, encode_head, encode_terms, init, open_conn,
    set_meta, sql, stats, term_names,
};
use super::{
    Bm25, KeywordHit, KeywordIndex, NodeWrite, SearchFilter, StoredRecord, SyncOutcome, Terms,
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
enum Prepared<'a> {
    Sync {
        uri: &'a CtxUri,
        version: u64,
        records: Vec<(&'a IndexRecord, Terms)>,
    },
    Remove {
        uri: &'a CtxUri,
        version: u64,
    },
    Purge {
        uri: &'a CtxUri,
    },
}

impl<'a> Prepared<'a> {
    /// Checks and tokenizes `w` (the costly part, done before the write lock is taken).
    fn of(w: &'a NodeWrite) -> Result<Self> {
        Ok(match w {
            NodeWrite::Sync {
                uri,
                version,
                records,
            } => {
                check_node_records(uri, records.iter().map(|r| &r.record))?;
                let records = records
                    .iter()
                    .map(|r| (&r.record, Terms::of(&r.record.text)))
                    .collect();
                Prepared::Sync {
                    uri,
                    version: *version,
                    records,
                }
            }
            NodeWrite::Remove { uri, version } => Prepared::Remove {
                uri,
                version: *version,
            },
            NodeWrite::Purge { uri } => Prepared::Purge { uri },
        })
    }
}

/// One write transaction with the collection statistics it maintains and the posting changes
/// it has made (applied to the blocks by [`WriteTx::finish`]).
struct WriteTx<'c> {
    tx: &'c Transaction<'c>,
    docs: u64,
    total_len: u64,
    stored: (u64, u64),
    log: PostingLog,
}

impl<'c> WriteTx<'c> {
    fn new(tx: &'c Transaction<'c>) -> Result<Self> {
        let (docs, total_len) = stats(tx)?;
        Ok(WriteTx {
            tx,
            docs,
            total_len,
            stored: (docs, total_len),
            log: PostingLog::default(),
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

    /// Deletes record `doc` and logs the removal of its postings; whether it existed.
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
        self.forget(doc, len, &terms)?;
        Ok(true)
    }

    /// Accounts for the deletion of record `doc` of `len` terms holding `terms` (its stored
    /// `terms` column): logs the removal of its postings and updates the statistics.
    fn forget(&mut self, doc: i64, len: i64, terms: &str) -> Result<()> {
        for term in term_names(terms) {
            self.log.remove(term?, doc);
        }
        self.docs -= 1;
        self.total_len -= len as u64;
        Ok(())
    }

    /// Deletes every record of node `uri`; how many. One statement whatever the number of
    /// records (a node's removal is the bulk of a subtree's or a folder's).
    fn delete_node(&mut self, uri: &CtxUri) -> Result<u64> {
        let rows: Vec<(i64, i64, String)> = self
            .tx
            .prepare_cached("DELETE FROM records WHERE uri = ?1 RETURNING doc, len, terms")
            .and_then(|mut s| {
                s.query_map([uri.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .map_err(sql)?;
        for (doc, len, terms) in &rows {
            self.forget(*doc, *len, terms)?;
        }
        Ok(rows.len() as u64)
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

    /// Inserts or replaces (by node and level) record `r` with its terms. Replacing logs only the
    /// postings that changed (none when the text did not: a payload-only update).
    fn put(&mut self, r: &IndexRecord, node_version: u64, terms: &Terms) -> Result<()> {
        let old: Option<(i64, i64, String)> = self
            .tx
            .prepare_cached("SELECT doc, len, terms FROM records WHERE uri = ?1 AND level = ?2")
            .and_then(|mut s| {
                s.query_row(params![r.uri.as_str(), r.level.as_u8()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
            })
            .map_err(sql)?;
        let head = encode_head(r)?;
        // Replacing keeps the record's `doc` (an `UPDATE` of that row); a new record gets a
        // fresh one. Neither statement can change more than one row, so neither needs SQLite's
        // statement journal (`INSERT OR REPLACE` did: 5 % of a cold keyword drain copying pages
        // to it).
        let statement = if old.is_some() {
            "UPDATE records SET id = ?2, uri = ?3, level = ?4, node_version = ?5, len = ?6,
                 terms = ?7, head = ?8, text = ?9
             WHERE doc = ?1"
        } else {
            "INSERT INTO records (doc, id, uri, level, node_version, len, terms, head, text)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        };
        let old_doc = old.as_ref().map(|(doc, ..)| *doc);
        self.tx
            .prepare_cached(statement)
            .and_then(|mut s| {
                s.execute(params![
                    old_doc,
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
        let doc = old_doc.unwrap_or_else(|| self.tx.last_insert_rowid());
        // The postings as they are: none for a new record; every posting carries the length,
        // so all of them change when it does.
        let mut stale = BTreeMap::new();
        match &old {
            Some((_, old_len, old_terms)) => {
                let old_len = *old_len as u64;
                stale = decode_terms(old_terms)?;
                if old_len != u64::from(terms.len) {
                    stale.values_mut().for_each(|tf| *tf = 0);
                }
                self.total_len -= old_len;
            }
            None => self.docs += 1,
        }
        self.total_len += u64::from(terms.len);
        for (term, tf) in &terms.tf {
            if stale.remove(term.as_str()) != Some(*tf) {
                self.log.set(term, doc, *tf, terms.len);
            }
        }
        for term in stale.keys() {
            self.log.remove(term, doc);
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
                if !SeenVersion::admits_write(sqlite::seen_version(self.tx, DB_FILE, uri)?, version)
                {
                    return Ok(SyncOutcome::Stale);
                }
                let keep: HashSet<&str> = records.iter().map(|(r, _)| r.id.as_str()).collect();
                for (doc, id) in self.node_docs(uri)? {
                    if !keep.contains(id.as_str()) {
                        self.delete_doc(doc)?;
                    }
                }
                for (r, terms) in &records {
                    self.put(r, version, terms)?;
                }
                sqlite::set_seen_version(self.tx, DB_FILE, uri, SeenVersion::live(version))?;
            }
            Prepared::Remove { uri, version } => {
                if !SeenVersion::admits_removal(
                    sqlite::seen_version(self.tx, DB_FILE, uri)?,
                    version,
                ) {
                    return Ok(SyncOutcome::Stale);
                }
                self.delete_node(uri)?;
                sqlite::set_seen_version(self.tx, DB_FILE, uri, SeenVersion::removed(version))?;
            }
            Prepared::Purge { uri } => {
                self.delete_node(uri)?;
            }
        }
        Ok(SyncOutcome::Applied)
    }

    /// Runs `f` as one write of a batch ([`sqlite::Isolation::run`]): if it fails in its
    /// savepoint, its rows and statistics are rolled back and its error is returned inside `Ok`.
    fn isolated<T>(
        &mut self,
        isolation: &sqlite::Isolation,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<Result<T>> {
        let saved = (self.docs, self.total_len, self.log.mark());
        let out = isolation.run(self.tx, DB_FILE, || f(self))?;
        if out.is_err() {
            (self.docs, self.total_len) = (saved.0, saved.1);
            self.log.rollback(saved.2);
        }
        Ok(out)
    }

    /// Applies the logged posting changes to the blocks and the document frequencies, and
    /// writes the statistics if they changed.
    fn finish(self) -> Result<()> {
        let changes = self.log.len();
        if changes > 0 {
            let started = std::time::Instant::now();
            blocks::flush(self.tx, self.log)?;
            tracing::debug!(
                changes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "keyword postings flushed"
            );
        }
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

/// A candidate of a search ordered by score (then doc, for a total order).
#[derive(Debug, Clone, Copy)]
struct ByScore(f32, i64);

impl PartialEq for ByScore {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for ByScore {}

impl PartialOrd for ByScore {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByScore {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
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

    /// The document frequency of `term` (a term as the tokenizer produces it): how many
    /// records hold it, as stored in `terms`.
    pub fn document_frequency(&self, term: &str) -> Result<u64> {
        self.read(|tx| {
            let df: Option<i64> = tx
                .prepare_cached("SELECT df FROM terms WHERE term = ?1")
                .and_then(|mut s| s.query_row([term], |r| r.get(0)).optional())
                .map_err(sql)?;
            Ok(df.unwrap_or(0) as u64)
        })
    }

    /// Checks that the postings agree with the stored texts (re-tokenizing every record), the
    /// blocks are well formed with exact bounds, the document frequencies count the postings
    /// and the collection statistics agree with the records. Returns [`IndexError::Corrupt`] describing
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
            // Every record's `terms` lines match its text; the postings they imply are
            // exactly those of the blocks, and each term's `df` counts them.
            let mut want: BTreeMap<String, Vec<Posting>> = BTreeMap::new();
            let mut st = tx
                .prepare("SELECT doc, id, len, text, terms FROM records ORDER BY doc")
                .map_err(sql)?;
            let mut rows = st.query([]).map_err(sql)?;
            while let Some(r) = rows.next().map_err(sql)? {
                let (doc, id, len, text, terms): (i64, String, u32, String, String) = (
                    r.get(0).map_err(sql)?,
                    r.get(1).map_err(sql)?,
                    r.get(2).map_err(sql)?,
                    r.get(3).map_err(sql)?,
                    r.get(4).map_err(sql)?,
                );
                let expected = Terms::of(&text);
                if terms != encode_terms(&expected) || len != expected.len {
                    problems.push(format!("terms of record {id} differ from its text"));
                }
                for (term, tf) in decode_terms(&terms)? {
                    want.entry(term.to_owned())
                        .or_default()
                        .push(Posting { doc, tf, len });
                }
            }
            let mut got: BTreeMap<String, Vec<Posting>> = BTreeMap::new();
            let mut st = tx
                .prepare(
                    "SELECT term, last_doc, first_doc, n, bound, data FROM blocks
                     ORDER BY term, last_doc",
                )
                .map_err(sql)?;
            let mut rows = st.query([]).map_err(sql)?;
            while let Some(r) = rows.next().map_err(sql)? {
                let (term, last, first, n, bound, data): (String, i64, i64, i64, Vec<u8>, Vec<u8>) = (
                    r.get(0).map_err(sql)?,
                    r.get(1).map_err(sql)?,
                    r.get(2).map_err(sql)?,
                    r.get(3).map_err(sql)?,
                    r.get(4).map_err(sql)?,
                    r.get(5).map_err(sql)?,
                );
                let ps = blocks::decode(&data)?;
                let list = got.entry(term.clone()).or_default();
                let sorted = ps.windows(2).all(|w| w[0].doc < w[1].doc)
                    && list.last().is_none_or(|p| ps.first().is_some_and(|q| p.doc < q.doc));
                let shape = ps.len() as i64 == n
                    && (1..=blocks::BLOCK as i64).contains(&n)
                    && ps.first().map(|p| p.doc) == Some(first)
                    && ps.last().map(|p| p.doc) == Some(last);
                if !sorted || !shape {
                    problems.push(format!("block {term:?}/{last} is malformed"));
                }
                if Frontier::decode(&bound)? != Frontier::of(&ps) {
                    problems.push(format!("bound of block {term:?}/{last} is wrong"));
                }
                list.extend(ps);
            }
            for (term, ps) in &want {
                if got.get(term) != Some(ps) {
                    problems.push(format!("postings of {term:?} differ from the records"));
                }
            }
            for term in got.keys().filter(|t| !want.contains_key(*t)) {
                problems.push(format!("postings of {term:?}, which no record holds"));
            }
            let dfs: BTreeMap<String, i64> = tx
                .prepare("SELECT term, df FROM terms")
                .and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect()
                })
                .map_err(sql)?;
            let want_dfs: BTreeMap<String, i64> =
                want.iter().map(|(t, ps)| (t.clone(), ps.len() as i64)).collect();
            if dfs != want_dfs {
                let wrong = want_dfs
                    .iter()
                    .find(|(t, n)| dfs.get(*t) != Some(n))
                    .map(|(t, n)| format!("{t:?}: {:?} instead of {n}", dfs.get(t)))
                    .or_else(|| dfs.keys().find(|t| !want_dfs.contains_key(*t)).map(|t| format!("{t:?} held by no record")))
                    .unwrap_or_default();
                problems.push(format!("document frequencies differ from the postings ({wrong})"));
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

/// Relative margin of every pruning comparison: a bound counts as below a threshold only when
/// it is below by more than f32 rounding of the final scores and f64 summation-order
/// differences could hide. A pruned record's f32 score is then strictly below the `top_k`-th
/// one, so records that would tie (and be ordered by id) are never pruned.
const MARGIN: f64 = 1e-6;

/// Whether a record whose score is at most `bound` certainly ranks below `top_k` records
/// scoring at least `theta`.
fn cannot_reach(bound: f64, theta: f64) -> bool {
    bound * (1.0 + MARGIN) < theta
}

/// The candidates of a search: records in doc order, each with its contribution per query
/// term (0 where not read yet or absent).
struct Candidates {
    terms: usize,
    docs: Vec<i64>,
    parts: Vec<f64>,
}

impl Candidates {
    fn new(terms: usize) -> Self {
        Candidates {
            terms,
            docs: Vec::new(),
            parts: Vec::new(),
        }
    }

    fn part(&mut self, c: usize, term: usize) -> &mut f64 {
        &mut self.parts[c * self.terms + term]
    }

    /// The sum of the contributions of candidate `c`, in ascending term order (the order the
    /// reference sums in, so final scores are bit-identical).
    fn sum(&self, c: usize) -> f64 {
        self.parts[c * self.terms..(c + 1) * self.terms]
            .iter()
            .fold(0.0, |a, &x| a + x)
    }

    /// Adds term `term`'s contributions from its postings (sorted by doc), adding the records
    /// not seen yet.
    fn merge(&mut self, term: usize, postings: &[Posting], contribution: impl Fn(&Posting) -> f64) {
        let n = self.terms;
        let mut docs = Vec::with_capacity(self.docs.len() + postings.len());
        let mut parts = Vec::with_capacity((self.docs.len() + postings.len()) * n);
        let (mut a, mut b) = (0, 0);
        while a < self.docs.len() || b < postings.len() {
            let (from_old, from_new) = match (self.docs.get(a), postings.get(b)) {
                (Some(&d), Some(p)) => (d <= p.doc, p.doc <= d),
                (Some(_), None) => (true, false),
                (None, Some(_)) => (false, true),
                (None, None) => break,
            };
            let row = parts.len();
            if from_old {
                docs.push(self.docs[a]);
                parts.extend_from_slice(&self.parts[a * n..(a + 1) * n]);
                a += 1;
            } else {
                docs.push(postings[b].doc);
                parts.resize(row + n, 0.0);
            }
            if from_new {
                parts[row + term] = contribution(&postings[b]);
                b += 1;
            }
        }
        self.docs = docs;
        self.parts = parts;
    }

    /// Keeps the candidates `c` with `keep[c]`.
    fn retain(&mut self, keep: &[bool]) {
        let n = self.terms;
        let mut w = 0;
        for (c, &k) in keep.iter().enumerate().take(self.docs.len()) {
            if k {
                self.docs[w] = self.docs[c];
                self.parts.copy_within(c * n..(c + 1) * n, w * n);
                w += 1;
            }
        }
        self.docs.truncate(w);
        self.parts.truncate(w * n);
    }
}

/// The blocks of one query term left to look up after pruning: their doc ranges and score
/// bounds (read without the postings), and the postings of the blocks decoded so far.
struct TermBlocks<'t> {
    term: &'t str,
    index: usize,
    idf: f64,
    firsts: Vec<i64>,
    lasts: Vec<i64>,
    bounds: Vec<f64>,
    decoded: HashMap<usize, Vec<Posting>>,
}

impl<'t> TermBlocks<'t> {
    fn load(
        tx: &Transaction<'_>,
        term: &'t str,
        index: usize,
        idf: f64,
        bm25: &Bm25,
    ) -> Result<Self> {
        let mut tb = TermBlocks {
            term,
            index,
            idf,
            firsts: Vec::new(),
            lasts: Vec::new(),
            bounds: Vec::new(),
            decoded: HashMap::new(),
        };
        let mut st = tx
            .prepare_cached(
                "SELECT first_doc, last_doc, bound FROM blocks WHERE term = ?1 ORDER BY last_doc",
            )
            .map_err(sql)?;
        let mut rows = st.query([term]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            tb.firsts.push(r.get(0).map_err(sql)?);
            tb.lasts.push(r.get(1).map_err(sql)?);
            let bound: Vec<u8> = r.get(2).map_err(sql)?;
            let f = Frontier::decode(&bound)?;
            tb.bounds.push(f.max(|tf, len| bm25.term(idf, tf, len)));
        }
        Ok(tb)
    }

    /// The block whose doc range holds `doc` (a record outside every range lacks the term).
    fn block_of(&self, doc: i64) -> Option<usize> {
        let b = self.lasts.partition_point(|&l| l < doc);
        (b < self.lasts.len() && self.firsts[b] <= doc).then_some(b)
    }

    /// The posting of `doc` in block `b`.
    fn posting(&mut self, tx: &Transaction<'_>, b: usize, doc: i64) -> Result<Option<Posting>> {
        if !self.decoded.contains_key(&b) {
            let data: Vec<u8> = tx
                .prepare_cached("SELECT data FROM blocks WHERE term = ?1 AND last_doc = ?2")
                .and_then(|mut s| s.query_row(params![self.term, self.lasts[b]], |r| r.get(0)))
                .map_err(sql)?;
            self.decoded.insert(b, blocks::decode(&data)?);
        }
        let ps = &self.decoded[&b];
        Ok(ps.binary_search_by_key(&doc, |p| p.doc).ok().map(|k| ps[k]))
    }
}

/// The exact BM25 score of every record that can still be among the `top_k` best records
/// passing `filter` (MaxScore-style dynamic pruning with block-max bounds; records that
/// provably cannot are left out, so callers rank what is returned exactly as if everything
/// had been scored), as `(doc, score)`.
///
/// Terms are read rarest first (`df` from the `terms` table). A term contributes less than its
/// upper bound `idf·(k1+1)`; once the upper bounds of the terms not read yet sum to less than
/// the `top_k`-th best partial score among filter-passing candidates (a lower bound θ of the
/// final `top_k`-th score), no record outside the candidates can enter the top `k`. The
/// candidates are then bounded tighter, per remaining term, by the score bound of the block
/// whose doc range holds them (0 when no block's does: the record lacks the term), and only
/// those that can still reach θ have the remaining terms looked up, block by block. All
/// comparisons keep the margin of [`cannot_reach`]. Contributions are kept per term and summed
/// in ascending term order, so scores are bit-identical to the reference's.
fn score(
    tx: &Transaction<'_>,
    terms: &[String],
    verdicts: &mut Verdicts<'_>,
    top_k: usize,
) -> Result<Vec<(i64, f64)>> {
    let (docs, total_len) = stats(tx)?;
    let bm25 = Bm25::new(docs, total_len);
    let mut df_of = tx
        .prepare_cached("SELECT df FROM terms WHERE term = ?1")
        .map_err(sql)?;
    let mut plan: Vec<(usize, u64, f64)> = Vec::with_capacity(terms.len());
    for (i, t) in terms.iter().enumerate() {
        let df: Option<i64> = df_of.query_row([t], |r| r.get(0)).optional().map_err(sql)?;
        if let Some(df) = df.filter(|&df| df > 0) {
            let df = df as u64;
            plan.push((i, df, bm25.idf(df)));
        }
    }
    plan.sort_by_key(|&(i, df, _)| (df, i));
    // rest[j]: the sum of the upper bounds of plan[j..].
    let mut rest = vec![0.0; plan.len() + 1];
    for j in (0..plan.len()).rev() {
        rest[j] = rest[j + 1] + plan[j].2 * (super::K1 + 1.0);
    }

    let mut read = tx
        .prepare_cached("SELECT data FROM blocks WHERE term = ?1 ORDER BY last_doc")
        .map_err(sql)?;
    let mut cands = Candidates::new(terms.len());
    let mut pruned = None;
    let mut postings: Vec<Posting> = Vec::new();
    for (j, &(i, _, idf)) in plan.iter().enumerate() {
        if j > 0
            && let Some(theta) = threshold(tx, &cands, verdicts, top_k)?
            && cannot_reach(rest[j], theta)
        {
            pruned = Some((j, theta));
            break;
        }
        postings.clear();
        let mut rows = read.query([&terms[i]]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            let data: Vec<u8> = r.get(0).map_err(sql)?;
            blocks::decode_into(&data, &mut postings)?;
        }
        cands.merge(i, &postings, |p| bm25.term(idf, p.tf, p.len));
    }
    if let Some((j, theta)) = pruned {
        // Only candidates that can still reach θ are completed.
        let keep: Vec<bool> = (0..cands.docs.len())
            .map(|c| !cannot_reach(cands.sum(c) + rest[j], theta))
            .collect();
        cands.retain(&keep);
        let mut remaining = Vec::with_capacity(plan.len() - j);
        for &(i, _, idf) in &plan[j..] {
            remaining.push(TermBlocks::load(tx, &terms[i], i, idf, &bm25)?);
        }
        // bound[c]: the block bounds of the terms not looked up yet for candidate c.
        let mut bound: Vec<f64> = cands
            .docs
            .iter()
            .map(|&doc| {
                remaining
                    .iter()
                    .filter_map(|tb| tb.block_of(doc).map(|b| tb.bounds[b]))
                    .sum()
            })
            .collect();
        for tb in &mut remaining {
            let keep: Vec<bool> = (0..cands.docs.len())
                .map(|c| !cannot_reach(cands.sum(c) + bound[c], theta))
                .collect();
            cands.retain(&keep);
            bound = bound
                .into_iter()
                .zip(&keep)
                .filter_map(|(b, &k)| k.then_some(b))
                .collect();
            for (c, bound) in bound.iter_mut().enumerate() {
                let doc = cands.docs[c];
                if let Some(b) = tb.block_of(doc) {
                    *bound -= tb.bounds[b];
                    if let Some(p) = tb.posting(tx, b, doc)? {
                        *cands.part(c, tb.index) = bm25.term(tb.idf, p.tf, p.len);
                    }
                }
            }
        }
    }
    Ok((0..cands.docs.len())
        .map(|c| (cands.docs[c], cands.sum(c)))
        .collect())
}

/// Which candidates pass a search's filter: each looked up once (its filter fields only), or
/// none at all when the filter is unrestricted (every stored record passes).
struct Verdicts<'f> {
    filter: &'f SearchFilter,
    all: bool,
    seen: HashMap<i64, bool>,
}

impl<'f> Verdicts<'f> {
    fn new(filter: &'f SearchFilter) -> Self {
        Verdicts {
            filter,
            all: filter.is_unrestricted(),
            seen: HashMap::new(),
        }
    }

    /// The verdict on `doc` if known without a lookup.
    fn known(&self, doc: i64) -> Option<bool> {
        if self.all {
            return Some(true);
        }
        self.seen.get(&doc).copied()
    }

    /// Whether record `doc` passes the filter (looked up and remembered if not known).
    fn check(&mut self, tx: &Transaction<'_>, doc: i64) -> Result<bool> {
        if let Some(p) = self.known(doc) {
            return Ok(p);
        }
        let row: Option<(String, u8, String)> = tx
            .prepare_cached("SELECT uri, level, head FROM records WHERE doc = ?1")
            .and_then(|mut s| {
                s.query_row([doc], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(sql)?;
        let pass = match row {
            Some((uri, level, head)) => self.filter.matches_view(&decode_view(&uri, level, &head)?),
            None => false,
        };
        self.seen.insert(doc, pass);
        Ok(pass)
    }
}

/// The `top_k`-th best partial score among filter-passing candidates, if `top_k` of them are
/// found within [`PRUNE_PROBES`] filter lookups (best partial scores first; verdicts kept).
fn threshold(
    tx: &Transaction<'_>,
    cands: &Candidates,
    verdicts: &mut Verdicts<'_>,
    top_k: usize,
) -> Result<Option<f64>> {
    let mut best: Vec<(f64, i64)> = (0..cands.docs.len())
        .map(|c| (cands.sum(c), cands.docs[c]))
        .collect();
    if verdicts.all {
        // Every candidate passes: the `top_k`-th best partial score, if there are that many.
        if best.len() < top_k {
            return Ok(None);
        }
        let (_, kth, _) = best.select_nth_unstable_by(top_k - 1, |a, b| b.0.total_cmp(&a.0));
        return Ok(Some(kth.0));
    }
    // At most `top_k` passes, `PRUNE_PROBES` new lookups and every known failure are
    // examined below: only that many best candidates need ordering, not all of them (any `k`
    // passing candidates give a valid threshold, so ties at the cut do not matter).
    let examined = top_k + PRUNE_PROBES + verdicts.seen.len() + 1;
    if examined < best.len() {
        best.select_nth_unstable_by(examined - 1, |a, b| b.0.total_cmp(&a.0));
        best.truncate(examined);
    }
    best.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    let (mut found, mut probes) = (0, 0);
    for (partial, doc) in best {
        if verdicts.known(doc).is_none() {
            probes += 1;
            if probes > PRUNE_PROBES {
                return Ok(None);
            }
        }
        if verdicts.check(tx, doc)? {
            found += 1;
            if found == top_k {
                return Ok(Some(partial));
            }
        }
    }
    Ok(None)
}

impl KeywordIndex for EmbeddedKeywordIndex {
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        sqlite::write_batch(writes, |writes, isolation| {
            let prepared: Vec<Result<Prepared>> = writes.iter().map(Prepared::of).collect();
            self.write(|w| {
                prepared
                    .into_iter()
                    .map(|p| match p {
                        Ok(p) => w.isolated(isolation, |w| w.apply(p)),
                        Err(e) => Ok(Err(e)),
                    })
                    .collect()
            })
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
            // A heap (built in linear time) yields the candidates best first without sorting
            // all of them: only the pages checked are ordered.
            let mut verdicts = Verdicts::new(filter);
            let mut candidates: BinaryHeap<ByScore> = score(tx, &terms, &mut verdicts, top_k)?
                .into_iter()
                .map(|(doc, s)| ByScore(s as f32, doc))
                .collect();
            // Candidates are checked in score order, so `passed` is in score order too; its
            // `top_k`-th entry bounds what an unchecked candidate must reach to be a hit.
            let mut passed: Vec<(f32, i64)> = Vec::new();
            let mut page = self.options.first_page.max(top_k).max(1);
            while let Some(next) = candidates.peek() {
                if let Some(kth) = passed.get(top_k - 1)
                    && next.0 < kth.0
                {
                    break;
                }
                for _ in 0..page {
                    let Some(ByScore(score, doc)) = candidates.pop() else {
                        break;
                    };
                    // Filters never read the text: the head's filter fields are enough.
                    if verdicts.check(tx, doc)? {
                        passed.push((score, doc));
                    }
                }
                page = page
                    .saturating_mul(PAGE_GROWTH)
                    .min(self.options.max_page.max(1));
            }
            // Ties are ordered by record id: only the ids of the scores that reach the cut.
            let cut = passed.get(top_k - 1).map_or(f32::NEG_INFINITY, |p| p.0);
            let mut id_of = tx
                .prepare_cached("SELECT id FROM records WHERE doc = ?1")
                .map_err(sql)?;
            let mut ranked: Vec<Passed> = Vec::with_capacity(passed.len());
            for (score, doc) in passed.into_iter().filter(|p| p.0 >= cut) {
                let id: String = id_of.query_row([doc], |r| r.get(0)).map_err(sql)?;
                ranked.push(Passed { score, id, doc });
            }
            ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
            ranked.truncate(top_k);
            let passed = ranked;
            let mut st = tx
                .prepare_cached(&format!("SELECT {RECORD_READ} FROM records WHERE doc = ?1"))
                .map_err(sql)?;
            let mut hits = Vec::with_capacity(passed.len());
            for p in passed {
                let record = st
                    .query_row([p.doc], |r| RawRecord::read(r, 0))
                    .map_err(sql)?
                    .decode()?
                    .record;
                debug_assert!(filter.matches(&record), "filters do not read the text");
                hits.push(KeywordHit {
                    record,
                    score: p.score,
                });
            }
            Ok(hits)
        })
    }

    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        self.read(|tx| {
            let mut st = tx
                .prepare_cached(&format!(
                    "SELECT {RECORD_READ} FROM records WHERE uri = ?1 ORDER BY level"
                ))
                .map_err(sql)?;
            let mut out = Vec::with_capacity(uris.len() * 3);
            for uri in uris {
                let rows: Vec<RawRecord> = st
                    .query_map([uri.as_str()], |r| RawRecord::read(r, 0))
                    .and_then(|rows| rows.collect())
                    .map_err(sql)?;
                for row in rows {
                    out.push(row.decode()?);
                }
            }
            Ok(out)
        })
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        self.read(|tx| {
            let rows: Vec<RawRecord> = select_within(
                tx,
                DB_FILE,
                &format!(
                    "SELECT uri, {RECORD_READ} FROM records WHERE {}
                     ORDER BY uri, level, id",
                    within_sql("uri")
                ),
                uri,
                |r| RawRecord::read(r, 1),
            )?;
            rows.into_iter().map(RawRecord::decode).collect()
        })
    }

    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        self.read(|tx| sqlite::uris_within(tx, DB_FILE, uri))
    }

    fn count(&self) -> Result<u64> {
        self.read(|tx| sqlite::count_rows(tx, DB_FILE, "records"))
    }

    fn clear(&self) -> Result<()> {
        self.write(|w| {
            w.tx.execute_batch(
                "DELETE FROM blocks; DELETE FROM terms; DELETE FROM records;
                 DELETE FROM uri_versions;",
            )
            .map_err(sql)?;
            w.docs = 0;
            w.total_len = 0;
            Ok(())
        })
    }
}
