//! Postings in blocks: each term's postings `(doc, tf, len)`, sorted by `doc`, are cut into
//! blocks of at most [`BLOCK`] postings stored as one row of the `blocks` table (key
//! `(term, last_doc)`), with the block's `first_doc`, its count `n`, its score bound and the
//! postings themselves as varints (doc deltas, tf, len).
//!
//! - **Bound** ([`Frontier`]): the Pareto frontier of `(tf, len)` over the block — for each
//!   distinct tf, the smallest len among postings with at least that tf. A BM25 term score
//!   grows with tf and falls with len, so the largest score over the frontier equals the
//!   largest score in the block for any collection statistics: a block-max bound that stays
//!   exact however `avgdl` moves, computed without reading the postings.
//! - **Writes** go through a [`PostingLog`]: a write transaction only records which postings
//!   appear, change or vanish; [`flush`] then applies the whole log term by term in one pass
//!   — the blocks touched are read once, rewritten once — and moves each term's document
//!   frequency (`terms.df`, the count of its postings) by what it actually gained or lost. A
//!   subtree removal thus rewrites each affected block once instead of deleting posting rows
//!   one record at a time.

use std::collections::HashMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::schema::{corrupt, sql};
use crate::error::Result;

/// Most postings per block.
pub(super) const BLOCK: usize = 128;

/// Most points kept in a block's [`Frontier`] (more are merged into coarser, still valid
/// bounds).
const FRONTIER_MAX: usize = 8;

/// One posting: record `doc` holds the term `tf` times and has `len` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Posting {
    pub doc: i64,
    pub tf: u32,
    pub len: u32,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&b) = buf.get(*pos) else {
            return Err(corrupt("postings block", "truncated varint"));
        };
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(corrupt("postings block", "varint too long"))
}

fn get_u32(buf: &[u8], pos: &mut usize) -> Result<u32> {
    u32::try_from(get_varint(buf, pos)?).map_err(|e| corrupt("postings block", e))
}

/// The postings of a block as stored (`ps` sorted by doc, docs positive and distinct).
pub(super) fn encode(ps: &[Posting]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ps.len() * 4);
    let mut prev = 0i64;
    for p in ps {
        put_varint(&mut out, (p.doc - prev) as u64);
        put_varint(&mut out, u64::from(p.tf));
        put_varint(&mut out, u64::from(p.len));
        prev = p.doc;
    }
    out
}

/// Appends the postings of a stored block to `out`.
pub(super) fn decode_into(buf: &[u8], out: &mut Vec<Posting>) -> Result<()> {
    let (mut pos, mut doc) = (0, 0i64);
    while pos < buf.len() {
        let delta = get_varint(buf, &mut pos)?;
        doc = i64::try_from(delta)
            .ok()
            .and_then(|d| doc.checked_add(d))
            .ok_or_else(|| corrupt("postings block", "doc out of range"))?;
        let tf = get_u32(buf, &mut pos)?;
        let len = get_u32(buf, &mut pos)?;
        out.push(Posting { doc, tf, len });
    }
    Ok(())
}

/// The postings of a stored block.
pub(super) fn decode(buf: &[u8]) -> Result<Vec<Posting>> {
    let mut out = Vec::with_capacity(BLOCK);
    decode_into(buf, &mut out)?;
    Ok(out)
}

/// A block's score bound: `(tf, len)` points, tf descending and len strictly descending
/// too, such that every posting `(tf', len')` of the block has a point with `tf ≥ tf'` and
/// `len ≤ len'` (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Frontier(pub Vec<(u32, u32)>);

impl Frontier {
    /// The frontier of `ps`.
    pub(super) fn of(ps: &[Posting]) -> Self {
        let mut by_tf: Vec<(u32, u32)> = ps.iter().map(|p| (p.tf, p.len)).collect();
        // tf descending, then len ascending: the first of each tf is its shortest.
        by_tf.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut points: Vec<(u32, u32)> = Vec::new();
        for (tf, len) in by_tf {
            // A point is needed only if it is shorter than every point of a larger tf.
            if points.last().is_none_or(|&(_, l)| len < l) {
                points.push((tf, len));
            }
        }
        // Too many points: merge neighbours into (the larger tf, the smaller len), which
        // bounds both.
        while points.len() > FRONTIER_MAX {
            let merged: Vec<(u32, u32)> = points
                .chunks(2)
                .map(|c| (c[0].0, c[c.len() - 1].1))
                .collect();
            points = merged;
        }
        Frontier(points)
    }

