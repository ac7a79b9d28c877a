//! In-batch compaction (spec §9.2): a claimed batch of events becomes a short list of
//! operations, and every event remembers which operations it needs.
//!
//! Workers apply the *current* source state (spec §7.2), so an event only says *where* to
//! look: `UPSERT_CONTEXT(u)` and a non-recursive `DELETE_CONTEXT(u)` mean "sync node u",
//! a recursive delete means "sync the subtree of u", a move means "sync both subtrees, the
//! target reusing the vectors stored at the source URIs". Deduplicating those operations is
//! the spec's compaction:
//! UPSERT+UPSERT → one sync (the last state), UPSERT+DELETE → one sync that finds the node
//! gone and removes it, MOVE+UPSERT(old) → the old URI's sync removes leftovers and the new
//! subtree's sync writes the node at its new URI. Folded events are acknowledged with the
//! operation that covers them.

use std::collections::HashMap;

use ce_core::{CtxUri, EventPayload};
use ce_store::ClaimedEvent;

/// One unit of index work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// A move: the syncs of both subtrees (separate ops) do the work; this op lets the
    /// target's sync reuse the vectors stored at the source URIs.
    Move {
        /// Old root.
        from: CtxUri,
        /// New root.
        to: CtxUri,
    },
    /// Make the records of everything within `uri` equal the source's projection.
    SyncSubtree(CtxUri),
    /// Make the records of node `uri` equal the source's projection.
    SyncNode(CtxUri),
}

impl Op {
    /// Execution order within a batch: moves first (they preserve vectors), then syncs.
    fn rank(&self) -> u8 {
        match self {
            Op::Move { .. } => 0,
            Op::SyncSubtree(_) => 1,
            Op::SyncNode(_) => 2,
        }
    }
}

/// A compacted batch.
#[derive(Debug, Default)]
pub struct Plan {
    /// Distinct operations, in execution order.
    pub ops: Vec<Op>,
    /// For each claimed event (by position in the batch), the indexes into `ops` it needs.
    pub needs: Vec<Vec<usize>>,
}

impl Plan {
    /// How many events share an operation with an earlier event (for logs and metrics).
    pub fn folded(&self) -> usize {
        let mut seen = vec![false; self.ops.len()];
        let mut folded = 0;
        for needs in &self.needs {
            if !needs.is_empty() && needs.iter().all(|&i| seen[i]) {
                folded += 1;
            }
            for &i in needs {
                seen[i] = true;
            }
        }
        folded
    }
}

/// Compacts `events` for a consumer. `relations` says whether `UPSERT_RELATION` events need
/// work from this consumer; when they do not, they need no operation and are simply acked.
pub fn compact(events: &[ClaimedEvent], relations: bool) -> Plan {
    plan(
        events
            .iter()
            .map(|e| match &e.event.payload {
                EventPayload::UpsertContext(p) => vec![Op::SyncNode(p.uri.clone())],
                EventPayload::DeleteContext(p) if p.recursive => {
                    vec![Op::SyncSubtree(p.uri.clone())]
                }
                EventPayload::DeleteContext(p) => vec![Op::SyncNode(p.uri.clone())],
                EventPayload::MoveContext(p) if p.from_uri == p.to_uri => Vec::new(),
                EventPayload::MoveContext(p) => vec![
                    Op::Move {
                        from: p.from_uri.clone(),
                        to: p.to_uri.clone(),
                    },
                    Op::SyncSubtree(p.from_uri.clone()),
                    Op::SyncSubtree(p.to_uri.clone()),
                ],
                EventPayload::UpsertRelation(p) if relations => vec![Op::SyncNode(p.uri.clone())],
                EventPayload::UpsertRelation(_) => Vec::new(),
            })
            .collect(),
    )
}

/// Compacts `events` for the relation consumer, whose operations sync *owners* (the nodes
/// whose outgoing edges the index holds): `UPSERT_RELATION(u)` and a non-recursive
/// `DELETE_CONTEXT(u)` mean "sync owner u", a recursive delete "sync the owners within u", a
/// move "sync the owners within both subtrees". `UPSERT_CONTEXT` needs nothing: a node's
/// content never changes its edges (a new node has none; every edge change bumps the owner's
/// relation version and appends `UPSERT_RELATION`).
pub fn compact_relations(events: &[ClaimedEvent]) -> Plan {
    plan(
        events
            .iter()
            .map(|e| match &e.event.payload {
                EventPayload::UpsertContext(_) => Vec::new(),
                EventPayload::DeleteContext(p) if p.recursive => {
                    vec![Op::SyncSubtree(p.uri.clone())]
                }
                EventPayload::DeleteContext(p) => vec![Op::SyncNode(p.uri.clone())],
                EventPayload::MoveContext(p) if p.from_uri == p.to_uri => Vec::new(),
                EventPayload::MoveContext(p) => vec![
                    Op::SyncSubtree(p.from_uri.clone()),
                    Op::SyncSubtree(p.to_uri.clone()),
                ],
                EventPayload::UpsertRelation(p) => vec![Op::SyncNode(p.uri.clone())],
            })
            .collect(),
    )
}

