//! Dry run (spec "Cursor", "Delta Validation"): the delta a consumer's pending events would
//! apply to its index — counts by action and a sample of the nodes written — computed by the
//! worker's own pipeline (compact, read the source, project, classify) without claiming,
//! embedding, writing or acknowledging anything. The consumer's queue and index are exactly
//! as before; the report says what applying would do.
//!
//! The pipeline runs unchanged over a [`RecordingTarget`] (reads go to the real index, writes
//! are recorded, not applied) and, for vector targets, an embedder that counts texts instead
//! of calling the model — so a dry run also works while the model is missing.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ce_core::{CtxUri, DeliveryStatus, IndexProjector};
use ce_embed::{EmbedError, Embedder, ModelIdentity};
use ce_store::{ClaimedEvent, OutboxFilter, SourceStore};
use serde::{Deserialize, Serialize};

use super::apply::NodeApplier;
use super::target::{IndexKind, IndexTarget};
use super::{WorkError, WorkerConfig, compact};
use crate::vector::{NodeWrite, StoredRecord, StoredVector, SyncOutcome};

/// URIs kept per sampled action.
pub const SAMPLE_SIZE: usize = 10;

/// What applying a consumer's pending events would do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DryRunReport {
    /// The consumer.
    pub consumer: String,
    /// Open deliveries examined (pending, retry-wait and claimed, oldest first); for the
    /// `derive` consumer, the open dirty keys examined (its work list).
    pub events: u64,
    /// Highest sequence examined (`None` when there was nothing to examine).
    pub through_seq: Option<i64>,
    /// Whether more open deliveries exist than were examined.
    pub truncated: bool,
    /// Counts by action, as `index_worker_changes_total` would count them when applied:
    /// `embed`, `reuse`, `payload`, `text`, `unchanged`, `delete`, `purge`.
    pub actions: BTreeMap<String, u64>,
    /// Up to [`SAMPLE_SIZE`] node URIs per write kind (`sync`, `delete`, `purge`).
    pub samples: BTreeMap<String, Vec<String>>,
    /// Operations whose inputs could not be read (each would fail and be retried).
    pub errors: Vec<String>,
    /// True when every examined event's delta was computed (no error).
    pub valid: bool,
    /// Time taken.
    pub took_ms: f64,
    /// What applying would spend on a paid generator (`derive` only; `None` elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend: Option<SpendEstimate>,
}

/// The tokens a run would spend, estimated before spending any (docs/derive.md, "Dry run").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendEstimate {
    /// The generator that would run (`extractive:1`, `llm:…`); the extractive fallback when
    /// the day's token budget is spent.
    pub generator: String,
    /// Nodes the generator would derive (the others are current or not derived).
    pub derivations: u64,
    /// Prompt tokens, estimated from the text sent (about 4 characters per token, one per
    /// CJK character): 0 for a generator without a model.
    pub tokens_in: u64,
    /// Completion tokens at most (bounded by the answers' length and `max_tokens`).
    pub tokens_out: u64,
}

