//! The row operations of ContextFS and RelationStore on SQLite ([`ReadTx`], [`WriteTx`]);
//! what the writes mean is written once in `crate::txn`.

use ce_core::{ContextNode, CtxUri, EventPayload, Layers, Millis, RelationEdge};
use rusqlite::{Connection, OptionalExtension, params};

use super::outbox::append_events_tx;
use super::{
    NODE_COLUMNS, get_node, get_tombstone, insert_node, node_from_row, subtree_bounds, subtree_sql,
};
use crate::derive::{DeriveChild, DeriveUsage, DirtyKey};
use crate::error::Result;
use crate::model::{LinkRequest, NodeStamp, WriteFence};
use crate::shared::{derive_child, dirty_key, stored_uri};
use crate::txn::{DirtyMemo, EdgeEnd, ReadTx, WriteTx, edge_uri, fence_lineage};

/// Whether a folder (`?1`) has a child whose abstract is pending: a probe of the partial
/// index of such children (schema migration 10), never a scan of the folder's children.
pub(super) const CHILD_PENDING_SQL: &str = "SELECT 1 FROM nodes INDEXED BY nodes_pending_abstract
     WHERE parent_uri = ?1 AND json_extract(provenance, '$.abstract.origin') = 'pending'
     LIMIT 1";

/// The children of `?1` as a folder's derivation reads them, their L1 and L2 cut to `?2`
/// characters ([`ReadTx::derive_children`]).
const DERIVE_CHILDREN_SQL: &str = "SELECT uri, abstract, substr(overview, 1, ?2),
         substr(content, 1, ?2), provenance
     FROM nodes WHERE parent_uri = ?1 ORDER BY uri";

/// One open read or write transaction on SQLite (`Transaction` derefs to `Connection`).
pub(super) struct SqlTx<'a> {
    pub(super) conn: &'a Connection,
    /// The consumers that get a delivery per appended event.
    consumers: &'a [String],
    memo: DirtyMemo,
}

impl<'a> SqlTx<'a> {
    pub(super) fn new(conn: &'a Connection, consumers: &'a [String]) -> Self {
        SqlTx {
            conn,
            consumers,
            memo: DirtyMemo::default(),
        }
    }
}

