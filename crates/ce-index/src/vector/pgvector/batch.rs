//! Batched versioned writes: [`VectorIndex::write_nodes`](super::VectorIndex::write_nodes)
//! in a constant number of statements per batch rather than several per node.
//!
//! 1. read the rows the batch can touch (those of its URIs, and those holding the ids it
//!    writes: `id` and `uri` only) and the seen versions of its URIs, in two queries;
//! 2. apply each node write, in order, to that working set in memory, with the rules of
//!    the per-node path ([`super::WriteTx::sync_node`], [`super::WriteTx::remove_node`]):
//!    a write is checked in full before it changes the working set, so a failing write
//!    changes nothing (what the per-node path's savepoint gives) and the next one sees the
//!    state its predecessors left;
//! 3. write the net result: one `DELETE` of the rows that are gone, one
//!    `INSERT … SELECT FROM unnest(…) ON CONFLICT (id) DO UPDATE` of the rows with a new
//!    vector, one `UPDATE … FROM unnest(…)` of the payload-only rewrites (their stored
//!    vector kept) and one upsert of the seen versions. Each id and URI appears once per
//!    statement (its final state), in byte order (row locks in one order).
//!
//! The URIs of the batch are locked before step 1 (as in the per-node path), so the working
//! set is what the database holds for them until the commit. Rows read by id only (a record
//! whose id another node's row holds) are not under those locks: if one vanished before
//! its payload-only rewrite, the rewrite finds fewer rows than planned and the whole batch
//! fails retryably ([`IndexError::Raced`]), where the per-node path failed that node alone.
//! A database error fails the whole batch too (the per-node path's savepoint kept it to one
//! node); the worker then retries every event of the batch.

use std::collections::{BTreeSet, HashMap, HashSet};

use ce_core::{CtxUri, IndexRecord};

use super::{NodeRecord, NodeWrite, PgVector, SyncOutcome, WriteTx, col, pairs_of};
use crate::error::{IndexError, Result};
use crate::records::{SeenVersion, check_node_records, to_i64};
use crate::vector::rules::{check_kept, check_vector, missing_vector, text_hash};

/// A row of the working set.
#[derive(Debug, Clone, Copy)]
enum Row<'a> {
    /// As stored when the batch began, on node `uri`; `text_hash`: its record's text hash,
    /// read for the ids the batch may keep the vector of.
    Stored {
        uri: &'a str,
        text_hash: Option<&'a str>,
    },
    /// Written with a vector of the batch.
    Put {
        record: &'a IndexRecord,
        version: i64,
        vector: &'a [f32],
    },
    /// Rewritten by the batch, keeping its stored vector.
    Rewritten {
        record: &'a IndexRecord,
        version: i64,
    },
}

impl<'a> Row<'a> {
    /// The text hash of the row's record (a payload-only write may keep its vector only for
    /// the same text, [`check_kept`]).
    fn text_hash(&self) -> Option<&'a str> {
        match *self {
            Row::Stored { text_hash, .. } => text_hash,
            Row::Put { record, .. } | Row::Rewritten { record, .. } => text_hash(record),
        }
    }

    fn uri(&self) -> &'a str {
        match *self {
            Row::Stored { uri, .. } => uri,
            Row::Put { record, .. } | Row::Rewritten { record, .. } => record.uri.as_str(),
        }
    }
}

/// The rows and versions a batch can touch, as the writes applied so far left them.
#[derive(Debug, Default)]
pub(super) struct Plan<'a> {
    /// Present rows by id.
    rows: HashMap<&'a str, Row<'a>>,
    /// Ids of the present rows, by node URI.
    by_uri: HashMap<&'a str, BTreeSet<&'a str>>,
    /// Ids present when the batch began.
    stored: HashSet<&'a str>,
    /// Ids whose row the batch changed or removed.
    touched: BTreeSet<&'a str>,
    /// Newest state seen per URI of the batch.
    seen: HashMap<&'a str, Option<SeenVersion>>,
    /// URIs whose seen version the batch changed.
    seen_touched: BTreeSet<&'a str>,
}

/// Strings read from the database, owned here so the plan can borrow them.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    rows: Vec<(String, String, Option<String>)>,
    seen: Vec<(String, SeenVersion)>,
}

