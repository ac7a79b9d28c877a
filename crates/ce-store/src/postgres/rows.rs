//! The row operations of ContextFS and RelationStore on PostgreSQL ([`ReadTx`],
//! [`WriteTx`]); what the writes mean is written once in `crate::txn`. The SQL mirrors
//! `sqlite/rows.rs` statement for statement, except where a statement per URI would cost a
//! round trip per URI: the batched reads (`nodes`, `uri_versions`, `children_counts`,
//! `node_or_tombstone` and the read-ahead), which SQLite answers with a cached statement per
//! URI (the traits' defaults).

use std::collections::HashMap;

use ce_core::{ContextNode, CtxUri, EventPayload, Layers, Millis, RelationEdge};

use super::outbox::append_events_tx;
use super::{Tx, get_node, get_tombstone, insert_node, node_from_row, subtree_sql};
use crate::derive::{DeriveChild, DeriveUsage, DirtyKey};
use crate::error::Result;
use crate::model::{LinkRequest, NodeStamp, UriVersion, WriteFence};
use crate::shared::{NODE_COLUMNS, derive_child, dirty_key, stored_uri, subtree_bounds};
use crate::txn::{DirtyMemo, EdgeEnd, ReadTx, WriteTx, edge_uri, fence_lineage};

/// One open read or write transaction on PostgreSQL.
pub(super) struct PgTx<'t, 'c> {
    pub(super) tx: &'t mut Tx<'c>,
    /// The consumers that get a delivery per appended event.
    consumers: &'t [String],
    memo: DirtyMemo,
    ahead: ReadAhead,
}

/// What a batch will read with [`ReadTx::node_or_tombstone`] ([`ReadTx::read_ahead`]), what
/// has been read ahead of it, and what it inserted. A miss on an upcoming URI reads the next
/// [`READ_AHEAD_WINDOW`] of them in one statement: a batch of 10,000 puts costs 40 round trips
/// instead of 10,000 (a no-op `ce import` of 10,000 files: 1.2 s before). An entry is the
/// state when it was read; the transaction's own writes drop the entries they touch
/// (`insert_node`, `remove_subtree`, `bump_relation_version`: every statement that writes
/// `nodes` or `tombstones`), and no other transaction writes them meanwhile (source writes
/// hold the source lock), so a hit is what a read would return.
#[derive(Default)]
struct ReadAhead {
    queue: Vec<CtxUri>,
    /// The first position of `queue` not read ahead yet.
    next: usize,
    /// By URI: the node, or else its tombstone's version.
    read: HashMap<String, (Option<ContextNode>, Option<u64>)>,
    /// The nodes this transaction inserted and has not removed since, by URI: their version.
    /// For the same reasons these are live at that version, and [`ReadTx::uri_versions`] of
    /// them needs no statement (the ancestors a put checks are mostly folders the same import
    /// wrote).
    inserted: HashMap<String, u64>,
}

/// URIs per read-ahead statement (nodes held at once, at most).
const READ_AHEAD_WINDOW: usize = 256;

impl ReadAhead {
    /// The next window of URIs when `uri` is the first not read ahead yet; advances past
    /// it. The puts of a batch read their URIs in queue order, so a miss past the windows
    /// read is the URI at `next`; any other miss (an entry its own write dropped) is read
    /// alone — one comparison, not a search of the queue per miss.
    fn window_from(&mut self, uri: &CtxUri) -> Option<&[CtxUri]> {
        if self.queue.get(self.next) != Some(uri) {
            return None;
        }
        let at = self.next;
        self.next = (at + READ_AHEAD_WINDOW).min(self.queue.len());
        Some(&self.queue[at..self.next])
    }

    /// Forgets what was read of `uri`.
    fn forget(&mut self, uri: &str) {
        self.read.remove(uri);
    }

    /// Forgets what was read or inserted within the subtree `uri`.
    fn forget_within(&mut self, uri: &CtxUri) {
        let outside = |u: &String| CtxUri::parse_stored(u).is_ok_and(|u| !u.is_within(uri));
        self.read.retain(|u, _| outside(u));
        self.inserted.retain(|u, _| outside(u));
    }
}

