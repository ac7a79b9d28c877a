//! The consumer registry: every outbox consumer this build can apply, each one
//! [`Registration`] (its name and what is known before its index is open) and one
//! [`Consumer`] implementation (its open index: workers, status, dry run, reindex,
//! reconcile, upkeep).
//!
//! The engine never matches on consumer names: it opens the registered consumers that are
//! configured and served ([`Consumers::open`]) and asks each slot. Adding a consumer means
//! one module with its `impl Consumer` and its `REGISTRATION`, and one line in
//! [`REGISTRY`].
//!
//! A slot is a trait object rather than an enum: a new consumer then touches no match arm
//! elsewhere, and the search policy, which reads the vector and keyword indexes by type,
//! gets them with [`Consumers::get`] (a downcast) instead of a name.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use ce_core::{Config, EVENT_VERSION, EventPayload, UpsertContextPayload, UpsertReason};
use ce_embed::{CachedEmbedder, Embedder, ModelIdentity};
use ce_index::repair::IndexView;
use ce_index::worker::dry_run::DryRunReport;
use ce_index::worker::target::IndexTarget;
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{NodeStat, SourceStore};

use super::periodic::Periodic;
use crate::error::{Result, ServerError};
use crate::status::Status;

mod derive;
mod keyword;
mod relation;
mod vector;

pub use derive::DeriveConsumer;
pub use keyword::{KEYWORD_DIR, KeywordConsumer};
pub use relation::{RELATION_DIR, RelationConsumer};
pub use vector::{VECTOR_DIR, VectorConsumer};

/// Every consumer this build can apply, in the order status and reports list them.
pub static REGISTRY: &[Registration] = &[
    vector::REGISTRATION,
    keyword::REGISTRATION,
    relation::REGISTRATION,
    derive::REGISTRATION,
];

/// The consumer a reindex rebuilds when none is named (`POST /v1/reindex` with no body).
pub const DEFAULT_REINDEX_CONSUMER: &str = vector::REGISTRATION.name;

/// What opening a consumer's index needs.
pub struct Opening<'a> {
    /// The data directory (embedded indexes live under it).
    pub data_dir: &'a Path,
    /// The configuration.
    pub config: &'a Config,
    /// Whether the engine only reads and reports ([`crate::Engine::observe`]): an embedded
    /// index another process holds is then [`Held`], not an error.
    pub observer: bool,
}

/// A configured consumer whose embedded index another process holds (`ce worker` or
/// `ce serve` on this data directory), seen from an observing engine: that process applies
/// its events; this one reports it.
#[derive(Debug, Clone)]
pub struct Held {
    /// Its name.
    pub name: &'static str,
    /// Why it is not open here.
    pub reason: String,
}

/// A consumer this build can apply, before its index is open.
#[derive(Debug)]
pub struct Registration {
    /// Its name in `index.outbox.consumers` and in the outbox.
    pub name: &'static str,
    /// Whether its workers embed (the engine loads the model only when a served consumer
    /// does).
    pub needs_embedder: bool,
    /// Whether its index lives in the data directory under this configuration, so that one
    /// index instance owns it ([`super::owner`]); a shared destination has no owner.
    pub embedded: fn(&Config) -> bool,
    /// Opens its index.
    pub open: fn(&Opening<'_>) -> Result<Arc<dyn Consumer>>,
}

impl std::fmt::Debug for dyn Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.registration().name)
    }
}

/// One registered consumer whose index is open here.
pub trait Consumer: Any + Send + Sync {
    /// Its registration.
    fn registration(&self) -> &'static Registration;

    /// A worker applying its events; `embedder` is given when the registration needs one.
    fn worker(
        &self,
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        embedder: Option<Arc<dyn Embedder>>,
        projector: ce_core::IndexProjector,
    ) -> Result<IndexWorker>;

    /// The target a dry run computes its delta against (`None`: no delta dry run).
    fn dry_run_target(&self) -> Option<Arc<dyn IndexTarget>> {
        None
    }

