//! The in-memory filter table: ANN key → what [`SearchFilter`] looks at, compactly.
//!
//! Filter values are interned (reference-counted, so memory follows the live records) and
//! each record keeps a sorted list of `(key symbol, value symbol)` pairs. A [`SearchFilter`]
//! compiles once per query into symbols; checking a record is then a few integer compares.
//! This is what the planner counts candidates with and what the ANN's filtered search calls
//! for every node it visits. Candidates are enumerated from the most selective index that
//! applies — a posting list per filter pair, the children of a parent, the URI range of a
//! subtree — so a selective filter never scans the whole table. Agreement with
//! [`SearchFilter::matches`] (the reference) is checked by the property tests.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use ce_core::IndexRecord;
use serde_json::Value;

use super::super::{SearchFilter, canonical_value};

type Sym = u32;

/// Reference-counted string interner.
#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<Arc<str>, Sym>,
    slots: Vec<Option<(Arc<str>, u32)>>,
    free: Vec<Sym>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.ids.get(s) {
            if let Some((_, n)) = &mut self.slots[sym as usize] {
                *n += 1;
            }
            return sym;
        }
        let s: Arc<str> = Arc::from(s);
        let slot = Some((s.clone(), 1));
        let sym = match self.free.pop() {
            Some(sym) => {
                self.slots[sym as usize] = slot;
                sym
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as Sym
            }
        };
        self.ids.insert(s, sym);
        sym
    }

    fn release(&mut self, sym: Sym) {
        let Some(entry) = self.slots.get_mut(sym as usize) else {
            return;
        };
        if let Some((s, n)) = entry {
            *n -= 1;
            if *n == 0 {
                self.ids.remove(&**s);
                *entry = None;
                self.free.push(sym);
            }
        }
    }

    fn lookup(&self, s: &str) -> Option<Sym> {
        self.ids.get(s).copied()
    }
}

/// The canonical text of a filter value ([`canonical_value`]).
fn canon(v: &Value) -> String {
    let mut out = String::new();
    canonical_value(v, &mut out);
    out
}

/// The key-name form in the interner (distinct from every value form, which never starts
/// with `k`).
fn key_form(k: &str) -> String {
    format!("k{k}")
}

/// What the table keeps of one record.
#[derive(Debug)]
pub(super) struct Entry {
    id: Box<str>,
    uri: Arc<str>,
    parent: Arc<str>,
    level: u8,
    /// `(key symbol, value symbol)`, sorted by key symbol.
    pairs: Box<[(Sym, Sym)]>,
}

/// The filter data of a record, before interning.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub id: String,
    pub uri: String,
    pub parent_uri: String,
    pub level: u8,
    pub filters: BTreeMap<String, Value>,
}

impl Row {
    /// The filter data of `r`.
    pub(super) fn of(r: &IndexRecord) -> Self {
        Row {
            id: r.id.clone(),
            uri: r.uri.as_str().to_owned(),
            parent_uri: r.parent_uri.as_str().to_owned(),
            level: r.level.as_u8(),
            filters: r.filters.clone(),
        }
    }
}

/// A [`SearchFilter`] in symbols.
#[derive(Debug, Default)]
pub(super) struct Compiled {
    /// Subtree root (never the virtual root, which admits everything).
    subtree: Option<String>,
    parent: Option<String>,
    level: Option<u8>,
    eq: Vec<(Sym, Sym)>,
    any_of: Option<(Sym, Vec<Sym>)>,
    /// Per `eq` pair: whether it has a posting list (pairs of unindexed keys have none).
    eq_indexed: Vec<bool>,
}

impl Compiled {
    /// Whether the filter admits every record.
    pub(super) fn is_trivial(&self) -> bool {
        self.subtree.is_none()
            && self.parent.is_none()
            && self.level.is_none()
            && self.eq.is_empty()
            && self.any_of.is_none()
    }

    fn matches(&self, e: &Entry) -> bool {
        let value_of = |k: Sym| {
            e.pairs
                .binary_search_by_key(&k, |p| p.0)
                .ok()
                .map(|i| e.pairs[i].1)
        };
        self.level.is_none_or(|l| e.level == l)
            && self.parent.as_deref().is_none_or(|p| &*e.parent == p)
            && self.subtree.as_deref().is_none_or(|s| within(&e.uri, s))
            && self.eq.iter().all(|&(k, v)| value_of(k) == Some(v))
            && self
                .any_of
                .as_ref()
                .is_none_or(|(k, vs)| value_of(*k).is_some_and(|v| vs.contains(&v)))
    }
}