impl<'t, 'c> PgTx<'t, 'c> {
    pub(super) fn new(tx: &'t mut Tx<'c>, consumers: &'t [String]) -> Self {
        PgTx {
            tx,
            consumers,
            memo: DirtyMemo::default(),
            ahead: ReadAhead::default(),
        }
    }
}

// The batched reads take the URIs as one `text[]` parameter (`$1`) and look each one up in a
// subquery of its own (a scalar subquery, or a LATERAL one that `LIMIT 1` keeps from being
// flattened into a join): a primary-key probe per URI whatever the table's statistics say.
// As a join, a generic plan cached while the table was near empty (a fresh store being
// imported into) hashed the whole table on every call: 0.4 ms per three-URI ancestor check
// at 10,000 nodes.

/// [`ReadTx::nodes`]: the live nodes among `$1`, in its order.
fn nodes_sql() -> String {
    format!(
        "SELECT n.* FROM unnest($1::text[]) WITH ORDINALITY AS want(key, i)
         CROSS JOIN LATERAL (SELECT {NODE_COLUMNS} FROM nodes WHERE uri = want.key LIMIT 1) AS n
         ORDER BY want.i"
    )
}

/// [`ReadTx::read_ahead`]: per URI of `$1`, its node's columns (all null without a node),
/// its tombstone's version and the URI.
fn read_ahead_sql() -> String {
    format!(
        "SELECT n.*, (SELECT version FROM tombstones WHERE tombstones.uri = want.key), want.key
         FROM unnest($1::text[]) AS want(key)
         LEFT JOIN LATERAL
             (SELECT {NODE_COLUMNS} FROM nodes WHERE uri = want.key LIMIT 1) AS n ON true"
    )
}

/// [`ReadTx::uri_versions`]: the live version and the tombstone of each URI of `$1`.
const URI_VERSIONS_SQL: &str = "SELECT (SELECT version FROM nodes WHERE uri = want.key),
         (SELECT version FROM tombstones WHERE uri = want.key)
     FROM unnest($1::text[]) WITH ORDINALITY AS want(key, i) ORDER BY want.i";

/// [`ReadTx::children_counts`]: how many children each URI of `$1` has.
const CHILDREN_COUNTS_SQL: &str = "SELECT (SELECT count(*) FROM nodes WHERE parent_uri = want.key)
     FROM unnest($1::text[]) WITH ORDINALITY AS want(key, i) ORDER BY want.i";

impl ReadTx for PgTx<'_, '_> {
    fn node(&mut self, uri: &CtxUri) -> Result<Option<ContextNode>> {
        get_node(self.tx, uri)
    }

    fn read_ahead(&mut self, uris: Vec<CtxUri>) {
        self.ahead.queue = uris;
        self.ahead.next = 0;
        self.ahead.read.clear();
    }

    fn node_or_tombstone(&mut self, uri: &CtxUri) -> Result<(Option<ContextNode>, Option<u64>)> {
        if let Some(hit) = self.ahead.read.remove(uri.as_str()) {
            return Ok(hit);
        }
        if let Some(window) = self.ahead.window_from(uri) {
            let rows = self.tx.query(&read_ahead_sql(), &[&uri_strs(window)])?;
            for r in &rows {
                let key: String = r.try_get(17)?;
                let state = match r.try_get::<_, Option<&str>>(0)? {
                    Some(_) => (Some(node_from_row(r)?), None),
                    None => (None, r.try_get::<_, Option<i64>>(16)?.map(|v| v as u64)),
                };
                self.ahead.read.insert(key, state);
            }
            if let Some(hit) = self.ahead.read.remove(uri.as_str()) {
                return Ok(hit);
            }
        }
        let row = self.tx.query_one(
            &format!(
                "SELECT {NODE_COLUMNS},
                     (SELECT version FROM tombstones WHERE tombstones.uri = want.key)
                 FROM (SELECT $1::text AS key) AS want
                 LEFT JOIN nodes ON nodes.uri = want.key"
            ),
            &[&uri.as_str()],
        )?;
        if row.try_get::<_, Option<&str>>(0)?.is_none() {
            let tomb: Option<i64> = row.try_get(16)?;
            return Ok((None, tomb.map(|v| v as u64)));
        }
        Ok((Some(node_from_row(&row)?), None))
    }