    /// A dry run the consumer computes itself, for a consumer whose work is not a delta
    /// against an index target (the derive consumer: what a drain would derive and spend);
    /// `None` when it has no such dry run.
    fn own_dry_run(
        &self,
        _source: &Arc<dyn SourceStore>,
        _limit: usize,
    ) -> Option<Result<DryRunReport>> {
        None
    }

    /// Whether it has a dry run of either kind.
    fn has_dry_run(&self) -> bool {
        self.dry_run_target().is_some()
    }

    /// The repair event that rebuilds `node`'s part of the index, if it has one.
    fn repair_event(&self, node: NodeStat, trace_id: &str) -> Option<EventPayload>;

    /// Empties the index (bound to `model` afterwards when given); returns the records
    /// removed.
    fn clear(&self, model: Option<&ModelIdentity>) -> Result<u64>;

    /// What a reindex marks in the source before its repair events are appended (the
    /// derive consumer's dirty keys); returns how many.
    fn reindex_marks(&self, _source: &dyn SourceStore) -> Result<u64> {
        Ok(0)
    }

    /// The index as the reconciler compares it with the source (`model`: the configured
    /// embedding model, when loaded); `None` for a consumer with no index records.
    fn view<'a>(&'a self, model: Option<&'a ModelIdentity>) -> Option<IndexView<'a>>;

    /// Fills its part of the engine's status.
    fn report(&self, status: &mut Status) -> Result<()>;

    /// Binds the index to the embedder's model (`None`: not loaded), recording a mismatch
    /// as a blocker.
    fn bind(&self, _embedder: Option<&CachedEmbedder>) -> Result<()> {
        Ok(())
    }

    /// What keeps its events from being applied here, with the fixes (empty: nothing).
    fn blockers(&self, _embedder: std::result::Result<&CachedEmbedder, &str>) -> Vec<String> {
        Vec::new()
    }

    /// Starts the background upkeep its index needs while workers run, if any.
    fn start_upkeep(&self, _config: &Config) -> Option<Periodic> {
        None
    }

    /// Stops the index's background work and writes what it keeps in memory (on shutdown).
    fn flush(&self) {}
}

/// The registration named `name`.
pub fn registration(name: &str) -> Option<&'static Registration> {
    REGISTRY.iter().find(|r| r.name == name)
}

/// The names of every registered consumer.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|r| r.name).collect()
}

/// Whether `consumer`'s index lives in the data directory under `config` (an unknown
/// consumer has no index, so no owner).
pub fn is_embedded(config: &Config, consumer: &str) -> bool {
    registration(consumer).is_some_and(|r| (r.embedded)(config))
}

/// A worker over `target` (the consumers whose workers apply an [`IndexTarget`]).
fn target_worker(
    target: Arc<dyn IndexTarget>,
    cfg: WorkerConfig,
    source: Arc<dyn SourceStore>,
    embedder: Option<Arc<dyn Embedder>>,
    projector: ce_core::IndexProjector,
) -> Result<IndexWorker> {
    Ok(IndexWorker::for_target(
        cfg, source, target, embedder, projector,
    )?)
}

/// The repair `UPSERT_CONTEXT` of a node with text (the consumers that index node text).
fn context_repair(node: NodeStat, trace_id: &str) -> Option<EventPayload> {
    if node.layer_bytes.iter().all(|&b| b == 0) {
        return None;
    }
    Some(EventPayload::UpsertContext(UpsertContextPayload {
        event_version: EVENT_VERSION,
        uri: node.uri,
        expected_node_version: node.version,
        reason: UpsertReason::Repair,
        trace_id: trace_id.to_owned(),
    }))
}

/// The open consumers of one engine: the registered ones that are configured and served.
#[derive(Debug, Default)]
pub struct Consumers(Vec<Arc<dyn Consumer>>);