    /// The largest value of `score(tf, len)` over the points (0 for an empty block).
    pub(super) fn max(&self, score: impl Fn(u32, u32) -> f64) -> f64 {
        self.0
            .iter()
            .map(|&(tf, len)| score(tf, len))
            .fold(0.0, f64::max)
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() * 3);
        for &(tf, len) in &self.0 {
            put_varint(&mut out, u64::from(tf));
            put_varint(&mut out, u64::from(len));
        }
        out
    }

    pub(super) fn decode(buf: &[u8]) -> Result<Self> {
        let (mut pos, mut points) = (0, Vec::new());
        while pos < buf.len() {
            let tf = get_u32(buf, &mut pos)?;
            let len = get_u32(buf, &mut pos)?;
            points.push((tf, len));
        }
        Ok(Frontier(points))
    }
}

/// A change of one posting: the record now holds the term (`Some((tf, len))`) or not.
type Change = Option<(u32, u32)>;

/// The posting changes of a write transaction, in the order they were made (the last change
/// of a `(term, doc)` wins), applied by [`flush`].
#[derive(Debug, Default)]
pub(super) struct PostingLog {
    terms: Vec<String>,
    ids: HashMap<String, u32>,
    changes: Vec<(u32, i64, Change)>,
}

impl PostingLog {
    /// Records that `doc` holds `term` with `tf` and `len` (replacing any posting it had).
    pub(super) fn set(&mut self, term: &str, doc: i64, tf: u32, len: u32) {
        let t = self.term(term);
        self.changes.push((t, doc, Some((tf, len))));
    }

    /// Records that `doc` no longer holds `term`.
    pub(super) fn remove(&mut self, term: &str, doc: i64) {
        let t = self.term(term);
        self.changes.push((t, doc, None));
    }

    fn term(&mut self, term: &str) -> u32 {
        if let Some(&t) = self.ids.get(term) {
            return t;
        }
        let t = self.terms.len() as u32;
        self.terms.push(term.to_owned());
        self.ids.insert(term.to_owned(), t);
        t
    }

    /// A mark to roll back to (see [`PostingLog::rollback`]).
    pub(super) fn mark(&self) -> usize {
        self.changes.len()
    }

    /// Forgets the changes made since `mark` (a write whose savepoint was rolled back).
    pub(super) fn rollback(&mut self, mark: usize) {
        self.changes.truncate(mark);
    }

    /// Number of changes recorded.
    pub(super) fn len(&self) -> usize {
        self.changes.len()
    }
}

/// Applies `log` to the `blocks` and `terms` tables in one pass: terms in ascending order,
/// each term's changes in doc order, every touched block read and rewritten once.
pub(super) fn flush(tx: &Transaction<'_>, log: PostingLog) -> Result<()> {
    let PostingLog { terms, changes, .. } = log;
    if changes.is_empty() {
        return Ok(());
    }
    let mut rank: Vec<u32> = (0..terms.len() as u32).collect();
    rank.sort_unstable_by(|&a, &b| terms[a as usize].cmp(&terms[b as usize]));
    let mut order = vec![0u32; terms.len()];
    for (r, &t) in rank.iter().enumerate() {
        order[t as usize] = r as u32;
    }
    // Stable: for one (term, doc), the last change in log order comes last.
    let mut changes = changes;
    changes.sort_by_key(|&(t, doc, _)| (order[t as usize], doc));
    let mut start = 0;
    while start < changes.len() {
        let t = changes[start].0;
        let mut end = start;
        // The final change per doc of this term.
        let mut final_changes: Vec<(i64, Change)> = Vec::new();
        while end < changes.len() && changes[end].0 == t {
            let (_, doc, c) = changes[end];
            match final_changes.last_mut() {
                Some(last) if last.0 == doc => last.1 = c,
                _ => final_changes.push((doc, c)),
            }
            end += 1;
        }
        apply_term(tx, &terms[t as usize], &final_changes)?;
        start = end;
    }
    Ok(())
}

