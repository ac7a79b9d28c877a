//! ContextFS on SQLite: node writes, removes and moves, each with its events in one
//! transaction.

use ce_core::{
    ContextNode, CtxUri, DeleteContextPayload, EVENT_VERSION, EventPayload, Millis,
    MoveContextPayload, UpsertContextPayload, UpsertReason,
};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::outbox::append_events_tx;
use super::relations::{bump_relation_versions, relation_event};
use super::{
    Durability, NODE_COLUMNS, SqliteStore, get_node, get_tombstone, insert_node, node_from_row,
    subtree_bounds, subtree_sql,
};
use crate::error::{Result, StoreError};
use crate::model::{
    ContextFs, NodeStat, PutRequest, UriVersion, WriteFence, WriteOp, WriteOutcome,
};
use crate::plan::{self, check_expected, container, next_version, plan_put, trace_id_or_new};

fn upsert_event(node: &ContextNode, reason: UpsertReason) -> EventPayload {
    EventPayload::UpsertContext(UpsertContextPayload {
        event_version: EVENT_VERSION,
        uri: node.uri.clone(),
        expected_node_version: node.version,
        reason,
        trace_id: node.trace_id.clone(),
    })
}

impl SqliteStore {
    /// Creates the missing ancestors of `uri` as containers (like `mkdir -p`), returning
    /// their events. Invariant TR1: every node's parent is a node or the root.
    fn create_ancestors(
        &self,
        tx: &Transaction<'_>,
        uri: &CtxUri,
        now: i64,
        trace_id: &str,
    ) -> Result<Vec<EventPayload>> {
        let mut events = Vec::new();
        for anc in uri.ancestors() {
            if get_node(tx, &anc)?.is_some() {
                continue;
            }
            let c = container(
                &anc,
                next_version(None, get_tombstone(tx, &anc)?),
                now,
                trace_id,
            );
            insert_node(tx, &c)?;
            events.push(upsert_event(&c, UpsertReason::Create));
        }
        Ok(events)
    }

    /// `put` inside an open transaction.
    pub(super) fn put_tx(
        &self,
        tx: &Transaction<'_>,
        uri: &CtxUri,
        req: PutRequest,
        now: i64,
    ) -> Result<WriteOutcome> {
        let trace_id = trace_id_or_new(req.trace_id.clone());
        let max = self.config.store.max_layer_bytes;
        let existing = get_node(tx, uri)?;
        let tomb = get_tombstone(tx, uri)?;
        let Some(planned) = plan_put(uri, existing.as_ref(), tomb, req, now, max, &trace_id)?
        else {
            return Ok(WriteOutcome {
                uri: uri.clone(),
                version: existing.map_or(0, |n| n.version),
                changed: false,
                event_ids: Vec::new(),
                nodes_affected: 0,
                trace_id,
            });
        };
        let mut events = if existing.is_none() {
            self.create_ancestors(tx, uri, now, &trace_id)?
        } else {
            Vec::new()
        };
        insert_node(tx, &planned.node)?;
        events.push(upsert_event(&planned.node, planned.reason));
        let nodes_affected = events.len() as u64;
        let event_ids = self.commit_events(tx, events, now)?;
        Ok(WriteOutcome {
            uri: uri.clone(),
            version: planned.node.version,
            changed: true,
            event_ids,
            nodes_affected,
            trace_id,
        })
    }

    pub(super) fn commit_events(
        &self,
        tx: &Transaction<'_>,
        events: Vec<EventPayload>,
        now: i64,
    ) -> Result<Vec<String>> {
        let consumers = &self.config.index.outbox.consumers;
        Ok(append_events_tx(tx, consumers, events, now)?
            .into_iter()
            .map(|e| e.event_id)
            .collect())
    }
}

fn subtree_nodes(conn: &Connection, uri: &CtxUri) -> Result<Vec<ContextNode>> {
    let (lo, hi) = subtree_bounds(uri);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {NODE_COLUMNS} FROM nodes WHERE {} ORDER BY uri",
        subtree_sql("uri", 1)
    ))?;
    let rows = stmt.query_map(params![uri.as_str(), lo, hi], node_from_row)?;
    let mut out = Vec::new();
    for r in rows {
        out.push(r??);
    }
    Ok(out)
}

fn count_children(conn: &Connection, uri: &CtxUri) -> Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM nodes WHERE parent_uri = ?1")?
        .query_row([uri.as_str()], |r| r.get(0))?;
    Ok(n as u64)
}