impl Consumers {
    /// Opens the index of every registered consumer for which `wanted` holds; with an
    /// observing `opening`, those another process holds are returned apart.
    pub fn open(
        opening: &Opening<'_>,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<(Consumers, Vec<Held>)> {
        let (mut open, mut held) = (Vec::new(), Vec::new());
        for r in REGISTRY.iter().filter(|r| wanted(r.name)) {
            match (r.open)(opening) {
                Ok(c) => open.push(c),
                Err(ServerError::Index(ce_index::IndexError::Held(reason))) if opening.observer => {
                    held.push(Held {
                        name: r.name,
                        reason,
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok((Consumers(open), held))
    }

    /// The open consumers, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Consumer>> {
        self.0.iter()
    }

    /// The open consumer named `name`.
    pub fn find(&self, name: &str) -> Option<&Arc<dyn Consumer>> {
        self.0.iter().find(|c| c.registration().name == name)
    }

    /// The open consumer of type `T`.
    pub fn get<T: Consumer>(&self) -> Option<&T> {
        self.0.iter().find_map(|c| {
            let any: &dyn Any = c.as_ref();
            any.downcast_ref::<T>()
        })
    }

    /// Whether an open consumer embeds.
    pub fn need_embedder(&self) -> bool {
        self.0.iter().any(|c| c.registration().needs_embedder)
    }

    /// The open consumers' names.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|c| c.registration().name).collect()
    }
}

/// The error for a consumer this build has no index for.
pub fn unknown(consumer: &str) -> ServerError {
    ServerError::UnsupportedConsumer {
        name: consumer.into(),
        reason: format!("this build has indexes for {:?} only", names()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_registered_consumer_opens_as_its_own_slot() {
        let names: BTreeSet<&str> = names().into_iter().collect();
        assert_eq!(names.len(), REGISTRY.len(), "one registration per name");
        let dir = tempfile::tempdir().expect("tmp");
        let config = Config::default();
        let opening = Opening {
            data_dir: dir.path(),
            config: &config,
            observer: false,
        };
        let (all, _) = Consumers::open(&opening, |_| true).expect("open");
        assert_eq!(all.names(), super::names(), "registry order");
        for (slot, r) in all.iter().zip(REGISTRY) {
            let mine = slot.registration();
            assert_eq!(
                (mine.name, mine.needs_embedder),
                (r.name, r.needs_embedder),
                "a slot reports its own registration"
            );
        }
        assert!(all.get::<VectorConsumer>().is_some());
        assert!(all.get::<KeywordConsumer>().is_some());
        assert!(all.get::<RelationConsumer>().is_some());
        assert!(all.need_embedder());
        let (keyword_only, _) =
            Consumers::open(&opening, |c| c == KeywordConsumer::NAME).expect("open");
        assert_eq!(keyword_only.names(), [KeywordConsumer::NAME]);
        assert!(keyword_only.get::<VectorConsumer>().is_none());
        assert!(keyword_only.find(VectorConsumer::NAME).is_none());
        assert!(!keyword_only.need_embedder());
    }

    #[test]
    fn only_indexes_in_the_data_directory_have_an_owner() {
        let mut config = Config::default();
        for r in REGISTRY {
            let derive = r.name == DeriveConsumer::NAME;
            assert_eq!(is_embedded(&config, r.name), !derive, "{}", r.name);
        }
        assert!(
            !is_embedded(&config, "graph"),
            "an unknown consumer has no index"
        );
        config.index.vector.destination = "pgvector".into();
        assert!(
            !is_embedded(&config, VectorConsumer::NAME),
            "pgvector is shared"
        );
        assert!(is_embedded(&config, KeywordConsumer::NAME));
    }

    #[test]
    fn an_unknown_consumer_is_a_permanent_typed_error() {
        use ce_core::{Classify as _, ErrorCode};
        let e = unknown("graph");
        assert_eq!(
            (e.code(), e.is_retryable()),
            (ErrorCode::InvalidField, false)
        );
        assert!(e.to_string().contains("\"graph\""), "{e}");
        assert!(registration("graph").is_none());
    }
}