/// Computes the dry run of `cfg.consumer`'s first `limit` open deliveries against `target`.
pub fn dry_run(
    cfg: &WorkerConfig,
    source: &dyn SourceStore,
    target: &dyn IndexTarget,
    projector: &IndexProjector,
    limit: usize,
) -> Result<DryRunReport, WorkError> {
    let started = Instant::now();
    let (events, truncated) = open_events(source, &cfg.consumer, limit)?;
    let plan = compact::compact(&events, cfg.relation_index_enabled);
    let recording = RecordingTarget {
        inner: target,
        writes: Mutex::new(Vec::new()),
    };
    let counter = CountingEmbedder::default();
    let applier = NodeApplier {
        source,
        embedder: target.uses_vectors().then_some(&counter as &dyn Embedder),
        target: &recording,
        projector,
        cfg,
    };
    let applied = applier.apply(&plan.ops);

    let c = applied.counts;
    let mut actions: BTreeMap<String, u64> = [
        ("embed", c.embedded),
        ("reuse", c.reused),
        ("payload", c.payload_only),
        ("text", c.rewritten),
        ("unchanged", c.unchanged),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut samples: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let writes = recording
        .writes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (kind, uri) in writes {
        if kind != "sync" {
            *actions.entry(kind.to_owned()).or_default() += 1;
        }
        let sample = samples.entry(kind.to_owned()).or_default();
        if sample.len() < SAMPLE_SIZE && !sample.contains(&uri.to_string()) {
            sample.push(uri.to_string());
        }
    }
    let errors: Vec<String> = plan
        .ops
        .iter()
        .zip(&applied.results)
        .filter_map(|(op, r)| r.as_ref().err().map(|e| format!("{op:?}: {e}")))
        .collect();
    Ok(DryRunReport {
        consumer: cfg.consumer.clone(),
        events: events.len() as u64,
        through_seq: events.iter().map(|e| e.event.seq).max(),
        truncated,
        actions,
        samples,
        valid: errors.is_empty(),
        errors,
        took_ms: ce_core::clock::ms_of(started.elapsed()),
        spend: None,
    })
}

/// The consumer's open deliveries (pending, retry-wait, claimed), oldest first, at most
/// `limit`, as the claims a worker would see (the claims are never used).
fn open_events(
    source: &dyn SourceStore,
    consumer: &str,
    limit: usize,
) -> Result<(Vec<ClaimedEvent>, bool), WorkError> {
    let mut rows = Vec::new();
    for status in [
        DeliveryStatus::Pending,
        DeliveryStatus::RetryWait,
        DeliveryStatus::Claimed,
    ] {
        rows.extend(source.list(&OutboxFilter {
            status: Some(status),
            consumer: Some(consumer.to_owned()),
            limit: Some(u32::try_from(limit.saturating_add(1)).unwrap_or(u32::MAX)),
            ..OutboxFilter::default()
        })?);
    }
    rows.sort_by_key(|r| r.event.seq);
    let truncated = rows.len() > limit;
    rows.truncate(limit);
    let events = rows
        .into_iter()
        .map(|r| ClaimedEvent {
            claim: ce_store::Claim {
                consumer: consumer.to_owned(),
                seq: r.event.seq,
                event_id: r.event.event_id.clone(),
                worker_id: "dry-run".into(),
                token: String::new(),
                claimed_until_ms: 0,
            },
            retry_count: r.delivery.retry_count,
            event: r.event,
        })
        .collect();
    Ok((events, truncated))
}

/// Reads from the real index; records writes instead of applying them.
struct RecordingTarget<'a> {
    inner: &'a dyn IndexTarget,
    writes: Mutex<Vec<(&'static str, CtxUri)>>,
}

impl IndexTarget for RecordingTarget<'_> {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }
    fn uses_vectors(&self) -> bool {
        self.inner.uses_vectors()
    }
    fn bind_model(&self, _model: &ModelIdentity) -> crate::Result<()> {
        Ok(())
    }
    fn get(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredRecord>> {
        self.inner.get(uris)
    }
    fn vectors(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredVector>> {
        self.inner.vectors(uris)
    }
    fn list_under(&self, uri: &CtxUri) -> crate::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn uris_under(&self, uri: &CtxUri) -> crate::Result<Vec<CtxUri>> {
        self.inner.uris_under(uri)
    }
    fn write_nodes(&self, writes: &[NodeWrite]) -> crate::Result<Vec<crate::Result<SyncOutcome>>> {
        let mut log = crate::lock(&self.writes);
        let mut out = Vec::with_capacity(writes.len());
        for w in writes {
            let kind = match w {
                NodeWrite::Sync { .. } => "sync",
                NodeWrite::Remove { .. } => "delete",
                NodeWrite::Purge { .. } => "purge",
            };
            // A removal of a node the index holds nothing of changes nothing: not a delta.
            let holds =
                kind == "sync" || !self.inner.get(std::slice::from_ref(w.uri()))?.is_empty();
            if holds {
                log.push((kind, w.uri().clone()));
            }
            // Not applied: "stale" keeps the pipeline from counting it as written.
            out.push(Ok(SyncOutcome::Stale));
        }
        Ok(out)
    }
}

/// Counts the texts it is asked to embed and returns placeholder vectors (never stored).
#[derive(Default)]
struct CountingEmbedder {
    identity: DryRunIdentity,
}

struct DryRunIdentity(ModelIdentity);

impl Default for DryRunIdentity {
    fn default() -> Self {
        DryRunIdentity(ModelIdentity {
            provider: "dry-run".into(),
            model: "none".into(),
            dimension: 1,
        })
    }
}

impl Embedder for CountingEmbedder {
    fn identity(&self) -> &ModelIdentity {
        &self.identity.0
    }
    fn embed_texts(&self, texts: &[&str], _timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|_| vec![1.0]).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ce_core::{Config, IndexProjector};
    use ce_store::{ContextFs as _, OutboxStore as _, PutMode, PutRequest, SqliteStore};

    use super::*;
    use crate::keyword::KeywordIndex as _;
    use crate::keyword::memory::MemoryKeywordIndex;
    use crate::vector::VectorIndex as _;
    use crate::vector::memory::MemoryVectorIndex;
    use crate::worker::IndexWorker;
    use crate::worker::target::{KeywordTarget, VectorTarget};

    fn store(dir: &std::path::Path) -> Arc<SqliteStore> {
        let mut cfg = Config::default();
        cfg.index.outbox.consumers = vec!["vector".into(), "keyword".into()];
        Arc::new(SqliteStore::open(dir, cfg).expect("store"))
    }

    fn put(s: &SqliteStore, uri: &str, text: &str) {
        let req = PutRequest {
            abstract_text: Some(text.into()),
            content: Some(format!("{text}, in detail")),
            ..PutRequest::default()
        };
        s.put(&CtxUri::parse(uri).expect("uri"), req).expect("put");
    }

    fn pending(s: &SqliteStore, consumer: &str) -> u64 {
        let stats = s.stats().expect("stats");
        stats
            .iter()
            .find(|c| c.consumer == consumer)
            .map_or(0, |c| c.pending)
    }

    fn cfg(consumer: &str) -> WorkerConfig {
        WorkerConfig::from_config(&Config::default(), "dry", consumer)
    }

    #[test]
    fn reports_the_delta_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = store(dir.path());
        put(&s, "ctx://acc/docs/a", "alpha");
        put(&s, "ctx://acc/docs/b", "beta");
        let index = Arc::new(MemoryKeywordIndex::new());
        let target = KeywordTarget(index.clone());
        let projector = IndexProjector::default();
        let before = pending(&s, "keyword");

        let r = dry_run(&cfg("keyword"), s.as_ref(), &target, &projector, 100).expect("dry run");
        assert!(r.valid, "{r:?}");
        assert_eq!(r.events, before);
        assert!(!r.truncated);
        // Three levels per node (the overview falls back to the content), rewritten without
        // embedding; the text-less ancestors the puts created are written too, without a
        // record (the write records their version, VX1).
        assert_eq!(r.actions["text"], 6, "{r:?}");
        assert_eq!(r.actions["unchanged"], 0, "{r:?}");
        assert_eq!(
            r.samples["sync"],
            [
                "ctx://acc",
                "ctx://acc/docs",
                "ctx://acc/docs/a",
                "ctx://acc/docs/b"
            ]
        );
        assert_eq!(
            (index.count().expect("count"), pending(&s, "keyword")),
            (0, before)
        );

        // Apply for real, then a metadata-only change and a removal.
        let w = IndexWorker::for_target(
            cfg("keyword"),
            s.clone(),
            Arc::new(KeywordTarget(index.clone())),
            None,
            IndexProjector::default(),
        )
        .expect("worker");
        while w.run_once(100).expect("run").claimed > 0 {}
        let mut meta = PutRequest {
            mode: PutMode::Merge,
            ..PutRequest::default()
        };
        meta.meta.insert("k".into(), serde_json::json!(1));
        s.put(&CtxUri::parse("ctx://acc/docs/a").expect("uri"), meta)
            .expect("meta");
        s.rm(
            &CtxUri::parse("ctx://acc/docs/b").expect("uri"),
            false,
            None,
            None,
        )
        .expect("rm");
        let records = index.count().expect("count");
        let r = dry_run(&cfg("keyword"), s.as_ref(), &target, &projector, 100).expect("dry run");
        assert_eq!(r.actions["payload"], 3, "{r:?}");
        assert_eq!(r.actions["text"], 0, "{r:?}");
        assert_eq!(r.actions["delete"], 1, "{r:?}");
        assert_eq!(r.samples["delete"], ["ctx://acc/docs/b"]);
        assert_eq!(index.count().expect("count"), records);

        // A limit below the backlog says so.
        let r = dry_run(&cfg("keyword"), s.as_ref(), &target, &projector, 1).expect("dry run");
        assert!(r.truncated && r.events == 1, "{r:?}");
    }

    #[test]
    fn a_vector_dry_run_counts_embeddings_without_a_model() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = store(dir.path());
        put(&s, "ctx://acc/docs/a", "alpha");
        let index = Arc::new(MemoryVectorIndex::new());
        let target = VectorTarget(index.clone());
        let r = dry_run(
            &cfg("vector"),
            s.as_ref(),
            &target,
            &IndexProjector::default(),
            100,
        )
        .expect("dry run");
        assert_eq!(r.actions["embed"], 3, "{r:?}");
        assert_eq!(index.count().expect("count"), 0);
        assert_eq!(index.model().expect("model"), None, "nothing was bound");
    }
}