impl SqlTx<'_> {
    /// The first column of every row `sql` returns (a cached statement).
    pub(super) fn strings(&self, sql: &str, p: impl rusqlite::Params) -> Result<Vec<String>> {
        Ok(self
            .conn
            .prepare_cached(sql)?
            .query_map(p, |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    /// The first two columns of every row `sql` returns (a cached statement).
    pub(super) fn pairs<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql>(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
    ) -> Result<Vec<(A, B)>> {
        Ok(self
            .conn
            .prepare_cached(sql)?
            .query_map(p, |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?)
    }
}

impl ReadTx for SqlTx<'_> {
    fn node(&mut self, uri: &CtxUri) -> Result<Option<ContextNode>> {
        get_node(self.conn, uri)
    }

    fn tombstone(&mut self, uri: &CtxUri) -> Result<Option<u64>> {
        get_tombstone(self.conn, uri)
    }

    fn live_version(&mut self, uri: &CtxUri) -> Result<Option<u64>> {
        Ok(self
            .conn
            .prepare_cached("SELECT version FROM nodes WHERE uri = ?1")?
            .query_row([uri.as_str()], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64))
    }

    fn stamp(&mut self, uri: &CtxUri) -> Result<Option<NodeStamp>> {
        Ok(self
            .conn
            .prepare_cached("SELECT version, updated_at FROM nodes WHERE uri = ?1")?
            .query_row([uri.as_str()], |r| {
                Ok(NodeStamp {
                    version: r.get::<_, i64>(0)? as u64,
                    updated_at: r.get(1)?,
                })
            })
            .optional()?)
    }

    fn count_children(&mut self, uri: &CtxUri) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM nodes WHERE parent_uri = ?1")?
            .query_row([uri.as_str()], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn children(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE parent_uri = ?1 ORDER BY uri"
        ))?;
        let rows = stmt.query_map([uri.as_str()], node_from_row)?;
        rows.map(|r| r?).collect()
    }

    fn derive_children(&mut self, uri: &CtxUri, fallback_chars: usize) -> Result<Vec<DeriveChild>> {
        let mut stmt = self.conn.prepare_cached(DERIVE_CHILDREN_SQL)?;
        let chars = fallback_chars.clamp(1, i64::MAX as usize) as i64;
        let rows = stmt.query_map(params![uri.as_str(), chars], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Layers {
                    abstract_text: r.get(1)?,
                    overview: r.get(2)?,
                    content: r.get(3)?,
                },
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        rows.map(|r| {
            let (uri, layers, provenance) = r?;
            derive_child(uri, layers, provenance)
        })
        .collect()
    }

    fn child_pending(&mut self, uri: &CtxUri) -> Result<bool> {
        let mut stmt = self.conn.prepare_cached(CHILD_PENDING_SQL)?;
        Ok(stmt
            .query_row([uri.as_str()], |_| Ok(()))
            .optional()?
            .is_some())
    }

    fn subtree_nodes(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        let (lo, hi) = subtree_bounds(uri);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE {} ORDER BY uri",
            subtree_sql("uri", 1)
        ))?;
        let rows = stmt.query_map(params![uri.as_str(), lo, hi], node_from_row)?;
        rows.map(|r| r?).collect()
    }

    fn subtree_uris(&mut self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        let (lo, hi) = subtree_bounds(uri);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT uri FROM nodes WHERE {} ORDER BY uri",
            subtree_sql("uri", 1)
        ))?;
        let rows = stmt.query_map(params![uri.as_str(), lo, hi], |r| r.get::<_, String>(0))?;
        rows.map(|r| stored_uri(&r?)).collect()
    }

    fn subtree_stamps(&mut self, uri: &CtxUri) -> Result<Vec<(CtxUri, NodeStamp)>> {
        let (lo, hi) = subtree_bounds(uri);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT uri, version, updated_at FROM nodes WHERE {} ORDER BY uri",
            subtree_sql("uri", 1)
        ))?;
        let rows = stmt.query_map(params![uri.as_str(), lo, hi], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        rows.map(|r| {
            let (u, version, updated_at) = r?;
            let stamp = NodeStamp {
                version: version as u64,
                updated_at,
            };
            Ok((stored_uri(&u)?, stamp))
        })
        .collect()
    }

    fn edges(&mut self, end: EdgeEnd, uri: &CtxUri) -> Result<Vec<RelationEdge>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT from_uri, to_uri, relation_type, weight, reason FROM relations
             WHERE {} = ?1 ORDER BY from_uri, to_uri, relation_type",
            end.column()
        ))?;
        let rows = stmt.query_map([uri.as_str()], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
            ))
        })?;
        rows.map(|row| {
            let (f, t, relation_type, weight, reason) = row?;
            Ok(RelationEdge {
                from_uri: edge_uri(&f)?,
                to_uri: edge_uri(&t)?,
                relation_type,
                weight,
                reason,
            })
        })
        .collect()
    }

    fn dirty(&mut self, uri: &CtxUri) -> Result<Option<DirtyKey>> {
        self.conn
            .prepare_cached(
                "SELECT uri, coalesce_version, derived_version, dirtied_at FROM derive_dirty
                 WHERE uri = ?1",
            )?
            .query_row([uri.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()?
            .map(|(u, c, d, a)| dirty_key(u, c, d, a))
            .transpose()
    }

    fn dirty_within(&mut self, uri: &CtxUri) -> Result<Vec<DirtyKey>> {
        let (lo, hi) = subtree_bounds(uri);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT uri, coalesce_version, derived_version, dirtied_at FROM derive_dirty
             WHERE {} AND coalesce_version > derived_version ORDER BY uri",
            subtree_sql("uri", 1)
        ))?;
        let rows = stmt.query_map(params![uri.as_str(), lo, hi], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
        rows.map(|row| {
            let (u, c, d, a) = row?;
            dirty_key(u, c, d, a)
        })
        .collect()
    }

    fn count_dirty(&mut self) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT count(*) FROM derive_dirty WHERE coalesce_version > derived_version",
            )?
            .query_row([], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn derive_usage(&mut self, day: &str) -> Result<DeriveUsage> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT tokens_in, tokens_out, derivations, discarded FROM derive_usage
                 WHERE day = ?1",
            )?
            .query_row([day], |r| {
                Ok(DeriveUsage {
                    tokens_in: r.get::<_, i64>(0)? as u64,
                    tokens_out: r.get::<_, i64>(1)? as u64,
                    derivations: r.get::<_, i64>(2)? as u64,
                    discarded: r.get::<_, i64>(3)? as u64,
                })
            })
            .optional()?
            .unwrap_or_default())
    }
}