/// Deduplicates the operations each event needs into a plan.
/// The plan of a batch whose events need `raw` (by position): distinct operations in
/// execution order.
pub fn plan(raw: Vec<Vec<Op>>) -> Plan {
    let mut distinct: Vec<Op> = Vec::new();
    for op in raw.iter().flatten() {
        if !distinct.contains(op) {
            distinct.push(op.clone());
        }
    }
    // Stable sort keeps the claim order within each rank.
    distinct.sort_by_key(Op::rank);
    let index: HashMap<&Op, usize> = distinct.iter().enumerate().map(|(i, o)| (o, i)).collect();
    let needs = raw
        .iter()
        .map(|ops| ops.iter().map(|o| index[o]).collect())
        .collect();
    Plan {
        ops: distinct,
        needs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ce_core::{
        DeleteContextPayload, EVENT_VERSION, EventType, MoveContextPayload, OutboxEvent,
        UpsertContextPayload, UpsertReason,
    };
    use ce_store::Claim;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn ev(seq: i64, payload: EventPayload) -> ClaimedEvent {
        ClaimedEvent {
            event: OutboxEvent {
                seq,
                event_id: format!("evt-{seq}"),
                event_type: payload.event_type(),
                uri: payload.uri().clone(),
                payload,
                created_at_ms: 0,
            },
            claim: Claim {
                consumer: "vector".into(),
                seq,
                event_id: format!("evt-{seq}"),
                worker_id: "w".into(),
                token: "t".into(),
                claimed_until_ms: 0,
            },
            retry_count: 0,
        }
    }

    fn upsert(seq: i64, u: &str) -> ClaimedEvent {
        ev(
            seq,
            EventPayload::UpsertContext(UpsertContextPayload {
                event_version: EVENT_VERSION,
                uri: uri(u),
                expected_node_version: seq as u64,
                reason: UpsertReason::Replace,
                trace_id: String::new(),
            }),
        )
    }

    fn delete(seq: i64, u: &str, recursive: bool) -> ClaimedEvent {
        ev(
            seq,
            EventPayload::DeleteContext(DeleteContextPayload {
                event_version: EVENT_VERSION,
                uri: uri(u),
                expected_deleted_version: 1,
                recursive,
                trace_id: String::new(),
            }),
        )
    }

    fn mv(seq: i64, from: &str, to: &str) -> ClaimedEvent {
        let (f, t) = (uri(from), uri(to));
        ev(
            seq,
            EventPayload::MoveContext(MoveContextPayload {
                event_version: EVENT_VERSION,
                old_parent_uri: f.parent().expect("parent"),
                new_parent_uri: t.parent().expect("parent"),
                from_uri: f,
                to_uri: t,
                recursive: true,
                trace_id: String::new(),
            }),
        )
    }

    #[test]
    fn upsert_upsert_folds_into_one_sync() {
        let p = compact(&[upsert(1, "ctx://a/x"), upsert(2, "ctx://a/x")], false);
        assert_eq!(p.ops, [Op::SyncNode(uri("ctx://a/x"))]);
        assert_eq!(p.needs, [vec![0], vec![0]]);
        assert_eq!(p.folded(), 1);
    }

    #[test]
    fn upsert_then_delete_is_one_sync_that_sees_the_delete() {
        let p = compact(
            &[upsert(1, "ctx://a/x"), delete(2, "ctx://a/x", false)],
            false,
        );
        assert_eq!(p.ops, [Op::SyncNode(uri("ctx://a/x"))]);
        assert_eq!(p.folded(), 1);
    }

    #[test]
    fn move_then_upsert_of_the_old_uri() {
        let p = compact(
            &[mv(1, "ctx://a/x", "ctx://a/y"), upsert(2, "ctx://a/x")],
            false,
        );
        assert_eq!(
            p.ops,
            [
                Op::Move {
                    from: uri("ctx://a/x"),
                    to: uri("ctx://a/y")
                },
                Op::SyncSubtree(uri("ctx://a/x")),
                Op::SyncSubtree(uri("ctx://a/y")),
                Op::SyncNode(uri("ctx://a/x")),
            ]
        );
        assert_eq!(p.needs[0], [0, 1, 2]);
        assert_eq!(p.needs[1], [3]);
    }

    #[test]
    fn noops_need_nothing() {
        let p = compact(&[mv(1, "ctx://a/x", "ctx://a/x")], false);
        assert!(p.ops.is_empty());
        assert_eq!(p.needs, [Vec::<usize>::new()]);
        let p = compact(
            &[delete(1, "ctx://a/x", true), upsert(2, "ctx://a/x/y")],
            false,
        );
        assert_eq!(
            p.ops,
            [
                Op::SyncSubtree(uri("ctx://a/x")),
                Op::SyncNode(uri("ctx://a/x/y"))
            ]
        );
        let _ = EventType::UpsertContext;
    }

    fn link(seq: i64, u: &str) -> ClaimedEvent {
        ev(
            seq,
            EventPayload::UpsertRelation(ce_core::UpsertRelationPayload {
                event_version: EVENT_VERSION,
                uri: uri(u),
                relation_version: seq as u64,
                mode: ce_core::RelationMode::Replace,
                trace_id: String::new(),
            }),
        )
    }

    #[test]
    fn relation_plans_sync_owners_and_ignore_content_upserts() {
        let p = compact_relations(&[
            upsert(1, "ctx://a/x"),
            link(2, "ctx://a/x"),
            link(3, "ctx://a/x"),
            mv(4, "ctx://a/x", "ctx://a/y"),
            delete(5, "ctx://a/z", false),
            delete(6, "ctx://a/w", true),
            mv(7, "ctx://a/q", "ctx://a/q"),
        ]);
        assert_eq!(
            p.ops,
            [
                Op::SyncSubtree(uri("ctx://a/x")),
                Op::SyncSubtree(uri("ctx://a/y")),
                Op::SyncSubtree(uri("ctx://a/w")),
                Op::SyncNode(uri("ctx://a/x")),
                Op::SyncNode(uri("ctx://a/z")),
            ]
        );
        assert_eq!(
            p.needs,
            [
                vec![],
                vec![3],
                vec![3],
                vec![0, 1],
                vec![4],
                vec![2],
                vec![]
            ]
        );
        assert_eq!(p.folded(), 1);
    }
}
