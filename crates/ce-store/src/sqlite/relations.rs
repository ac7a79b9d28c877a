//! RelationStore on SQLite: edges owned by their `from` node, versioned by the node's
//! `relation_version`, each change announced by `UPSERT_RELATION` in the same transaction.

use ce_core::{
    CoreError, CtxUri, EVENT_VERSION, EventPayload, RelationEdge, RelationMode,
    UpsertRelationPayload, node::validate_relation_type,
};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{Durability, SqliteStore, get_node};
use crate::error::{Result, StoreError};
use crate::model::{LinkRequest, RelationStore, Relations, WriteOutcome};
use crate::plan::trace_id_or_new;

/// The `UPSERT_RELATION` event for `owner` at relation version `rv`.
pub(super) fn relation_event(owner: CtxUri, rv: u64, trace_id: &str) -> EventPayload {
    EventPayload::UpsertRelation(UpsertRelationPayload {
        event_version: EVENT_VERSION,
        uri: owner,
        relation_version: rv,
        mode: RelationMode::Replace,
        trace_id: trace_id.to_owned(),
    })
}

/// Increments the relation version of each owner; returns (owner, new version). The node's
/// `updated_at` and `version` describe its content and stay as they are.
pub(super) fn bump_relation_versions(
    tx: &Transaction<'_>,
    owners: &[String],
) -> Result<Vec<(CtxUri, u64)>> {
    let mut stmt = tx.prepare_cached(
        "UPDATE nodes SET relation_version = relation_version + 1
         WHERE uri = ?1 RETURNING relation_version",
    )?;
    let mut out = Vec::with_capacity(owners.len());
    for o in owners {
        let rv: Option<i64> = stmt.query_row(params![o], |r| r.get(0)).optional()?;
        if let Some(rv) = rv {
            let uri = CtxUri::parse(o)
                .map_err(|e| StoreError::Corrupt(format!("relation owner {o:?}: {e}")))?;
            out.push((uri, rv as u64));
        }
    }
    Ok(out)
}

fn edges(conn: &Connection, col: &str, uri: &CtxUri) -> Result<Vec<RelationEdge>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT from_uri, to_uri, relation_type, weight, reason FROM relations
         WHERE {col} = ?1 ORDER BY from_uri, to_uri, relation_type"
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
    let mut out = Vec::new();
    for row in rows {
        let (f, t, relation_type, weight, reason) = row?;
        let parse = |s: &str| {
            CtxUri::parse(s).map_err(|e| StoreError::Corrupt(format!("relation uri {s:?}: {e}")))
        };
        out.push(RelationEdge {
            from_uri: parse(&f)?,
            to_uri: parse(&t)?,
            relation_type,
            weight,
            reason,
        });
    }
    Ok(out)
}

fn validate_link(req: &LinkRequest) -> Result<()> {
    validate_relation_type(&req.relation_type)?;
    if !req.weight.is_finite() {
        return Err(CoreError::InvalidField {
            field: "weight",
            reason: format!("{} is not a finite number", req.weight),
        }
        .into());
    }
    if req.reason.len() > 4096 || req.reason.chars().any(|c| c.is_control() && c != '\n') {
        return Err(CoreError::InvalidField {
            field: "reason",
            reason: "must be at most 4096 bytes without control characters".into(),
        }
        .into());
    }
    Ok(())
}

fn upsert_edge(tx: &Transaction<'_>, from: &CtxUri, e: &LinkRequest, now: i64) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO relations (from_uri, to_uri, relation_type, weight, reason, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
         ON CONFLICT(from_uri, to_uri, relation_type)
         DO UPDATE SET weight = excluded.weight, reason = excluded.reason, updated_at = ?6",
    )?
    .execute(params![from.as_str(), e.to.as_str(), e.relation_type, e.weight, e.reason, now])?;
    Ok(())
}

fn require_node(tx: &Transaction<'_>, uri: &CtxUri) -> Result<()> {
    match get_node(tx, uri)? {
        Some(_) => Ok(()),
        None => Err(StoreError::NodeNotFound { uri: uri.clone() }),
    }
}