/// `uri` equals `root` or lies below it (`root` is not the virtual root).
fn within(uri: &str, root: &str) -> bool {
    uri == root || (uri.starts_with(root) && uri.as_bytes().get(root.len()) == Some(&b'/'))
}

/// Filter keys whose values are (nearly) unique per node: no posting lists for them, the URI
/// and parent indexes serve the subtree and parent filters.
const NOT_INDEXED: [&str; 2] = ["uri", "parent_uri"];

fn sorted_insert(v: &mut Vec<u64>, key: u64) {
    match v.last() {
        Some(&last) if last >= key => {
            if let Err(i) = v.binary_search(&key) {
                v.insert(i, key);
            }
        }
        _ => v.push(key),
    }
}

/// Removes `key` from the sorted list under `k`, dropping the list when it empties.
fn sorted_remove<K: std::hash::Hash + Eq>(m: &mut HashMap<K, Vec<u64>>, k: &K, key: u64) {
    if let Some(v) = m.get_mut(k) {
        if let Ok(i) = v.binary_search(&key) {
            v.remove(i);
        }
        if v.is_empty() {
            m.remove(k);
        }
    }
}

/// ANN key → filter data, plus the indexes candidates are enumerated from.
#[derive(Debug, Default)]
pub(super) struct KeyTable {
    entries: HashMap<u64, Entry>,
    by_uri: BTreeMap<Arc<str>, Vec<u64>>,
    by_parent: HashMap<Arc<str>, Vec<u64>>,
    /// Sorted keys per `(key symbol, value symbol)` filter pair.
    postings: HashMap<(Sym, Sym), Vec<u64>>,
    interner: Interner,
}

impl KeyTable {
    /// Number of records.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The record id of `key`.
    pub(super) fn id(&self, key: u64) -> Option<&str> {
        self.entries.get(&key).map(|e| &*e.id)
    }