fn stat_of(conn: &Connection, n: ContextNode) -> Result<NodeStat> {
    let children = count_children(conn, &n.uri)?;
    let l = &n.layers;
    Ok(NodeStat {
        layer_bytes: [
            l.abstract_text.len() as u64,
            l.overview.len() as u64,
            l.content.len() as u64,
        ],
        children,
        uri: n.uri,
        parent_uri: n.parent_uri,
        context_type: n.context_type,
        category: n.category,
        owner_space: n.owner_space,
        version: n.version,
        content_hash: n.content_hash,
        relation_version: n.relation_version,
        meta: n.meta,
        created_at_ms: n.created_at_ms,
        updated_at_ms: n.updated_at_ms,
    })
}

impl SqliteStore {
    fn rm_tx(
        &self,
        tx: &Transaction<'_>,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
        now: Millis,
    ) -> Result<WriteOutcome> {
        if uri.is_root() {
            return Err(StoreError::RootNotWritable);
        }
        let trace_id = trace_id_or_new(trace_id);
        {
            let node =
                get_node(tx, uri)?.ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() })?;
            check_expected(uri, expect_version, Some(node.version))?;
            let children = count_children(tx, uri)?;
            if children > 0 && !recursive {
                return Err(StoreError::NotEmpty {
                    uri: uri.clone(),
                    children,
                });
            }
            let (lo, hi) = subtree_bounds(uri);
            let within = subtree_sql("uri", 1);
            let p = params![uri.as_str(), lo, hi, now];
            tx.execute(
                &format!(
                    "INSERT INTO tombstones (uri, version, deleted_at)
                     SELECT uri, version, ?4 FROM nodes WHERE {within} AND true
                     ON CONFLICT(uri) DO UPDATE SET version = excluded.version,
                        deleted_at = excluded.deleted_at"
                ),
                p,
            )?;
            let removed = tx.execute(
                &format!("DELETE FROM nodes WHERE {within}"),
                params![uri.as_str(), lo, hi],
            )?;
            // Edges into the removed subtree from outside change their owners' edge sets.
            let from_in = subtree_sql("from_uri", 1);
            let to_in = subtree_sql("to_uri", 1);
            let owners: Vec<String> = tx
                .prepare(&format!(
                    "SELECT DISTINCT from_uri FROM relations WHERE {to_in} AND NOT {from_in} ORDER BY from_uri"
                ))?
                .query_map(params![uri.as_str(), lo, hi], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            tx.execute(
                &format!("DELETE FROM relations WHERE {from_in} OR {to_in}"),
                params![uri.as_str(), lo, hi],
            )?;
            let mut events = vec![EventPayload::DeleteContext(DeleteContextPayload {
                event_version: EVENT_VERSION,
                uri: uri.clone(),
                expected_deleted_version: node.version,
                recursive,
                trace_id: trace_id.clone(),
            })];
            for (owner, rv) in bump_relation_versions(tx, &owners)? {
                events.push(relation_event(owner, rv, &trace_id));
            }
            let event_ids = self.commit_events(tx, events, now)?;
            Ok(WriteOutcome {
                uri: uri.clone(),
                version: node.version,
                changed: true,
                event_ids,
                nodes_affected: removed as u64,
                trace_id,
            })
        }
    }

    fn mv_tx(
        &self,
        tx: &Transaction<'_>,
        from: &CtxUri,
        to: &CtxUri,
        trace_id: Option<String>,
        now: Millis,
    ) -> Result<WriteOutcome> {
        plan::check_move(from, to)?;
        let trace_id = trace_id_or_new(trace_id);
        {
            let root = get_node(tx, from)?
                .ok_or_else(|| StoreError::NodeNotFound { uri: from.clone() })?;
            if from == to {
                return Ok(WriteOutcome {
                    uri: to.clone(),
                    version: root.version,
                    changed: false,
                    event_ids: Vec::new(),
                    nodes_affected: 0,
                    trace_id,
                });
            }
            if get_node(tx, to)?.is_some() {
                return Err(StoreError::AlreadyExists { uri: to.clone() });
            }
            let mut events = self.create_ancestors(tx, to, now, &trace_id)?;
            let nodes = subtree_nodes(tx, from)?;
            let mut moved = Vec::with_capacity(nodes.len());
            for n in &nodes {
                let dest = n.uri.rebase(from, to)?;
                let tomb = get_tombstone(tx, &dest)?;
                moved.push(plan::moved(n, dest, tomb, now, &trace_id));
            }
            let (lo, hi) = subtree_bounds(from);
            tx.execute(
                &format!(
                    "INSERT INTO tombstones (uri, version, deleted_at)
                     SELECT uri, version, ?4 FROM nodes WHERE {} AND true
                     ON CONFLICT(uri) DO UPDATE SET version = excluded.version,
                        deleted_at = excluded.deleted_at",
                    subtree_sql("uri", 1)
                ),
                params![from.as_str(), lo, hi, now],
            )?;
            tx.execute(
                &format!("DELETE FROM nodes WHERE {}", subtree_sql("uri", 1)),
                params![from.as_str(), lo, hi],
            )?;
            for n in &moved {
                insert_node(tx, n)?;
            }
            // Owners outside the subtree whose edges point into it see their edge set change.
            let from_in = subtree_sql("from_uri", 1);
            let to_in = subtree_sql("to_uri", 1);
            let owners: Vec<String> = tx
                .prepare(&format!(
                    "SELECT DISTINCT from_uri FROM relations WHERE {to_in} AND NOT {from_in} ORDER BY from_uri"
                ))?
                .query_map(params![from.as_str(), lo, hi], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let prefix_len = from.as_str().chars().count() as i64;
            for col in ["from_uri", "to_uri"] {
                tx.execute(
                    &format!(
                        "UPDATE relations SET {col} = ?4 || substr({col}, ?5 + 1), updated_at = ?6
                         WHERE {}",
                        subtree_sql(col, 1)
                    ),
                    params![from.as_str(), lo, hi, to.as_str(), prefix_len, now],
                )?;
            }
            events.push(EventPayload::MoveContext(MoveContextPayload {
                event_version: EVENT_VERSION,
                from_uri: from.clone(),
                to_uri: to.clone(),
                recursive: true,
                old_parent_uri: from.parent().unwrap_or_else(CtxUri::root),
                new_parent_uri: to.parent().unwrap_or_else(CtxUri::root),
                trace_id: trace_id.clone(),
            }));
            for (owner, rv) in bump_relation_versions(tx, &owners)? {
                events.push(relation_event(owner, rv, &trace_id));
            }
            let version = moved.first().map_or(0, |n| n.version);
            let event_ids = self.commit_events(tx, events, now)?;
            Ok(WriteOutcome {
                uri: to.clone(),
                version,
                changed: true,
                event_ids,
                nodes_affected: moved.len() as u64,
                trace_id,
            })
        }
    }

    fn apply_op(&self, tx: &Transaction<'_>, op: WriteOp, now: Millis) -> Result<WriteOutcome> {
        match op {
            WriteOp::Put { uri, req } => self.put_tx(tx, &uri, req, now),
            WriteOp::SetRelations {
                from,
                edges,
                trace_id,
            } => self.set_relations_tx(tx, &from, edges, trace_id, now),
            WriteOp::Rm {
                uri,
                recursive,
                expect_version,
                trace_id,
            } => self.rm_tx(tx, &uri, recursive, expect_version, trace_id, now),
            WriteOp::Mv { from, to, trace_id } => self.mv_tx(tx, &from, &to, trace_id, now),
            WriteOp::Hold { id, at, lease } => {
                super::holds::insert_hold_tx(tx, &id, &at, &lease, now)?;
                Ok(WriteOutcome {
                    uri: at,
                    version: 0,
                    changed: true,
                    event_ids: Vec::new(),
                    nodes_affected: 0,
                    trace_id: id,
                })
            }
        }
    }
}