impl SqliteStore {
    /// Runs an edge change of `from` inside `tx`; when `f` reports a change, bumps the
    /// owner's relation version and appends its `UPSERT_RELATION`.
    fn relation_write_tx(
        &self,
        tx: &Transaction<'_>,
        from: &CtxUri,
        trace_id: String,
        now: i64,
        f: impl FnOnce(&Transaction<'_>) -> Result<bool>,
    ) -> Result<WriteOutcome> {
        let node =
            get_node(tx, from)?.ok_or_else(|| StoreError::NodeNotFound { uri: from.clone() })?;
        if !f(tx)? {
            return Ok(WriteOutcome {
                uri: from.clone(),
                version: node.relation_version,
                changed: false,
                event_ids: Vec::new(),
                nodes_affected: 0,
                trace_id,
            });
        }
        let bumped = bump_relation_versions(tx, &[from.to_string()])?;
        let rv = bumped.first().map_or(node.relation_version + 1, |b| b.1);
        let events = vec![relation_event(from.clone(), rv, &trace_id)];
        let event_ids = self.commit_events(tx, events, now)?;
        Ok(WriteOutcome {
            uri: from.clone(),
            version: rv,
            changed: true,
            event_ids,
            nodes_affected: 1,
            trace_id,
        })
    }

    /// Replaces the outgoing edges of `from` inside `tx`.
    pub(super) fn set_relations_tx(
        &self,
        tx: &Transaction<'_>,
        from: &CtxUri,
        desired: Vec<LinkRequest>,
        trace_id: Option<String>,
        now: i64,
    ) -> Result<WriteOutcome> {
        for e in &desired {
            validate_link(e)?;
        }
        self.relation_write_tx(tx, from, trace_id_or_new(trace_id), now, |tx| {
            let mut want = std::collections::BTreeMap::new();
            for e in desired {
                require_node(tx, &e.to)?;
                want.insert((e.to.to_string(), e.relation_type.clone()), e);
            }
            let have = edges(tx, "from_uri", from)?;
            let mut changed = false;
            for h in &have {
                let key = (h.to_uri.to_string(), h.relation_type.clone());
                match want.get(&key) {
                    Some(w) if w.weight == h.weight && w.reason == h.reason => {
                        want.remove(&key);
                    }
                    Some(_) => {}
                    None => {
                        tx.prepare_cached(
                            "DELETE FROM relations WHERE from_uri = ?1 AND to_uri = ?2 AND relation_type = ?3",
                        )?
                        .execute(params![from.as_str(), h.to_uri.as_str(), h.relation_type])?;
                        changed = true;
                    }
                }
            }
            for e in want.values() {
                upsert_edge(tx, from, e, now)?;
                changed = true;
            }
            Ok(changed)
        })
    }
}

impl RelationStore for SqliteStore {
    fn link(&self, req: LinkRequest) -> Result<WriteOutcome> {
        validate_link(&req)?;
        let trace_id = trace_id_or_new(req.trace_id.clone());
        self.write(Durability::Full, |tx, now| {
            self.relation_write_tx(tx, &req.from, trace_id, now, |tx| {
                require_node(tx, &req.to)?;
                let existing: Option<(f64, String)> = tx
                    .prepare_cached(
                        "SELECT weight, reason FROM relations
                         WHERE from_uri = ?1 AND to_uri = ?2 AND relation_type = ?3",
                    )?
                    .query_row(
                        params![req.from.as_str(), req.to.as_str(), req.relation_type],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                if existing.is_some_and(|(w, r)| w == req.weight && r == req.reason) {
                    return Ok(false);
                }
                upsert_edge(tx, &req.from, &req, now)?;
                Ok(true)
            })
        })
    }

    fn unlink(
        &self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        validate_relation_type(relation_type)?;
        self.write(Durability::Full, |tx, now| {
            self.relation_write_tx(tx, from, trace_id_or_new(trace_id), now, |tx| {
                let n = tx
                    .prepare_cached(
                        "DELETE FROM relations WHERE from_uri = ?1 AND to_uri = ?2 AND relation_type = ?3",
                    )?
                    .execute(params![from.as_str(), to.as_str(), relation_type])?;
                if n == 0 {
                    return Err(StoreError::RelationNotFound {
                        from: from.clone(),
                        to: to.clone(),
                        relation_type: relation_type.to_owned(),
                    });
                }
                Ok(true)
            })
        })
    }

    fn relations(&self, uri: &CtxUri) -> Result<Relations> {
        self.read(|c| {
            if get_node(c, uri)?.is_none() {
                return Err(StoreError::NodeNotFound { uri: uri.clone() });
            }
            Ok(Relations {
                outgoing: edges(c, "from_uri", uri)?,
                incoming: edges(c, "to_uri", uri)?,
            })
        })
    }

    fn get_edges(&self, uri: &CtxUri) -> Result<Vec<RelationEdge>> {
        self.read(|c| edges(c, "from_uri", uri))
    }
}