    fn tombstone(&mut self, uri: &CtxUri) -> Result<Option<u64>> {
        get_tombstone(self.tx, uri)
    }

    fn live_version(&mut self, uri: &CtxUri) -> Result<Option<u64>> {
        Ok(self
            .tx
            .query_opt("SELECT version FROM nodes WHERE uri = $1", &[&uri.as_str()])?
            .map(|r| r.try_get::<_, i64>(0))
            .transpose()?
            .map(|v| v as u64))
    }

    fn stamp(&mut self, uri: &CtxUri) -> Result<Option<NodeStamp>> {
        self.tx
            .query_opt(
                "SELECT version, updated_at FROM nodes WHERE uri = $1",
                &[&uri.as_str()],
            )?
            .map(|r| {
                Ok(NodeStamp {
                    version: r.try_get::<_, i64>(0)? as u64,
                    updated_at: r.try_get(1)?,
                })
            })
            .transpose()
    }

    fn count_children(&mut self, uri: &CtxUri) -> Result<u64> {
        let n: i64 = self
            .tx
            .query_one(
                "SELECT count(*) FROM nodes WHERE parent_uri = $1",
                &[&uri.as_str()],
            )?
            .try_get(0)?;
        Ok(n as u64)
    }

    fn nodes(&mut self, uris: &[CtxUri]) -> Result<Vec<ContextNode>> {
        self.tx
            .query(&nodes_sql(), &[&uri_strs(uris)])?
            .iter()
            .map(node_from_row)
            .collect()
    }

    fn uri_versions(&mut self, uris: &[CtxUri]) -> Result<Vec<UriVersion>> {
        let inserted: Option<Vec<UriVersion>> = uris
            .iter()
            .map(|u| {
                self.ahead
                    .inserted
                    .get(u.as_str())
                    .map(|v| UriVersion::Live(*v))
            })
            .collect();
        if let Some(known) = inserted {
            return Ok(known);
        }
        self.tx
            .query(URI_VERSIONS_SQL, &[&uri_strs(uris)])?
            .iter()
            .map(|r| {
                let live: Option<i64> = r.try_get(0)?;
                let removed: Option<i64> = r.try_get(1)?;
                Ok(match (live, removed) {
                    (Some(v), _) => UriVersion::Live(v as u64),
                    (None, Some(t)) => UriVersion::Deleted(t as u64),
                    (None, None) => UriVersion::Unknown,
                })
            })
            .collect()
    }

    fn children_counts(&mut self, uris: &[CtxUri]) -> Result<Vec<u64>> {
        self.tx
            .query(CHILDREN_COUNTS_SQL, &[&uri_strs(uris)])?
            .iter()
            .map(|r| Ok(r.try_get::<_, i64>(0)? as u64))
            .collect()
    }

    fn children(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        self.tx
            .query(
                &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE parent_uri = $1 ORDER BY uri"),
                &[&uri.as_str()],
            )?
            .iter()
            .map(node_from_row)
            .collect()
    }

    fn derive_children(&mut self, uri: &CtxUri, fallback_chars: usize) -> Result<Vec<DeriveChild>> {
        let chars = fallback_chars.clamp(1, i32::MAX as usize) as i32;
        self.tx
            .query(DERIVE_CHILDREN_SQL, &[&uri.as_str(), &chars])?
            .iter()
            .map(|r| {
                let layers = Layers {
                    abstract_text: r.try_get(1)?,
                    overview: r.try_get(2)?,
                    content: r.try_get(3)?,
                };
                derive_child(r.try_get(0)?, layers, r.try_get(4)?)
            })
            .collect()
    }

