//! The relation consumer's apply step: every operation of a compacted batch
//! ([`super::compact::compact_relations`]) names owners to sync, and syncing an owner makes
//! the index hold exactly the source's current edge set of that URI.
//!
//! 1. Expand the operations into owners. `SyncNode(u)` is owner `u`, plus — when the source no
//!    longer holds `u` — the owners of the edges the index still has pointing at `u`.
//!    `SyncSubtree(u)` (a recursive delete, either side of a move) is every owner within `u`
//!    that the source or the index knows, plus the owners of the edges the index has pointing
//!    into `u`. (The source already bumps, and announces with `UPSERT_RELATION`, every owner
//!    outside a removed or moved subtree whose edges pointed into it; resyncing them here
//!    too makes a move or delete converge on its own.)
//! 2. Read each owner's current state: node, edges, node again. An owner whose
//!    `(version, relation_version)` did not change between the two node reads had exactly
//!    those edges at that version (every edge change bumps one of them); one that changed is
//!    read again (a few rounds, then the operation fails retryably).
//! 3. Write, in batches, one versioned write per owner: a live owner replaces its edge set at
//!    [`RelationVersion`] `(version, relation_version)`; a removed (or moved-away) owner is
//!    removed at its tombstone's version; a URI the source never stored is purged. The index
//!    drops writes older than what it holds (invariant RX1), so concurrent workers converge.
//! 4. Check the source again for every owner whose edges were just written: one that was
//!    removed or moved away meanwhile is synced again (its removal supersedes the write).
//!    Without this, a move back that another worker applied between this worker's read and
//!    its write could not see the edges this worker was about to write under the moved-away
//!    URI, and they would stay as orphans. One still live at a newer node version is
//!    *superseded*, not synced again: a content write does not change edges, and every change
//!    that does (an edge change bumps the relation version, a removal and re-creation) appended
//!    an event for this consumer in its own transaction (OB1), which reads the newer state.
//!    An owner purged that the source now holds live is synced again too: a purge ignores
//!    versions, so it may have removed the edges another worker wrote for the owner created
//!    after this worker's read (`super::live_now`).
//!
//! Failures are per owner: an owner whose read or write failed fails the operations that
//! include it, and only the events needing those operations are retried. A batched write
//! refused for good is split until the refused owners are isolated ([`super::bisect`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ce_core::{ContextNode, CtxUri, IndexProjector, RelationEdge};
use ce_store::{SourceStore, UriVersion};
use tracing::{debug, info_span, warn};

use super::bisect;
use super::compact::Op;
use super::error::WorkError;
use super::fanout::{Applied, OpFanout, SourceSubtrees};
use super::target::IndexKind;
use crate::relation::{Direction, RelationIndex, RelationOutcome, RelationVersion, RelationWrite};

/// Owners per index write transaction.
const WRITE_BATCH: usize = 256;

/// Times an owner is read before a batch gives up on it (it kept changing).
const READ_ROUNDS: u32 = 3;

/// What a batch did to the relation index, by owner.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelationCounts {
    /// Owners whose edge set was replaced with a different one.
    pub upserted: u64,
    /// Owners whose records were removed (removed or moved away in the source, or orphans).
    pub removed: u64,
    /// Owners whose records already were exactly the source's.
    pub unchanged: u64,
    /// Writes skipped because the index already held a newer state of the owner.
    pub stale: u64,
    /// Owners found live at a newer node version after their edges were written (see the
    /// module documentation): done, the newer version's events carry any further change.
    pub superseded: u64,
}

impl RelationCounts {
    /// `(metric action, count)` pairs of `index_worker_changes_total`.
    pub fn actions(&self) -> [(&'static str, u64); 5] {
        [
            ("upsert", self.upserted),
            ("delete", self.removed),
            ("unchanged", self.unchanged),
            ("stale", self.stale),
            ("superseded", self.superseded),
        ]
    }
}

/// Applies a compacted batch of node operations to the relation index (the owners' edges).
pub(super) struct RelationApplier<'a> {
    /// The consumer served (metric label).
    pub consumer: &'a str,
    pub source: &'a dyn SourceStore,
    pub index: &'a dyn RelationIndex,
    pub projector: &'a IndexProjector,
}