    /// Every key.
    pub(super) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.keys().copied()
    }

    /// Sets the filter data of `key` (replacing what it had).
    pub(super) fn insert(&mut self, key: u64, row: &Row) {
        self.remove(key);
        let uri: Arc<str> = match self.by_uri.get_key_value(row.uri.as_str()) {
            Some((u, _)) => u.clone(),
            None => Arc::from(row.uri.as_str()),
        };
        let parent: Arc<str> = match self.by_parent.get_key_value(row.parent_uri.as_str()) {
            Some((p, _)) => p.clone(),
            None => Arc::from(row.parent_uri.as_str()),
        };
        let mut pairs: Vec<(Sym, Sym)> = Vec::with_capacity(row.filters.len());
        for (k, v) in &row.filters {
            let pair = (
                self.interner.intern(&key_form(k)),
                self.interner.intern(&canon(v)),
            );
            if !NOT_INDEXED.contains(&k.as_str()) {
                sorted_insert(self.postings.entry(pair).or_default(), key);
            }
            pairs.push(pair);
        }
        pairs.sort_unstable();
        sorted_insert(self.by_uri.entry(uri.clone()).or_default(), key);
        sorted_insert(self.by_parent.entry(parent.clone()).or_default(), key);
        self.entries.insert(
            key,
            Entry {
                id: row.id.as_str().into(),
                uri,
                parent,
                level: row.level,
                pairs: pairs.into_boxed_slice(),
            },
        );
    }

    /// Forgets `key`.
    pub(super) fn remove(&mut self, key: u64) {
        let Some(e) = self.entries.remove(&key) else {
            return;
        };
        for pair in e.pairs.iter() {
            sorted_remove(&mut self.postings, pair, key);
            self.interner.release(pair.0);
            self.interner.release(pair.1);
        }
        if let Some(keys) = self.by_uri.get_mut(&*e.uri) {
            keys.retain(|k| *k != key);
            if keys.is_empty() {
                self.by_uri.remove(&*e.uri);
            }
        }
        sorted_remove(&mut self.by_parent, &e.parent, key);
    }

    /// Compiles `f`; `None` when no record can match (a wanted value no record holds).
    pub(super) fn compile(&self, f: &SearchFilter) -> Option<Compiled> {
        let key = |k: &str| self.interner.lookup(&key_form(k));
        let val = |v: &Value| self.interner.lookup(&canon(v));
        let mut c = Compiled {
            subtree: f
                .subtree
                .as_ref()
                .filter(|s| !s.is_root())
                .map(|s| s.as_str().to_owned()),
            parent: f.parent_uri.as_ref().map(|p| p.as_str().to_owned()),
            level: f.level.map(|l| l.as_u8()),
            ..Compiled::default()
        };
        for (k, want) in [
            ("context_type", &f.context_type),
            ("category", &f.category),
            ("account_id", &f.account_id),
        ] {
            if let Some(w) = want {
                c.eq.push((key(k)?, val(&Value::String(w.clone()))?));
                c.eq_indexed.push(true);
            }
        }
        for (k, v) in &f.meta {
            c.eq.push((key(k)?, val(v)?));
            c.eq_indexed.push(!NOT_INDEXED.contains(&k.as_str()));
        }
        if let Some(spaces) = &f.owner_spaces {
            let vs: Vec<Sym> = spaces
                .iter()
                .filter_map(|s| val(&Value::String(s.clone())))
                .collect();
            if vs.is_empty() {
                return None;
            }
            c.any_of = Some((key("owner_space")?, vs));
        }
        Some(c)
    }

    /// Whether `key` is a live record passing `c`.
    pub(super) fn matches(&self, key: u64, c: &Compiled) -> bool {
        self.entries.get(&key).is_some_and(|e| c.matches(e))
    }

    /// Counts the records passing `c` — stopping once the count exceeds `count_cap` — and
    /// collects their keys while the count stays within `collect_limit` (`keys` is complete
    /// iff `count <= collect_limit`).
    pub(super) fn scan(
        &self,
        c: &Compiled,
        collect_limit: usize,
        count_cap: usize,
    ) -> (usize, Vec<u64>) {
        let mut count = 0;
        let mut keys = Vec::new();
        // Visits one candidate; false once the count passed the cap.
        let mut visit = |key: u64| {
            if self.entries.get(&key).is_some_and(|e| c.matches(e)) {
                count += 1;
                if count <= collect_limit {
                    keys.push(key);
                } else if !keys.is_empty() {
                    keys = Vec::new();
                }
            }
            count <= count_cap
        };
        // The smallest exactly-sized source: the parent's children, a posting list, or the
        // union of the owner spaces' posting lists.
        let empty: &[u64] = &[];
        let list = |pair: &(Sym, Sym)| self.postings.get(pair).map_or(empty, Vec::as_slice);
        let mut sources: Vec<Vec<&[u64]>> = Vec::new();
        if let Some(p) = &c.parent {
            sources.push(vec![
                self.by_parent.get(p.as_str()).map_or(empty, Vec::as_slice),
            ]);
        }
        for (pair, indexed) in c.eq.iter().zip(&c.eq_indexed) {
            if *indexed {
                sources.push(vec![list(pair)]);
            }
        }
        if let Some((k, vs)) = &c.any_of {
            sources.push(vs.iter().map(|v| list(&(*k, *v))).collect());
        }
        let best = sources
            .into_iter()
            .min_by_key(|lists| lists.iter().map(|l| l.len()).sum::<usize>());
        if let Some(lists) = best {
            'lists: for l in lists {
                for &k in l {
                    if !visit(k) {
                        break 'lists;
                    }
                }
            }
        } else if let Some(root) = &c.subtree {
            let range = self
                .by_uri
                .range::<str, _>((Bound::Included(root.as_str()), Bound::Unbounded));
            'range: for (uri, ks) in range {
                if !uri.starts_with(root.as_str()) {
                    break;
                }
                for &k in ks {
                    if !visit(k) {
                        break 'range;
                    }
                }
            }
        } else {
            for &k in self.entries.keys() {
                if !visit(k) {
                    break;
                }
            }
        }
        (count, keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn interner_frees_unused_strings() {
        let mut t = KeyTable::default();
        let row = |id: &str, uri: &str| Row {
            id: id.into(),
            uri: uri.into(),
            parent_uri: "ctx://a".into(),
            level: 0,
            filters: BTreeMap::from([("uri".to_owned(), json!(uri))]),
        };
        t.insert(1, &row("x", "ctx://a/x"));
        t.insert(2, &row("y", "ctx://a/y"));
        t.remove(1);
        t.remove(2);
        assert_eq!(t.interner.ids.len(), 0);
        assert!(t.by_uri.is_empty());
        assert!(t.by_parent.is_empty());
        assert!(t.postings.is_empty());
    }
}