    fn child_pending(&mut self, uri: &CtxUri) -> Result<bool> {
        Ok(self
            .tx
            .query_opt(CHILD_PENDING_SQL, &[&uri.as_str()])?
            .is_some())
    }
    fn subtree_nodes(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx
            .query(
                &format!(
                    "SELECT {NODE_COLUMNS} FROM nodes WHERE {} ORDER BY uri",
                    subtree_sql("uri", 1)
                ),
                &[&uri.as_str(), &lo, &hi],
            )?
            .iter()
            .map(node_from_row)
            .collect()
    }

    fn subtree_uris(&mut self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx
            .query(
                &format!(
                    "SELECT uri FROM nodes WHERE {} ORDER BY uri",
                    subtree_sql("uri", 1)
                ),
                &[&uri.as_str(), &lo, &hi],
            )?
            .iter()
            .map(|r| stored_uri(&r.get::<_, String>(0)))
            .collect()
    }

    fn subtree_stamps(&mut self, uri: &CtxUri) -> Result<Vec<(CtxUri, NodeStamp)>> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx
            .query(
                &format!(
                    "SELECT uri, version, updated_at FROM nodes WHERE {} ORDER BY uri",
                    subtree_sql("uri", 1)
                ),
                &[&uri.as_str(), &lo, &hi],
            )?
            .iter()
            .map(|r| {
                let stamp = NodeStamp {
                    version: r.try_get::<_, i64>(1)? as u64,
                    updated_at: r.try_get(2)?,
                };
                Ok((stored_uri(&r.try_get::<_, String>(0)?)?, stamp))
            })
            .collect()
    }

    fn edges(&mut self, end: EdgeEnd, uri: &CtxUri) -> Result<Vec<RelationEdge>> {
        self.tx
            .query(
                &format!(
                    "SELECT from_uri, to_uri, relation_type, weight, reason FROM relations
                     WHERE {} = $1 ORDER BY from_uri, to_uri, relation_type",
                    end.column()
                ),
                &[&uri.as_str()],
            )?
            .iter()
            .map(|r| {
                Ok(RelationEdge {
                    from_uri: edge_uri(r.try_get(0)?)?,
                    to_uri: edge_uri(r.try_get(1)?)?,
                    relation_type: r.try_get(2)?,
                    weight: r.try_get(3)?,
                    reason: r.try_get(4)?,
                })
            })
            .collect()
    }

    fn dirty(&mut self, uri: &CtxUri) -> Result<Option<DirtyKey>> {
        self.tx
            .query_opt(
                "SELECT uri, coalesce_version, derived_version, dirtied_at FROM derive_dirty
                 WHERE uri = $1",
                &[&uri.as_str()],
            )?
            .map(|r| dirty_key(r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))
            .transpose()
    }

    fn dirty_within(&mut self, uri: &CtxUri) -> Result<Vec<DirtyKey>> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx
            .query(
                &format!(
                    "SELECT uri, coalesce_version, derived_version, dirtied_at FROM derive_dirty
                     WHERE {} AND coalesce_version > derived_version ORDER BY uri",
                    subtree_sql("uri", 1)
                ),
                &[&uri.as_str(), &lo, &hi],
            )?
            .iter()
            .map(|r| dirty_key(r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))
            .collect()
    }

    fn count_dirty(&mut self) -> Result<u64> {
        let n: i64 = self
            .tx
            .query_one(
                "SELECT count(*) FROM derive_dirty WHERE coalesce_version > derived_version",
                &[],
            )?
            .try_get(0)?;
        Ok(n as u64)
    }

    fn derive_usage(&mut self, day: &str) -> Result<DeriveUsage> {
        let Some(r) = self.tx.query_opt(
            "SELECT tokens_in, tokens_out, derivations, discarded FROM derive_usage
             WHERE day = $1",
            &[&day],
        )?
        else {
            return Ok(DeriveUsage::default());
        };
        Ok(DeriveUsage {
            tokens_in: r.try_get::<_, i64>(0)? as u64,
            tokens_out: r.try_get::<_, i64>(1)? as u64,
            derivations: r.try_get::<_, i64>(2)? as u64,
            discarded: r.try_get::<_, i64>(3)? as u64,
        })
    }
}

