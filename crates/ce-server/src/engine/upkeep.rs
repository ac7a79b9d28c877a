//! Upkeep of the embedded vector index while workers run: snapshot the ANN graph every
//! `index.vector.snapshot_interval_seconds` when it changed (so a crash costs only the
//! catch-up since the last snapshot, not a full rebuild), and rebuild the graph when removed
//! slots pass `index.vector.rebuild_tombstone_ratio` (they cost memory and search time).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_index::vector::embedded::EmbeddedVectorIndex;
use tracing::{info, warn};

use super::periodic::Periodic;

/// How often the upkeep thread looks at the index (at most; never more often than
/// the snapshot interval).
const TICK: Duration = Duration::from_secs(30);

/// Upkeep settings.
#[derive(Debug, Clone, Copy)]
pub struct UpkeepPolicy {
    /// Snapshot period.
    pub snapshot_interval: Duration,
    /// Tombstone share that triggers a graph rebuild.
    pub rebuild_tombstone_ratio: f64,
}

impl UpkeepPolicy {
    /// From `[index.vector]`.
    pub fn from_config(cfg: &ce_core::Config) -> Self {
        let v = &cfg.index.vector;
        UpkeepPolicy {
            snapshot_interval: Duration::from_secs(u64::from(v.snapshot_interval_seconds)),
            rebuild_tombstone_ratio: v.rebuild_tombstone_ratio,
        }
    }
}

/// What one upkeep step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UpkeepStep {
    /// The graph was rebuilt.
    pub rebuilt: bool,
    /// A snapshot was written.
    pub snapshot: bool,
}

/// One upkeep step: rebuild when tombstones call for it, snapshot when the graph changed and
/// `last_snapshot` is older than the interval (a rebuild is always followed by a snapshot).
pub fn step(
    index: &EmbeddedVectorIndex,
    policy: &UpkeepPolicy,
    last_snapshot: &mut Instant,
) -> UpkeepStep {
    let mut done = UpkeepStep::default();
    let stats = index.stats();
    if stats.needs_rebuild(policy.rebuild_tombstone_ratio) {
        let t0 = Instant::now();
        match index.rebuild_graph() {
            Ok(()) => {
                done.rebuilt = true;
                info!(
                    tombstones = stats.tombstones,
                    vectors = stats.graph_vectors,
                    ms = t0.elapsed().as_millis() as u64,
                    "vector index graph rebuilt"
                );
            }
            Err(e) => warn!(error = %e, "vector index graph rebuild failed"),
        }
    }
    let due = last_snapshot.elapsed() >= policy.snapshot_interval || done.rebuilt;
    if due && !index.stats().snapshot_current {
        match index.flush() {
            Ok(()) => done.snapshot = true,
            Err(e) => warn!(error = %e, "vector index snapshot failed"),
        }
        *last_snapshot = Instant::now();
    }
    done
}

/// Starts the upkeep thread (stopped with the returned [`Periodic`]). Its first step loads
/// the graph (an index opens without it, docs/indexing.md), so that a long-running process
/// has it in memory before its first search asks.
pub fn start(index: Arc<EmbeddedVectorIndex>, policy: UpkeepPolicy) -> Periodic {
    let tick = TICK.min(policy.snapshot_interval);
    let mut last_snapshot = Instant::now();
    let mut loaded = false;
    Periodic::start("ce-index-upkeep", Duration::ZERO, move || {
        if !loaded {
            loaded = true;
            let t0 = Instant::now();
            match index.load() {
                Ok(()) => info!(
                    ms = t0.elapsed().as_millis() as u64,
                    "vector index graph loaded"
                ),
                Err(e) => {
                    warn!(error = %e, "vector index graph not loaded (the first search retries)")
                }
            }
            return tick;
        }
        step(&index, &policy, &mut last_snapshot);
        tick
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ce_core::{CtxUri, IndexRecord, Level};
    use ce_index::vector::{VectorIndex, VectorRecord};

    use super::*;

    fn record(i: usize) -> VectorRecord {
        let uri = CtxUri::parse(&format!("ctx://acc/n{i}")).expect("uri");
        let mut vector = vec![0.01f32; 8];
        vector[i % 8] = 1.0;
        vector[(i / 8) % 8] += 0.5;
        VectorRecord {
            record: IndexRecord {
                id: ce_core::stable_hash(uri.as_str(), 0),
                parent_uri: CtxUri::parse("ctx://acc").expect("uri"),
                uri,
                context_type: "resource".into(),
                category: String::new(),
                level: Level::ALL[0],
                text: format!("text {i}"),
                filters: BTreeMap::new(),
                metadata: BTreeMap::new(),
            },
            vector,
        }
    }

    #[test]
    fn step_rebuilds_past_the_tombstone_ratio_and_snapshots_when_due() {
        let dir = tempfile::tempdir().expect("tmp");
        let index = EmbeddedVectorIndex::open(dir.path()).expect("open");
        let records: Vec<VectorRecord> = (0..1_500).map(record).collect();
        index.upsert(&records).expect("upsert");
        let policy = UpkeepPolicy {
            snapshot_interval: Duration::from_secs(3600),
            rebuild_tombstone_ratio: 0.3,
        };
        let mut last = Instant::now();
        // Changed but not due, no tombstones: nothing.
        assert_eq!(step(&index, &policy, &mut last), UpkeepStep::default());
        assert!(!index.stats().snapshot_current);
        // Due: a snapshot.
        last -= Duration::from_secs(3601);
        let done = step(&index, &policy, &mut last);
        assert_eq!(
            done,
            UpkeepStep {
                rebuilt: false,
                snapshot: true
            }
        );
        assert!(index.stats().snapshot_current);
        // 1,100 of 1,500 removed: rebuilt (tombstones gone) and snapshotted at once.
        for r in &records[..1_100] {
            index.delete_by_uri(&r.record.uri, false).expect("delete");
        }
        assert_eq!(index.stats().tombstones, 1_100);
        let done = step(&index, &policy, &mut last);
        assert_eq!(
            done,
            UpkeepStep {
                rebuilt: true,
                snapshot: true
            }
        );
        let stats = index.stats();
        assert_eq!((stats.tombstones, stats.graph_vectors), (0, 400));
        assert!(stats.snapshot_current);
        index.check_consistency().expect("consistent");
    }

    #[test]
    fn the_thread_stops_promptly() {
        let dir = tempfile::tempdir().expect("tmp");
        let index = Arc::new(EmbeddedVectorIndex::open(dir.path()).expect("open"));
        let u = start(
            index,
            UpkeepPolicy::from_config(&ce_core::Config::default()),
        );
        let t0 = Instant::now();
        u.stop();
        assert!(t0.elapsed() < TICK, "stop waited for a tick");
    }
}