/// The fencing check (docs/store.md "Fencing"): refuses a write under `fence` when a newer
/// token was recorded for its path, an ancestor or a descendant; records the token.
fn check_fence(tx: &Transaction<'_>, fence: &WriteFence, now: Millis) -> Result<()> {
    let (lo, hi) = subtree_bounds(&fence.path);
    let mut related: Vec<String> = fence
        .path
        .ancestors()
        .iter()
        .map(|a| a.as_str().to_owned())
        .collect();
    related.push(fence.path.as_str().to_owned());
    let ancestors = serde_json::to_string(&related)?;
    let newer: Option<(String, i64)> = tx
        .prepare_cached(&format!(
            "SELECT path, token FROM fences
             WHERE token > ?4 AND ({} OR path IN (SELECT value FROM json_each(?5)))
             ORDER BY token DESC LIMIT 1",
            subtree_sql("path", 1)
        ))?
        .query_row(
            params![fence.path.as_str(), lo, hi, fence.token as i64, ancestors],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((newest_path, newest)) = newer {
        return Err(StoreError::LeaseLost {
            path: fence.path.clone(),
            token: fence.token,
            newest_path,
            newest: newest as u64,
        });
    }
    tx.prepare_cached(
        "INSERT INTO fences (path, token, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT(path) DO UPDATE SET token = max(token, excluded.token),
            updated_at = excluded.updated_at",
    )?
    .execute(params![fence.path.as_str(), fence.token as i64, now])?;
    Ok(())
}

impl ContextFs for SqliteStore {
    fn put(&self, uri: &CtxUri, req: PutRequest) -> Result<WriteOutcome> {
        self.write(Durability::Full, |tx, now| self.put_tx(tx, uri, req, now))
    }

    fn apply_fenced(&self, fences: &[WriteFence], ops: Vec<WriteOp>) -> Result<Vec<WriteOutcome>> {
        self.write(Durability::Full, |tx, now| {
            for f in fences {
                check_fence(tx, f, now)?;
            }
            ops.into_iter()
                .map(|op| self.apply_op(tx, op, now))
                .collect()
        })
    }

    fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        let r = self.write(Durability::Full, |tx, now| {
            self.rm_tx(tx, uri, recursive, expect_version, trace_id.clone(), now)
        });
        if matches!(r, Err(StoreError::NodeNotFound { .. })) && expect_version.is_none() {
            self.purge_missing(uri, trace_id)?;
        }
        r
    }

    fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome> {
        self.write(Durability::Full, |tx, now| {
            self.mv_tx(tx, from, to, trace_id, now)
        })
    }

    fn purge_missing(&self, uri: &CtxUri, trace_id: Option<String>) -> Result<Option<String>> {
        if uri.is_root() {
            return Err(StoreError::RootNotWritable);
        }
        let trace_id = trace_id_or_new(trace_id);
        self.write(Durability::Full, |tx, now| {
            if get_node(tx, uri)?.is_some() {
                return Ok(None);
            }
            let event = EventPayload::DeleteContext(DeleteContextPayload {
                event_version: EVENT_VERSION,
                uri: uri.clone(),
                expected_deleted_version: get_tombstone(tx, uri)?.unwrap_or(0),
                recursive: true,
                trace_id,
            });
            Ok(self.commit_events(tx, vec![event], now)?.into_iter().next())
        })
    }

    fn read_node(&self, uri: &CtxUri) -> Result<Option<ContextNode>> {
        self.read(|c| get_node(c, uri))
    }

    fn read_nodes(&self, uris: &[CtxUri]) -> Result<Vec<ContextNode>> {
        self.read(|c| {
            let mut out = Vec::with_capacity(uris.len());
            for u in uris {
                if let Some(n) = get_node(c, u)? {
                    out.push(n);
                }
            }
            Ok(out)
        })
    }

    fn versions(&self, uris: &[CtxUri]) -> Result<Vec<UriVersion>> {
        self.read(|c| {
            let mut live = c.prepare_cached("SELECT version FROM nodes WHERE uri = ?1")?;
            let mut out = Vec::with_capacity(uris.len());
            for u in uris {
                let v: Option<i64> = live.query_row([u.as_str()], |r| r.get(0)).optional()?;
                out.push(match (v, get_tombstone(c, u)?) {
                    (Some(v), _) => UriVersion::Live(v as u64),
                    (None, Some(t)) => UriVersion::Deleted(t),
                    (None, None) => UriVersion::Unknown,
                });
            }
            Ok(out)
        })
    }

    fn stat(&self, uri: &CtxUri) -> Result<NodeStat> {
        self.read(|c| {
            let n =
                get_node(c, uri)?.ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() })?;
            stat_of(c, n)
        })
    }

    fn ls(&self, uri: &CtxUri) -> Result<Vec<NodeStat>> {
        self.read(|c| {
            if !uri.is_root() && get_node(c, uri)?.is_none() {
                return Err(StoreError::NodeNotFound { uri: uri.clone() });
            }
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {NODE_COLUMNS} FROM nodes WHERE parent_uri = ?1 ORDER BY uri"
            ))?;
            let nodes = stmt
                .query_map([uri.as_str()], node_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            nodes.into_iter().map(|n| stat_of(c, n?)).collect()
        })
    }

    fn tree(&self, uri: &CtxUri, depth: Option<u32>) -> Result<Vec<NodeStat>> {
        self.read(|c| {
            let nodes = subtree_nodes(c, uri)?;
            if nodes.is_empty() && !uri.is_root() {
                return Err(StoreError::NodeNotFound { uri: uri.clone() });
            }
            let base = uri.depth();
            nodes
                .into_iter()
                .filter(|n| depth.is_none_or(|d| n.uri.depth() - base <= d as usize))
                .map(|n| stat_of(c, n))
                .collect()
        })
    }

    fn read_subtree(&self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        self.read(|c| subtree_nodes(c, uri))
    }
}