impl WriteTx for PgTx<'_, '_> {
    fn insert_node(&mut self, n: &ContextNode) -> Result<()> {
        self.ahead.forget(n.uri.as_str());
        insert_node(self.tx, n)?;
        self.ahead
            .inserted
            .insert(n.uri.as_str().to_owned(), n.version);
        Ok(())
    }

    fn remove_subtree(&mut self, uri: &CtxUri, now: Millis) -> Result<u64> {
        self.ahead.forget_within(uri);
        let (lo, hi) = subtree_bounds(uri);
        let within = subtree_sql("uri", 1);
        self.tx.execute(
            &format!(
                "INSERT INTO tombstones (uri, version, deleted_at)
                 SELECT uri, version, $4 FROM nodes WHERE {within}
                 ON CONFLICT (uri) DO UPDATE SET version = excluded.version,
                    deleted_at = excluded.deleted_at"
            ),
            &[&uri.as_str(), &lo, &hi, &now],
        )?;
        self.tx.execute(
            &format!("DELETE FROM nodes WHERE {within}"),
            &[&uri.as_str(), &lo, &hi],
        )
    }

    fn owners_into(&mut self, uri: &CtxUri) -> Result<Vec<String>> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx
            .query(
                &format!(
                    "SELECT DISTINCT from_uri FROM relations WHERE {} AND NOT {}
                     ORDER BY from_uri",
                    subtree_sql("to_uri", 1),
                    subtree_sql("from_uri", 1)
                ),
                &[&uri.as_str(), &lo, &hi],
            )?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }

    fn delete_edges_within(&mut self, uri: &CtxUri) -> Result<()> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx.execute(
            &format!(
                "DELETE FROM relations WHERE {} OR {}",
                subtree_sql("from_uri", 1),
                subtree_sql("to_uri", 1)
            ),
            &[&uri.as_str(), &lo, &hi],
        )?;
        Ok(())
    }

    fn rebase_edges(&mut self, from: &CtxUri, to: &CtxUri, now: Millis) -> Result<()> {
        let (lo, hi) = subtree_bounds(from);
        // substr counts characters in both databases (UTF-8 text).
        let prefix_len = from.as_str().chars().count() as i64;
        for col in ["from_uri", "to_uri"] {
            self.tx.execute(
                &format!(
                    "UPDATE relations SET {col} = $4 || substr({col}, ($5::bigint + 1)::integer),
                        updated_at = $6
                     WHERE {}",
                    subtree_sql(col, 1)
                ),
                &[&from.as_str(), &lo, &hi, &to.as_str(), &prefix_len, &now],
            )?;
        }
        Ok(())
    }

    fn bump_relation_version(&mut self, owner: &str) -> Result<Option<u64>> {
        self.ahead.forget(owner);
        Ok(self
            .tx
            .query_opt(
                "UPDATE nodes SET relation_version = relation_version + 1
                 WHERE uri = $1 RETURNING relation_version",
                &[&owner],
            )?
            .map(|r| r.try_get::<_, i64>(0))
            .transpose()?
            .map(|v| v as u64))
    }

    fn edge(
        &mut self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
    ) -> Result<Option<(f64, String)>> {
        self.tx
            .query_opt(
                "SELECT weight, reason FROM relations
                 WHERE from_uri = $1 AND to_uri = $2 AND relation_type = $3",
                &[&from.as_str(), &to.as_str(), &relation_type],
            )?
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .transpose()
    }

    fn upsert_edge(&mut self, from: &CtxUri, e: &LinkRequest, now: Millis) -> Result<()> {
        self.tx.execute(
            "INSERT INTO relations
               (from_uri, to_uri, relation_type, weight, reason, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $6)
             ON CONFLICT (from_uri, to_uri, relation_type)
             DO UPDATE SET weight = excluded.weight, reason = excluded.reason, updated_at = $6",
            &[
                &from.as_str(),
                &e.to.as_str(),
                &e.relation_type,
                &e.weight,
                &e.reason,
                &now,
            ],
        )?;
        Ok(())
    }

    fn delete_edge(&mut self, from: &CtxUri, to: &CtxUri, relation_type: &str) -> Result<u64> {
        self.tx.execute(
            "DELETE FROM relations WHERE from_uri = $1 AND to_uri = $2 AND relation_type = $3",
            &[&from.as_str(), &to.as_str(), &relation_type],
        )
    }

    fn append_events(&mut self, payloads: Vec<EventPayload>, now: Millis) -> Result<Vec<String>> {
        Ok(
            append_events_tx(self.tx, self.consumers, false, payloads, now)?
                .into_iter()
                .map(|e| e.event_id)
                .collect(),
        )
    }

    fn newer_fence(&mut self, fence: &WriteFence) -> Result<Option<(String, u64)>> {
        let (lo, hi) = subtree_bounds(&fence.path);
        let related = fence_lineage(fence);
        let token = fence.token as i64;
        self.tx
            .query_opt(
                &format!(
                    "SELECT path, token FROM fences
                     WHERE token > $4 AND ({} OR path = ANY($5))
                     ORDER BY token DESC LIMIT 1",
                    subtree_sql("path", 1)
                ),
                &[&fence.path.as_str(), &lo, &hi, &token, &related],
            )?
            .map(|r| Ok((r.try_get(0)?, r.try_get::<_, i64>(1)? as u64)))
            .transpose()
    }

    fn record_fence(&mut self, fence: &WriteFence, now: Millis) -> Result<()> {
        let token = fence.token as i64;
        self.tx.execute(
            "INSERT INTO fences (path, token, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (path) DO UPDATE SET token = greatest(fences.token, excluded.token),
                updated_at = excluded.updated_at",
            &[&fence.path.as_str(), &token, &now],
        )?;
        Ok(())
    }

    fn insert_hold(&mut self, id: &str, at: &CtxUri, lease: &str, now: Millis) -> Result<()> {
        super::holds::insert_hold_tx(self.tx, id, at, lease, now)
    }

    fn bump_dirty_row(&mut self, uri: &CtxUri, now: Millis) -> Result<()> {
        self.tx.execute(
            "INSERT INTO derive_dirty (uri, coalesce_version, derived_version, dirtied_at)
             VALUES ($1, 1, 0, $2)
             ON CONFLICT (uri) DO UPDATE SET
                coalesce_version = derive_dirty.coalesce_version + 1,
                dirtied_at = excluded.dirtied_at",
            &[&uri.as_str(), &now],
        )?;
        Ok(())
    }

    fn mark_derived_row(&mut self, uri: &CtxUri, version: u64) -> Result<()> {
        self.tx.execute(
            "UPDATE derive_dirty SET derived_version = GREATEST(derived_version, $2)
             WHERE uri = $1",
            &[&uri.as_str(), &(version as i64)],
        )?;
        Ok(())
    }

    fn dirty_memo(&mut self) -> &mut DirtyMemo {
        &mut self.memo
    }

    fn delete_dirty_rows_within(&mut self, uri: &CtxUri) -> Result<()> {
        let (lo, hi) = subtree_bounds(uri);
        self.tx.execute(
            &format!("DELETE FROM derive_dirty WHERE {}", subtree_sql("uri", 1)),
            &[&uri.as_str(), &lo, &hi],
        )?;
        Ok(())
    }

    fn add_derive_usage(&mut self, day: &str, u: DeriveUsage) -> Result<()> {
        self.tx.execute(
            "INSERT INTO derive_usage (day, tokens_in, tokens_out, derivations, discarded)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (day) DO UPDATE SET
                tokens_in = derive_usage.tokens_in + excluded.tokens_in,
                tokens_out = derive_usage.tokens_out + excluded.tokens_out,
                derivations = derive_usage.derivations + excluded.derivations,
                discarded = derive_usage.discarded + excluded.discarded",
            &[
                &day,
                &(u.tokens_in as i64),
                &(u.tokens_out as i64),
                &(u.derivations as i64),
                &(u.discarded as i64),
            ],
        )?;
        Ok(())
    }
}