/// An owner read consistently: its node and its edges at the node's version.
struct ReadOwner {
    node: ContextNode,
    edges: Vec<RelationEdge>,
}

impl RelationApplier<'_> {
    pub fn apply(&self, ops: &[Op]) -> Applied<RelationCounts> {
        let mut counts = RelationCounts::default();

        // 1. Expand every operation into owners, remembering which operations need each.
        let gone = self.gone_nodes(ops);
        let subtrees = SourceSubtrees::read(self.source, ops);
        let mut fanout = OpFanout::expand(ops, |op| match op {
            Op::Move { .. } => None,
            Op::SyncNode(u) => Some(match &gone {
                Ok(gone) if gone.contains(u) => self.inbound_owners(u).map(|mut o| {
                    o.insert(u.clone());
                    o
                }),
                Ok(_) => Ok(BTreeSet::from([u.clone()])),
                Err(e) => Err(e.clone()),
            }),
            Op::SyncSubtree(u) => Some(self.owners_within(u, &subtrees)),
        });

        // 2-3. Read and write every owner once.
        let mut failed: HashMap<CtxUri, WorkError> = HashMap::new();
        if let Err(e) = self.sync_owners(&fanout.uris(), &mut failed, &mut counts) {
            // A batched read failed: every operation with owners fails with it.
            fanout.fail_all(&e);
        }
        fanout.fail_uris(failed);
        fanout.finish(counts)
    }

    /// The `SyncNode` URIs the source no longer holds (one batched read).
    fn gone_nodes(&self, ops: &[Op]) -> Result<BTreeSet<CtxUri>, WorkError> {
        let uris: Vec<CtxUri> = ops
            .iter()
            .filter_map(|op| match op {
                Op::SyncNode(u) => Some(u.clone()),
                _ => None,
            })
            .collect();
        if uris.is_empty() {
            return Ok(BTreeSet::new());
        }
        let versions = self.source.versions(&uris)?;
        Ok(uris
            .into_iter()
            .zip(versions)
            .filter(|(_, v)| !matches!(v, UriVersion::Live(_)))
            .map(|(u, _)| u)
            .collect())
    }

    /// The owners of the edges the index holds into `u`.
    fn inbound_owners(&self, u: &CtxUri) -> Result<BTreeSet<CtxUri>, WorkError> {
        Ok(self
            .index
            .related(u, None, Direction::In, usize::MAX)?
            .into_iter()
            .map(|r| r.record.from_uri)
            .collect())
    }

    /// Every owner within `u` that the source (as read in `subtrees`) or the index knows, `u`
    /// itself, and the owners of the edges the index holds into the subtree.
    fn owners_within(
        &self,
        u: &CtxUri,
        subtrees: &SourceSubtrees,
    ) -> Result<BTreeSet<CtxUri>, WorkError> {
        let mut set: BTreeSet<CtxUri> = subtrees.within(u)?.iter().cloned().collect();
        set.extend(
            self.index
                .list_under(u)?
                .into_iter()
                .map(|r| r.record.from_uri),
        );
        set.extend(
            self.index
                .list_targeting(u)?
                .into_iter()
                .map(|r| r.record.from_uri),
        );
        if !u.is_root() {
            set.insert(u.clone());
        }
        Ok(set)
    }

    /// Reads every owner (see the module documentation) and writes it; per-owner failures go
    /// to `failed`, a failure of a batched read is returned.
    fn sync_owners(
        &self,
        owners: &[CtxUri],
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut RelationCounts,
    ) -> Result<(), WorkError> {
        let mut pending = owners.to_vec();
        for _ in 0..READ_ROUNDS {
            let mut purged = Vec::new();
            let written = self.sync_once(&pending, failed, counts, &mut purged)?;
            pending = self.gone_since(&written, counts)?;
            pending.extend(super::live_now(self.source, purged)?);
            if pending.is_empty() {
                return Ok(());
            }
            debug!(
                owners = pending.len(),
                "owners removed after their edges were written, or created after their purge: \
                 syncing again"
            );
        }
        for u in pending {
            failed.insert(
                u,
                WorkError::internal(
                    "owner kept being removed and re-created while its edges were written",
                ),
            );
        }
        Ok(())
    }

    /// The owners of `written` (owner, node version of the replace) that the source no longer
    /// holds live; those live at a newer version are counted as superseded.
    fn gone_since(
        &self,
        written: &[(CtxUri, u64)],
        counts: &mut RelationCounts,
    ) -> Result<Vec<CtxUri>, WorkError> {
        if written.is_empty() {
            return Ok(Vec::new());
        }
        let uris: Vec<CtxUri> = written.iter().map(|(u, _)| u.clone()).collect();
        let versions = self.source.versions(&uris)?;
        let mut gone = Vec::new();
        for ((u, v), now) in written.iter().zip(versions) {
            match now {
                UriVersion::Live(n) if n == *v => {}
                UriVersion::Live(_) => counts.superseded += 1,
                UriVersion::Deleted(_) | UriVersion::Unknown => gone.push(u.clone()),
            }
        }
        Ok(gone)
    }

    /// One read-and-write pass over `owners`; returns the owners whose edge set it replaced
    /// (or found already in place), with the node version it wrote at; the owners it purged
    /// go to `purged`.
    fn sync_once(
        &self,
        owners: &[CtxUri],
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut RelationCounts,
        purged: &mut Vec<CtxUri>,
    ) -> Result<Vec<(CtxUri, u64)>, WorkError> {
        let mut writes: Vec<RelationWrite> = Vec::new();
        let mut todo: Vec<CtxUri> = owners.to_vec();
        for _ in 0..READ_ROUNDS {
            if todo.is_empty() {
                break;
            }
            todo = self.read_owners(&todo, &mut writes, failed)?;
        }
        for u in todo {
            failed.insert(
                u,
                WorkError::internal("owner kept changing while its edges were read"),
            );
        }
        let mut written = Vec::new();
        for chunk in writes.chunks(WRITE_BATCH) {
            written.extend(self.write_chunk(chunk.to_vec(), failed, counts, purged));
        }
        Ok(written)
    }

    /// Reads `uris` once: the write of each owner read consistently goes to `writes`; the
    /// owners that changed while they were read are returned (to read again).
    fn read_owners(
        &self,
        uris: &[CtxUri],
        writes: &mut Vec<RelationWrite>,
        failed: &mut HashMap<CtxUri, WorkError>,
    ) -> Result<Vec<CtxUri>, WorkError> {
        let _s = info_span!("index.read_relations", owners = uris.len()).entered();
        let mut read: BTreeMap<CtxUri, ReadOwner> = BTreeMap::new();
        for node in self.source.read_nodes(uris)? {
            match self.source.get_edges(&node.uri) {
                Ok(edges) => {
                    read.insert(node.uri.clone(), ReadOwner { node, edges });
                }
                Err(e) => {
                    warn!(uri = %node.uri, error = %e, "reading relations failed");
                    failed.insert(node.uri, e.into());
                }
            }
        }
        let missing: Vec<CtxUri> = uris
            .iter()
            .filter(|u| !read.contains_key(*u) && !failed.contains_key(*u))
            .cloned()
            .collect();
        let versions = self.source.versions(&missing)?;
        let live: Vec<CtxUri> = read.keys().cloned().collect();
        let again: HashMap<CtxUri, (u64, u64)> = self
            .source
            .read_nodes(&live)?
            .into_iter()
            .map(|n| (n.uri, (n.version, n.relation_version)))
            .collect();

        let mut changed = Vec::new();
        for (uri, r) in read {
            let version = RelationVersion {
                node_version: r.node.version,
                relation_version: r.node.relation_version,
            };
            if again.get(&uri) != Some(&(version.node_version, version.relation_version)) {
                debug!(uri = %uri, "owner changed while its edges were read: reading again");
                changed.push(uri);
                continue;
            }
            writes.push(RelationWrite::Replace {
                records: self.projector.build_relation_records(&r.node, &r.edges),
                owner: uri,
                version,
            });
        }
        for (uri, v) in missing.into_iter().zip(versions) {
            match v {
                UriVersion::Deleted(node_version) => writes.push(RelationWrite::Remove {
                    owner: uri,
                    node_version,
                }),
                // Never stored in the source: whatever the index holds for it is an orphan.
                UriVersion::Unknown => writes.push(RelationWrite::Purge { owner: uri }),
                // Created between the two reads.
                UriVersion::Live(_) => changed.push(uri),
            }
        }
        Ok(changed)
    }

    /// Applies one batched index write (split when refused for good), counting outcomes;
    /// failures go to `failed`, the purges applied to `purged`. Returns the replaces that are
    /// in place (applied or already there), with their node versions.
    fn write_chunk(
        &self,
        writes: Vec<RelationWrite>,
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut RelationCounts,
        purged: &mut Vec<CtxUri>,
    ) -> Vec<(CtxUri, u64)> {
        let _s = IndexKind::Relation.write_span(writes.len());
        let keys: Vec<(CtxUri, Option<u64>, bool)> = writes
            .iter()
            .map(|w| {
                let replaced = match w {
                    RelationWrite::Replace { version, .. } => Some(version.node_version),
                    _ => None,
                };
                let purge = matches!(w, RelationWrite::Purge { .. });
                (w.owner().clone(), replaced, purge)
            })
            .collect();
        let mut in_place = Vec::new();
        let mut call = |writes: &[RelationWrite]| {
            bisect::index_write(writes, IndexKind::Relation, |w| self.index.write_owners(w))
        };
        let outcomes = bisect::call_split(&writes, &mut call, self.consumer, "write");
        for ((owner, replaced, purge), outcome) in keys.into_iter().zip(outcomes) {
            let outcome = outcome.and_then(|o| o.map_err(WorkError::from));
            if let (Some(v), Ok(RelationOutcome::Applied | RelationOutcome::Unchanged)) =
                (replaced, &outcome)
            {
                in_place.push((owner.clone(), v));
            }
            match outcome {
                Ok(RelationOutcome::Applied) if replaced.is_some() => counts.upserted += 1,
                Ok(RelationOutcome::Applied) => {
                    counts.removed += 1;
                    if purge {
                        purged.push(owner);
                    }
                }
                Ok(RelationOutcome::Unchanged) => counts.unchanged += 1,
                Ok(RelationOutcome::Stale) => counts.stale += 1,
                Err(e) => {
                    warn!(uri = %owner, error = %e, "{} write failed", IndexKind::Relation.name());
                    failed.insert(owner, e);
                }
            }
        }
        in_place
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ce_core::Config;
    use ce_store::{ContextFs as _, LinkRequest, PutRequest, RelationStore as _};

    use super::*;
    use crate::relation::RelationRecord;
    use crate::relation::memory::MemoryRelationIndex;
    use crate::worker::testkit::{self, Env};
    use crate::worker::{IndexWorker, WorkerConfig};

    /// The store, the relation index and a worker between them.
    struct Fixture {
        env: Env,
        index: Arc<MemoryRelationIndex>,
        worker: IndexWorker,
    }

    impl std::ops::Deref for Fixture {
        type Target = Env;

        fn deref(&self) -> &Env {
            &self.env
        }
    }

    fn env() -> Fixture {
        let env = Env::new("relation");
        let index = Arc::new(MemoryRelationIndex::new());
        let mut wcfg = WorkerConfig::from_config(&Config::default(), "r1", "relation");
        wcfg.heartbeat = Duration::from_millis(50);
        let worker =
            IndexWorker::for_relations(wcfg, env.store.clone(), index.clone()).expect("worker");
        Fixture { env, index, worker }
    }

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn put(env: &Env, u: &str) {
        let req = PutRequest {
            content: Some(format!("content of {u}")),
            ..PutRequest::default()
        };
        env.store.put(&uri(u), req).expect("put");
    }

    fn link(env: &Env, from: &str, to: &str, ty: &str) {
        env.store
            .link(LinkRequest {
                from: uri(from),
                to: uri(to),
                relation_type: ty.into(),
                weight: 1.0,
                reason: String::new(),
                trace_id: None,
            })
            .expect("link");
    }

    fn drain(f: &Fixture) {
        testkit::drain(f, &f.worker);
    }

    /// Every node's edges in the source, as the index must hold them.
    fn expected(env: &Env) -> Vec<RelationRecord> {
        let p = IndexProjector::default();
        let mut out: Vec<RelationRecord> = env
            .store
            .read_subtree(&CtxUri::root())
            .expect("read")
            .iter()
            .flat_map(|n| {
                let edges = env.store.get_edges(&n.uri).expect("edges");
                p.build_relation_records(n, &edges)
                    .into_iter()
                    .map(|record| RelationRecord {
                        record,
                        relation_version: n.relation_version,
                    })
            })
            .collect();
        out.sort_by(crate::relation::by_key);
        out
    }

    fn actual(env: &Fixture) -> Vec<RelationRecord> {
        env.index.list_under(&CtxUri::root()).expect("list")
    }

    #[test]
    fn links_unlinks_removals_and_moves_converge() {
        let env = env();
        for u in [
            "ctx://acc/a",
            "ctx://acc/b",
            "ctx://acc/m/x",
            "ctx://acc/m/y",
        ] {
            put(&env, u);
        }
        link(&env, "ctx://acc/a", "ctx://acc/b", "ref");
        link(&env, "ctx://acc/a", "ctx://acc/m/x", "cites");
        link(&env, "ctx://acc/m/x", "ctx://acc/m/y", "ref");
        link(&env, "ctx://acc/m/y", "ctx://acc/b", "ref");
        drain(&env);
        assert_eq!(actual(&env).len(), 4);
        assert_eq!(actual(&env), expected(&env));

        env.store
            .unlink(&uri("ctx://acc/a"), &uri("ctx://acc/b"), "ref", None)
            .expect("unlink");
        drain(&env);
        assert_eq!(actual(&env), expected(&env));

        // A move rewrites edges from, within and into the subtree.
        env.store
            .mv(&uri("ctx://acc/m"), &uri("ctx://acc/n"), None)
            .expect("mv");
        drain(&env);
        assert_eq!(actual(&env), expected(&env));
        assert!(
            env.index
                .list_under(&uri("ctx://acc/m"))
                .expect("list")
                .is_empty()
        );
        assert_eq!(
            env.index
                .list_targeting(&uri("ctx://acc/n"))
                .expect("list")
                .len(),
            2
        );

        // Removing a target removes the edges into it; removing an owner, its own.
        env.store
            .rm(&uri("ctx://acc/b"), false, None, None)
            .expect("rm");
        env.store
            .rm(&uri("ctx://acc/n"), true, None, None)
            .expect("rm");
        drain(&env);
        assert_eq!(actual(&env), expected(&env));
        assert!(actual(&env).is_empty());
        // The removed owners are remembered as removed (RX1).
        let v = env
            .index
            .owner_version(&uri("ctx://acc/n/x"))
            .expect("version")
            .expect("known");
        assert!(v.deleted);
    }

    #[test]
    fn a_move_alone_resyncs_the_owners_pointing_into_the_subtree() {
        let env = env();
        for u in ["ctx://acc/o", "ctx://acc/m/x"] {
            put(&env, u);
        }
        link(&env, "ctx://acc/o", "ctx://acc/m/x", "ref");
        link(&env, "ctx://acc/m/x", "ctx://acc/o", "ref");
        drain(&env);
        env.store
            .mv(&uri("ctx://acc/m"), &uri("ctx://acc/n"), None)
            .expect("mv");
        // Only the move's own operations (not the owner's UPSERT_RELATION the store adds).
        let applier = RelationApplier {
            consumer: "relation",
            source: env.store.as_ref(),
            index: env.index.as_ref(),
            projector: &IndexProjector::default(),
        };
        let applied = applier.apply(&[
            Op::SyncSubtree(uri("ctx://acc/m")),
            Op::SyncSubtree(uri("ctx://acc/n")),
        ]);
        assert!(applied.results.iter().all(Result::is_ok));
        assert_eq!(actual(&env), expected(&env));
        assert_eq!(
            applied.counts,
            RelationCounts {
                upserted: 2,
                removed: 1,
                unchanged: 2,
                stale: 0,
                superseded: 0,
            },
            "o re-pointed, n/x written, m/x removed; the containers m and n own nothing"
        );
        // Replaying changes nothing.
        let again = applier.apply(&[
            Op::SyncSubtree(uri("ctx://acc/m")),
            Op::SyncSubtree(uri("ctx://acc/n")),
            Op::SyncNode(uri("ctx://acc/o")),
        ]);
        assert_eq!(again.counts.upserted + again.counts.removed, 0);
        assert_eq!(actual(&env), expected(&env));
    }

    #[test]
    fn a_deleted_target_alone_resyncs_the_owners_pointing_at_it() {
        let env = env();
        for u in ["ctx://acc/o", "ctx://acc/t"] {
            put(&env, u);
        }
        link(&env, "ctx://acc/o", "ctx://acc/t", "ref");
        drain(&env);
        env.store
            .rm(&uri("ctx://acc/t"), false, None, None)
            .expect("rm");
        let applier = RelationApplier {
            consumer: "relation",
            source: env.store.as_ref(),
            index: env.index.as_ref(),
            projector: &IndexProjector::default(),
        };
        let applied = applier.apply(&[Op::SyncNode(uri("ctx://acc/t"))]);
        assert!(applied.results.iter().all(Result::is_ok));
        assert!(actual(&env).is_empty());
        assert_eq!(actual(&env), expected(&env));
    }

    #[test]
    fn an_older_state_never_overwrites_a_newer_one() {
        let env = env();
        for u in ["ctx://acc/a", "ctx://acc/b", "ctx://acc/c"] {
            put(&env, u);
        }
        link(&env, "ctx://acc/a", "ctx://acc/b", "ref");
        drain(&env);
        let old = actual(&env);
        link(&env, "ctx://acc/a", "ctx://acc/c", "ref");
        drain(&env);
        // A slow worker that read the older state writes it late: stale.
        let node = env
            .store
            .read_node(&uri("ctx://acc/a"))
            .expect("read")
            .expect("node");
        let out = env
            .index
            .write_owners(&[RelationWrite::Replace {
                owner: uri("ctx://acc/a"),
                version: RelationVersion {
                    node_version: node.version,
                    relation_version: node.relation_version - 1,
                },
                records: old.into_iter().map(|r| r.record).collect(),
            }])
            .expect("write");
        assert!(matches!(out[0], Ok(RelationOutcome::Stale)));
        assert_eq!(actual(&env), expected(&env));
        // Content updates need no relation work.
        let req = PutRequest {
            content: Some("new content".into()),
            ..PutRequest::default()
        };
        env.store.put(&uri("ctx://acc/a"), req).expect("put");
        let claimed = env.worker.run_once(100).expect("run");
        assert_eq!((claimed.claimed, claimed.succeeded), (1, 1));
        assert_eq!(actual(&env), expected(&env));
    }
}