/// The block of `term` holding or following `doc`: `(last_doc, data)`.
fn block_from(tx: &Transaction<'_>, term: &str, doc: i64) -> Result<Option<(i64, Vec<u8>)>> {
    tx.prepare_cached(
        "SELECT last_doc, data FROM blocks WHERE term = ?1 AND last_doc >= ?2
         ORDER BY last_doc LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row(params![term, doc], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    })
    .map_err(sql)
}

/// The last block of `term`: `(last_doc, data)`.
fn last_block(tx: &Transaction<'_>, term: &str) -> Result<Option<(i64, Vec<u8>)>> {
    tx.prepare_cached(
        "SELECT last_doc, data FROM blocks WHERE term = ?1 ORDER BY last_doc DESC LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row([term], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    })
    .map_err(sql)
}

/// Writes `ps` (sorted, at least one) as blocks of at most [`BLOCK`] postings.
pub(super) fn write_blocks(tx: &Transaction<'_>, term: &str, ps: &[Posting]) -> Result<()> {
    let mut st = tx
        .prepare_cached(
            "INSERT INTO blocks (term, last_doc, first_doc, n, bound, data)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(sql)?;
    for chunk in ps.chunks(BLOCK) {
        let (first, last) = (chunk[0].doc, chunk[chunk.len() - 1].doc);
        st.execute(params![
            term,
            last,
            first,
            chunk.len() as i64,
            Frontier::of(chunk).encode(),
            encode(chunk),
        ])
        .map_err(sql)?;
    }
    Ok(())
}

/// Adds `delta` to the document frequency of `term` (removing the row at zero).
pub(super) fn add_df(tx: &Transaction<'_>, term: &str, delta: i64) -> Result<()> {
    if delta == 0 {
        return Ok(());
    }
    let df: i64 = tx
        .prepare_cached(
            "INSERT INTO terms (term, df) VALUES (?1, ?2)
             ON CONFLICT (term) DO UPDATE SET df = df + excluded.df RETURNING df",
        )
        .and_then(|mut s| s.query_row(params![term, delta], |r| r.get(0)))
        .map_err(sql)?;
    if df < 0 {
        return Err(corrupt("terms", format!("df of {term:?} would be {df}")));
    }
    if df == 0 {
        tx.prepare_cached("DELETE FROM terms WHERE term = ?1")
            .and_then(|mut s| s.execute([term]))
            .map_err(sql)?;
    }
    Ok(())
}

/// Applies one term's final changes (sorted by doc, one per doc).
fn apply_term(tx: &Transaction<'_>, term: &str, changes: &[(i64, Change)]) -> Result<()> {
    let mut df_delta = 0i64;
    let mut i = 0;
    while i < changes.len() {
        let doc = changes[i].0;
        // The block that holds `doc` or would: the first ending at or after it, else the
        // last block (which then takes every remaining change), else none yet.
        let (key, old, upto) = match block_from(tx, term, doc)? {
            Some((last, data)) => (Some(last), decode(&data)?, last),
            None => match last_block(tx, term)? {
                Some((last, data)) => (Some(last), decode(&data)?, i64::MAX),
                None => (None, Vec::new(), i64::MAX),
            },
        };
        let mut j = i;
        while j < changes.len() && changes[j].0 <= upto {
            j += 1;
        }
        let merged = merge(&old, &changes[i..j]);
        df_delta += merged.len() as i64 - old.len() as i64;
        if merged != old {
            rewrite(tx, term, key, &merged)?;
        }
        i = j;
    }
    add_df(tx, term, df_delta)
}

/// Replaces block `key` of `term` (none: a term without blocks) by `ps`: one row updated in
/// place in the common case, the row deleted when `ps` is empty, split when it outgrew
/// [`BLOCK`]. The changes of a block lie between its neighbours' ranges, so its new key never
/// collides with another block's.
fn rewrite(tx: &Transaction<'_>, term: &str, key: Option<i64>, ps: &[Posting]) -> Result<()> {
    match (key, ps) {
        (Some(key), []) => {
            tx.prepare_cached("DELETE FROM blocks WHERE term = ?1 AND last_doc = ?2")
                .and_then(|mut s| s.execute(params![term, key]))
                .map_err(sql)?;
        }
        (Some(key), [first, ..]) if ps.len() <= BLOCK => {
            let last = &ps[ps.len() - 1];
            tx.prepare_cached(
                "UPDATE blocks SET last_doc = ?3, first_doc = ?4, n = ?5, bound = ?6, data = ?7
                 WHERE term = ?1 AND last_doc = ?2",
            )
            .and_then(|mut s| {
                s.execute(params![
                    term,
                    key,
                    last.doc,
                    first.doc,
                    ps.len() as i64,
                    Frontier::of(ps).encode(),
                    encode(ps),
                ])
            })
            .map_err(sql)?;
        }
        (key, _) => {
            if let Some(key) = key {
                rewrite(tx, term, Some(key), &[])?;
            }
            if !ps.is_empty() {
                write_blocks(tx, term, ps)?;
            }
        }
    }
    Ok(())
}

/// `old` (sorted by doc) with `changes` (sorted by doc, one per doc) applied.
fn merge(old: &[Posting], changes: &[(i64, Change)]) -> Vec<Posting> {
    let mut out = Vec::with_capacity(old.len() + changes.len());
    let (mut a, mut b) = (0, 0);
    while a < old.len() || b < changes.len() {
        let take_change = match (old.get(a), changes.get(b)) {
            (Some(p), Some(&(doc, _))) => doc <= p.doc,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (None, None) => break,
        };
        if take_change {
            let (doc, c) = changes[b];
            if old.get(a).is_some_and(|p| p.doc == doc) {
                a += 1;
            }
            if let Some((tf, len)) = c {
                out.push(Posting { doc, tf, len });
            }
            b += 1;
        } else {
            out.push(old[a]);
            a += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(doc: i64, tf: u32, len: u32) -> Posting {
        Posting { doc, tf, len }
    }

    #[test]
    fn blocks_round_trip() {
        let ps = vec![
            p(1, 1, 10),
            p(2, 3, 200),
            p(90_000, 1, 7),
            p(1 << 40, 70_000, 1),
        ];
        assert_eq!(decode(&encode(&ps)).expect("decode"), ps);
        assert!(decode(&[0x80]).is_err(), "a truncated varint is corrupt");
        let f = Frontier::of(&ps);
        assert_eq!(Frontier::decode(&f.encode()).expect("decode"), f);
    }

    #[test]
    fn the_frontier_bounds_every_posting_and_reaches_the_best() {
        let ps = vec![
            p(1, 1, 5),
            p(2, 1, 50),
            p(3, 2, 20),
            p(4, 2, 8),
            p(5, 4, 60),
            p(6, 3, 100),
        ];
        let f = Frontier::of(&ps);
        assert_eq!(f.0, [(4, 60), (2, 8), (1, 5)]);
        for avgdl in [1.0, 10.0, 30.0, 1000.0] {
            let score = |tf: u32, len: u32| {
                let tf = f64::from(tf);
                tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * f64::from(len) / avgdl))
            };
            let best = ps.iter().map(|q| score(q.tf, q.len)).fold(0.0, f64::max);
            assert_eq!(f.max(score), best, "avgdl {avgdl}");
        }
        // Many points are merged into coarser bounds that still dominate every posting.
        let many: Vec<Posting> = (1..=40).map(|i| p(i64::from(i), i, i)).collect();
        let f = Frontier::of(&many);
        assert!(f.0.len() <= FRONTIER_MAX, "{f:?}");
        for q in &many {
            assert!(
                f.0.iter().any(|&(tf, len)| tf >= q.tf && len <= q.len),
                "{q:?}"
            );
        }
    }

    #[test]
    fn merge_applies_the_last_change_per_doc() {
        let old = vec![p(2, 1, 5), p(4, 1, 5), p(6, 1, 5)];
        let changes = [
            (1, Some((2, 9))),
            (2, None),
            (4, Some((3, 5))),
            (5, None),
            (7, Some((1, 1))),
        ];
        assert_eq!(
            merge(&old, &changes),
            [p(1, 2, 9), p(4, 3, 5), p(6, 1, 5), p(7, 1, 1)]
        );
        assert!(merge(&old, &[(2, None), (4, None), (6, None)]).is_empty());
    }
}