/// The children of `$1` as a folder's derivation reads them, their L1 and L2 cut to `$2`
/// characters (SQLite's statement).
const DERIVE_CHILDREN_SQL: &str = "SELECT uri, abstract, substr(overview, 1, $2::integer),
         substr(content, 1, $2::integer), provenance
     FROM nodes WHERE parent_uri = $1 ORDER BY uri";

/// Whether a folder (`$1`) has a child whose abstract is pending: a probe of the partial
/// index of such children (schema migration 9), never a scan of the folder's children.
const CHILD_PENDING_SQL: &str = "SELECT 1 FROM nodes
     WHERE parent_uri = $1 AND (provenance::jsonb -> 'abstract' ->> 'origin') = 'pending'
     LIMIT 1";

/// The URIs of `uris` as text, for a `text[]` parameter.
fn uri_strs(uris: &[CtxUri]) -> Vec<&str> {
    uris.iter().map(CtxUri::as_str).collect()
}

#[cfg(test)]
mod tests {
    use ce_core::Config;
    use ce_testkit::pg::TestDb;

    use super::super::{PgStore, explain};
    use super::{
        CHILD_PENDING_SQL, CHILDREN_COUNTS_SQL, URI_VERSIONS_SQL, nodes_sql, read_ahead_sql,
    };