impl WriteTx for SqlTx<'_> {
    fn insert_node(&mut self, n: &ContextNode) -> Result<()> {
        insert_node(self.conn, n)
    }

    fn remove_subtree(&mut self, uri: &CtxUri, now: Millis) -> Result<u64> {
        let (lo, hi) = subtree_bounds(uri);
        let within = subtree_sql("uri", 1);
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO tombstones (uri, version, deleted_at)
                 SELECT uri, version, ?4 FROM nodes WHERE {within} AND true
                 ON CONFLICT(uri) DO UPDATE SET version = excluded.version,
                    deleted_at = excluded.deleted_at"
            ))?
            .execute(params![uri.as_str(), lo, hi, now])?;
        let removed = self
            .conn
            .prepare_cached(&format!("DELETE FROM nodes WHERE {within}"))?
            .execute(params![uri.as_str(), lo, hi])?;
        Ok(removed as u64)
    }

    fn owners_into(&mut self, uri: &CtxUri) -> Result<Vec<String>> {
        let (lo, hi) = subtree_bounds(uri);
        self.strings(
            &format!(
                "SELECT DISTINCT from_uri FROM relations WHERE {} AND NOT {} ORDER BY from_uri",
                subtree_sql("to_uri", 1),
                subtree_sql("from_uri", 1)
            ),
            params![uri.as_str(), lo, hi],
        )
    }

    fn delete_edges_within(&mut self, uri: &CtxUri) -> Result<()> {
        let (lo, hi) = subtree_bounds(uri);
        self.conn
            .prepare_cached(&format!(
                "DELETE FROM relations WHERE {} OR {}",
                subtree_sql("from_uri", 1),
                subtree_sql("to_uri", 1)
            ))?
            .execute(params![uri.as_str(), lo, hi])?;
        Ok(())
    }

    fn rebase_edges(&mut self, from: &CtxUri, to: &CtxUri, now: Millis) -> Result<()> {
        let (lo, hi) = subtree_bounds(from);
        let prefix_len = from.as_str().chars().count() as i64;
        for col in ["from_uri", "to_uri"] {
            self.conn
                .prepare_cached(&format!(
                    "UPDATE relations SET {col} = ?4 || substr({col}, ?5 + 1), updated_at = ?6
                     WHERE {}",
                    subtree_sql(col, 1)
                ))?
                .execute(params![from.as_str(), lo, hi, to.as_str(), prefix_len, now])?;
        }
        Ok(())
    }

    fn bump_relation_version(&mut self, owner: &str) -> Result<Option<u64>> {
        Ok(self
            .conn
            .prepare_cached(
                "UPDATE nodes SET relation_version = relation_version + 1
                 WHERE uri = ?1 RETURNING relation_version",
            )?
            .query_row(params![owner], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64))
    }

    fn edge(
        &mut self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
    ) -> Result<Option<(f64, String)>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT weight, reason FROM relations
                 WHERE from_uri = ?1 AND to_uri = ?2 AND relation_type = ?3",
            )?
            .query_row(params![from.as_str(), to.as_str(), relation_type], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?)
    }

    fn upsert_edge(&mut self, from: &CtxUri, e: &LinkRequest, now: Millis) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO relations
                   (from_uri, to_uri, relation_type, weight, reason, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
                 ON CONFLICT(from_uri, to_uri, relation_type)
                 DO UPDATE SET weight = excluded.weight, reason = excluded.reason,
                    updated_at = ?6",
            )?
            .execute(params![
                from.as_str(),
                e.to.as_str(),
                e.relation_type,
                e.weight,
                e.reason,
                now
            ])?;
        Ok(())
    }

    fn delete_edge(&mut self, from: &CtxUri, to: &CtxUri, relation_type: &str) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached(
                "DELETE FROM relations WHERE from_uri = ?1 AND to_uri = ?2 AND relation_type = ?3",
            )?
            .execute(params![from.as_str(), to.as_str(), relation_type])?;
        Ok(n as u64)
    }

    fn append_events(&mut self, payloads: Vec<EventPayload>, now: Millis) -> Result<Vec<String>> {
        Ok(
            append_events_tx(self.conn, self.consumers, false, payloads, now)?
                .into_iter()
                .map(|e| e.event_id)
                .collect(),
        )
    }

    fn newer_fence(&mut self, fence: &WriteFence) -> Result<Option<(String, u64)>> {
        let (lo, hi) = subtree_bounds(&fence.path);
        let related = fence_lineage(fence);
        let ancestors = serde_json::to_string(&related)?;
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT path, token FROM fences
                 WHERE token > ?4 AND ({} OR path IN (SELECT value FROM json_each(?5)))
                 ORDER BY token DESC LIMIT 1",
                subtree_sql("path", 1)
            ))?
            .query_row(
                params![fence.path.as_str(), lo, hi, fence.token as i64, ancestors],
                |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)),
            )
            .optional()?)
    }

    fn record_fence(&mut self, fence: &WriteFence, now: Millis) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO fences (path, token, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT(path) DO UPDATE SET token = max(token, excluded.token),
                    updated_at = excluded.updated_at",
            )?
            .execute(params![fence.path.as_str(), fence.token as i64, now])?;
        Ok(())
    }

    fn insert_hold(&mut self, id: &str, at: &CtxUri, lease: &str, now: Millis) -> Result<()> {
        super::holds::insert_hold_tx(self.conn, id, at, lease, now)
    }

    fn bump_dirty_row(&mut self, uri: &CtxUri, now: Millis) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO derive_dirty (uri, coalesce_version, derived_version, dirtied_at)
                 VALUES (?1, 1, 0, ?2)
                 ON CONFLICT(uri) DO UPDATE SET coalesce_version = coalesce_version + 1,
                    dirtied_at = excluded.dirtied_at",
            )?
            .execute(params![uri.as_str(), now])?;
        Ok(())
    }

    fn mark_derived_row(&mut self, uri: &CtxUri, version: u64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE derive_dirty SET derived_version = max(derived_version, ?2)
                 WHERE uri = ?1",
            )?
            .execute(params![uri.as_str(), version as i64])?;
        Ok(())
    }

    fn dirty_memo(&mut self) -> &mut DirtyMemo {
        &mut self.memo
    }

    fn delete_dirty_rows_within(&mut self, uri: &CtxUri) -> Result<()> {
        let (lo, hi) = subtree_bounds(uri);
        self.conn
            .prepare_cached(&format!(
                "DELETE FROM derive_dirty WHERE {}",
                subtree_sql("uri", 1)
            ))?
            .execute(params![uri.as_str(), lo, hi])?;
        Ok(())
    }

    fn add_derive_usage(&mut self, day: &str, u: DeriveUsage) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO derive_usage (day, tokens_in, tokens_out, derivations, discarded)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(day) DO UPDATE SET tokens_in = tokens_in + excluded.tokens_in,
                    tokens_out = tokens_out + excluded.tokens_out,
                    derivations = derivations + excluded.derivations,
                    discarded = discarded + excluded.discarded",
            )?
            .execute(params![
                day,
                u.tokens_in as i64,
                u.tokens_out as i64,
                u.derivations as i64,
                u.discarded as i64
            ])?;
        Ok(())
    }
}