impl Loaded {
    /// Reads the rows and seen versions `writes` can touch (step 1).
    pub(super) fn read(w: &mut WriteTx<'_, '_>, writes: &[NodeWrite]) -> Result<Loaded> {
        let uris: Vec<&str> = writes
            .iter()
            .map(|nw| nw.uri().as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let synced: Vec<&NodeRecord> = writes
            .iter()
            .filter_map(|nw| match nw {
                NodeWrite::Sync { records, .. } => Some(records),
                _ => None,
            })
            .flatten()
            .collect();
        let ids: Vec<&str> = synced
            .iter()
            .map(|r| r.record.id.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // The ids whose stored vector a payload-only write may keep: their text hash is read.
        let kept: Vec<&str> = synced
            .iter()
            .filter(|r| r.vector.is_none())
            .map(|r| r.record.id.as_str())
            .collect();
        let rows =
            w.tx.query(
                "SELECT id, uri, CASE WHEN id = ANY($3)
                     THEN (record::jsonb)->'metadata'->>'content_hash' END
                 FROM ce_vector_records WHERE uri = ANY($1) OR id = ANY($2)",
                &[&uris, &ids, &kept],
            )?
            .iter()
            .map(|r| Ok((col(r, 0)?, col(r, 1)?, col(r, 2)?)))
            .collect::<Result<_>>()?;
        let seen =
            w.tx.query(
                "SELECT uri, version, deleted FROM ce_vector_uri_versions WHERE uri = ANY($1)",
                &[&uris],
            )?
            .iter()
            .map(|r| {
                Ok((
                    col(r, 0)?,
                    SeenVersion {
                        version: col::<i64>(r, 1)? as u64,
                        deleted: col(r, 2)?,
                    },
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Loaded { rows, seen })
    }
}

impl<'a> Plan<'a> {
    /// The working set as `loaded` read it.
    pub(super) fn new(loaded: &'a Loaded) -> Plan<'a> {
        let mut plan = Plan::default();
        for (id, uri, text_hash) in &loaded.rows {
            plan.rows.insert(
                id,
                Row::Stored {
                    uri,
                    text_hash: text_hash.as_deref(),
                },
            );
            plan.by_uri.entry(uri).or_default().insert(id);
            plan.stored.insert(id);
        }
        for (uri, v) in &loaded.seen {
            plan.seen.insert(uri, Some(*v));
        }
        plan
    }

    fn seen_version(&self, uri: &str) -> Option<SeenVersion> {
        self.seen.get(uri).copied().flatten()
    }

    fn set_seen(&mut self, uri: &'a str, v: SeenVersion) {
        self.seen.insert(uri, Some(v));
        self.seen_touched.insert(uri);
    }

    fn remove(&mut self, id: &'a str) {
        if let Some(row) = self.rows.remove(id)
            && let Some(ids) = self.by_uri.get_mut(row.uri())
        {
            ids.remove(id);
        }
        self.touched.insert(id);
    }

    fn insert(&mut self, id: &'a str, row: Row<'a>) {
        self.remove(id);
        self.by_uri.entry(row.uri()).or_default().insert(id);
        self.rows.insert(id, row);
    }

    fn delete_node(&mut self, uri: &str) {
        let ids: Vec<&'a str> = self
            .by_uri
            .get(uri)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default();
        for id in ids {
            self.remove(id);
        }
    }

    /// Applies one node write to the working set (step 2): its outcome, or its error with
    /// nothing changed.
    pub(super) fn apply(&mut self, w: &WriteTx<'_, '_>, nw: &'a NodeWrite) -> Result<SyncOutcome> {
        match nw {
            NodeWrite::Sync {
                uri,
                version,
                records,
            } => self.sync_node(w, uri, *version, records),
            NodeWrite::Remove { uri, version } => {
                if !SeenVersion::admits_removal(self.seen_version(uri.as_str()), *version) {
                    return Ok(SyncOutcome::Stale);
                }
                to_i64(*version, "version")?;
                self.delete_node(uri.as_str());
                self.set_seen(uri.as_str(), SeenVersion::removed(*version));
                Ok(SyncOutcome::Applied)
            }
            NodeWrite::Purge { uri } => {
                self.delete_node(uri.as_str());
                Ok(SyncOutcome::Applied)
            }
        }
    }

    /// [`super::WriteTx::sync_node`] on the working set: the same checks in the same order.
    fn sync_node(
        &mut self,
        w: &WriteTx<'_, '_>,
        uri: &'a CtxUri,
        version: u64,
        records: &'a [NodeRecord],
    ) -> Result<SyncOutcome> {
        check_node_records(uri, records.iter().map(|r| &r.record))?;
        if !SeenVersion::admits_write(self.seen_version(uri.as_str()), version) {
            return Ok(SyncOutcome::Stale);
        }
        for r in records {
            match &r.vector {
                Some(v) => check_vector(&r.record.id, v, w.model.as_ref(), w.dimension)?,
                None => match self.rows.get(r.record.id.as_str()) {
                    Some(row) => check_kept(row.text_hash(), &r.record)?,
                    None => return Err(missing_vector(&r.record)),
                },
            }
        }
        // The per-node path fails on the version where it first writes it: a record's row,
        // or the seen version when there are no records.
        let stored_version = to_i64(
            version,
            if records.is_empty() {
                "version"
            } else {
                "node version"
            },
        )?;
        // Checked: from here on nothing fails.
        let keep: HashSet<&str> = records.iter().map(|r| r.record.id.as_str()).collect();
        let gone: Vec<&'a str> = self
            .by_uri
            .get(uri.as_str())
            .map(|ids| {
                ids.iter()
                    .copied()
                    .filter(|id| !keep.contains(id))
                    .collect()
            })
            .unwrap_or_default();
        for id in gone {
            self.remove(id);
        }
        for r in records {
            let id = r.record.id.as_str();
            let row = match (&r.vector, self.rows.get(id)) {
                (Some(v), _) => Row::Put {
                    record: &r.record,
                    version: stored_version,
                    vector: v,
                },
                // A payload-only rewrite of a row this batch wrote keeps the batch's vector.
                (None, Some(Row::Put { vector, .. })) => Row::Put {
                    record: &r.record,
                    version: stored_version,
                    vector,
                },
                (None, _) => Row::Rewritten {
                    record: &r.record,
                    version: stored_version,
                },
            };
            self.insert(id, row);
        }
        self.set_seen(uri.as_str(), SeenVersion::live(version));
        Ok(SyncOutcome::Applied)
    }

    /// Writes the net result (step 3).
    pub(super) fn write(self, w: &mut WriteTx<'_, '_>) -> Result<()> {
        let mut gone: Vec<&str> = Vec::new();
        let mut puts: Vec<(&IndexRecord, i64, &[f32])> = Vec::new();
        let mut rewrites: Vec<(&IndexRecord, i64)> = Vec::new();
        for id in &self.touched {
            match self.rows.get(id) {
                None if self.stored.contains(id) => gone.push(id),
                None | Some(Row::Stored { .. }) => {}
                Some(Row::Put {
                    record,
                    version,
                    vector,
                }) => puts.push((record, *version, vector)),
                Some(Row::Rewritten { record, version }) => rewrites.push((record, *version)),
            }
        }
        if !gone.is_empty() {
            w.tx.execute("DELETE FROM ce_vector_records WHERE id = ANY($1)", &[&gone])?;
        }
        w.put_rows(&puts)?;
        let n = w.rewrite_rows(&rewrites)?;
        if n != rewrites.len() as u64 {
            return Err(IndexError::Raced(format!(
                "{} of {} records to keep lost their stored vector while the batch was written: \
                 embed their text",
                rewrites.len() as u64 - n.min(rewrites.len() as u64),
                rewrites.len()
            )));
        }
        let (mut uris, mut versions, mut deleted) = (Vec::new(), Vec::new(), Vec::new());
        for uri in &self.seen_touched {
            if let Some(v) = self.seen_version(uri) {
                uris.push(*uri);
                versions.push(to_i64(v.version, "version")?);
                deleted.push(v.deleted);
            }
        }
        if !uris.is_empty() {
            w.tx.execute(
                "INSERT INTO ce_vector_uri_versions (uri, version, deleted)
                 SELECT * FROM unnest($1::text[], $2::int8[], $3::bool[])
                 ON CONFLICT (uri) DO UPDATE SET version = excluded.version,
                     deleted = excluded.deleted",
                &[&uris, &versions, &deleted],
            )?;
        }
        Ok(())
    }
}

/// Column arrays of rows to write, for `unnest`.
#[derive(Debug, Default)]
pub(super) struct RowArrays<'a> {
    pub ids: Vec<&'a str>,
    pub uris: Vec<&'a str>,
    pub parents: Vec<&'a str>,
    pub levels: Vec<i16>,
    pub versions: Vec<i64>,
    /// Each row's `pairs` as a JSON array of strings (`unnest` of a `text[][]` would
    /// flatten it, and rows have different numbers of pairs).
    pub pairs: Vec<String>,
    pub records: Vec<String>,
    pub vectors: Vec<PgVector<'a>>,
}

impl<'a> RowArrays<'a> {
    /// Appends the columns of `r` written at `version` (and `vector`, if any).
    pub(super) fn push(
        &mut self,
        r: &'a IndexRecord,
        version: i64,
        vector: Option<&'a [f32]>,
    ) -> Result<()> {
        let json = serde_json::to_string(r)
            .map_err(|e| IndexError::Corrupt(format!("record {}: {e}", r.id)))?;
        let pairs = serde_json::to_string(&pairs_of(r))
            .map_err(|e| IndexError::Corrupt(format!("record {} filters: {e}", r.id)))?;
        self.ids.push(&r.id);
        self.uris.push(r.uri.as_str());
        self.parents.push(r.parent_uri.as_str());
        self.levels.push(i16::from(r.level.as_u8()));
        self.versions.push(version);
        self.pairs.push(pairs);
        self.records.push(json);
        if let Some(v) = vector {
            self.vectors.push(PgVector::stored(v));
        }
        Ok(())
    }

    /// The parameters `$1`–`$7` of every row statement (id, uri, parent_uri, level,
    /// node_version, pairs, record); a statement that writes vectors adds them as `$8`.
    pub(super) fn columns(&self) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
        vec![
            &self.ids,
            &self.uris,
            &self.parents,
            &self.levels,
            &self.versions,
            &self.pairs,
            &self.records,
        ]
    }
}