    /// The batched reads probe the primary key (or the parent index) once per URI, in a
    /// store never analyzed and near empty — the statistics of a fresh store at the start of
    /// its first import, when a prepared statement caches the plan it keeps — for custom and
    /// generic plans alike; never a scan or a hash of the table.
    #[test]
    fn batched_reads_probe_an_index_per_uri_whatever_the_statistics() {
        let db = TestDb::create("rows_explain");
        let store = PgStore::open(db.url(), Config::default()).expect("open");
        let args = "('{ctx://a,ctx://a/b,ctx://a/b/c}')";
        for mode in ["force_custom_plan", "force_generic_plan"] {
            for (sql, indexes) in [
                (nodes_sql(), &["nodes_pkey"][..]),
                (read_ahead_sql(), &["nodes_pkey", "tombstones_pkey"][..]),
                (
                    URI_VERSIONS_SQL.to_owned(),
                    &["nodes_pkey", "tombstones_pkey"][..],
                ),
                (CHILDREN_COUNTS_SQL.to_owned(), &["nodes_by_parent"][..]),
            ] {
                let plan = explain(&store, mode, &sql, args);
                for index in indexes {
                    assert!(plan.contains(index), "{mode}: {sql}\n{plan}");
                }
                for bad in ["Seq Scan on nodes", "Seq Scan on tombstones", "Hash"] {
                    assert!(!plan.contains(bad), "{mode}: {sql}\n{plan}");
                }
            }
        }
    }

    /// Whether a folder must wait for a pending child is a probe of the partial index of
    /// pending children, in a folder of 2,000 children none of them pending (the scan it
    /// replaced read them all), for custom and generic plans alike.
    #[test]
    fn a_pending_child_is_looked_up_in_its_partial_index() {
        let db = TestDb::create("rows_pending_explain");
        let store = PgStore::open(db.url(), Config::default()).expect("open");
        store
            .write(super::super::WriteKind::Bookkeeping, |tx, _| {
                tx.batch(
                    "INSERT INTO nodes (uri, parent_uri, context_type, category, owner_space,
                         abstract, overview, content, meta, version, content_hash,
                         relation_version, created_at, updated_at, trace_id, provenance)
                     SELECT 'ctx://f/c' || i, 'ctx://f', 'resource', '', 'shared', 'a', '', 'c',
                         '{}', 1, '', 0, 0, 0, '', '{\"abstract\":{\"origin\":\"user\"}}'
                     FROM generate_series(1, 2000) AS i;
                     ANALYZE nodes",
                )
            })
            .expect("children");
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let plan = explain(&store, mode, CHILD_PENDING_SQL, "('ctx://f')");
            assert!(plan.contains("nodes_pending_abstract"), "{mode}\n{plan}");
            assert!(!plan.contains("Seq Scan"), "{mode}\n{plan}");
        }
    }
}
