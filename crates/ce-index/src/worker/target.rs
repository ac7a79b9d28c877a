//! What the worker writes to: one index behind [`IndexTarget`]. The vector index is one
//! target ([`VectorTarget`]); the keyword index is another. The worker's pipeline (claim,
//! compact, read the source, project, versioned write, read-after-write, ack) is the same for
//! every target; only targets that [`IndexTarget::uses_vectors`] make it embed text.

use std::sync::Arc;

use ce_core::CtxUri;
use ce_embed::ModelIdentity;

use crate::Result;
use crate::keyword::KeywordIndex;
use crate::vector::{NodeWrite, StoredRecord, StoredVector, SyncOutcome, VectorIndex};

/// Which index a worker writes: it names the span, the latency histogram and the log
/// messages of the worker's batched writes, so each index is observed under its own name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// The vector index.
    Vector,
    /// The keyword index.
    Keyword,
    /// The relation index.
    Relation,
}

impl IndexKind {
    /// The index's name in log messages (`vector`, `keyword`, `relation`).
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Vector => "vector",
            IndexKind::Keyword => "keyword",
            IndexKind::Relation => "relation",
        }
    }

    /// The histogram of the latency of one batched write, in milliseconds.
    pub fn write_latency_metric(self) -> &'static str {
        match self {
            IndexKind::Vector => "index_vector_upsert_latency_ms",
            IndexKind::Keyword => "index_keyword_upsert_latency_ms",
            IndexKind::Relation => "index_relation_upsert_latency_ms",
        }
    }

    /// Enters the span of one batched write of `writes` nodes or owners (span names are
    /// static, hence one literal per index).
    pub(super) fn write_span(self, writes: usize) -> tracing::span::EnteredSpan {
        match self {
            IndexKind::Vector => tracing::info_span!("index.vector_write", writes),
            IndexKind::Keyword => tracing::info_span!("index.keyword_write", writes),
            IndexKind::Relation => tracing::info_span!("index.relation_write", writes),
        }
        .entered()
    }
}

/// An index kept in step with the source by an [`super::IndexWorker`].
pub trait IndexTarget: Send + Sync {
    /// Which index this is (names its writes in spans, metrics and logs).
    fn kind(&self) -> IndexKind;
    /// Whether records carry vectors: the worker then embeds changed text (and reuses the
    /// vectors of moved records); otherwise every [`crate::vector::NodeRecord::vector`] it
    /// writes is `None` and is ignored.
    fn uses_vectors(&self) -> bool;
    /// Binds the index to the embedder's model (vector targets; others accept any).
    fn bind_model(&self, model: &ModelIdentity) -> Result<()>;
    /// The stored records of the nodes `uris` ([`crate::vector::VectorIndex::get`]).
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>>;
    /// The stored vectors of the nodes `uris` with their records' text hashes (targets
    /// without vectors return none).
    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>>;
    /// Every stored record within `uri`.
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>>;
    /// The distinct URIs of the stored records within `uri`, in URI order (what a subtree
    /// sync visits; the indexes answer it without decoding records).
    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        Ok(crate::vector::uris_of(self.list_under(uri)?))
    }
    /// Versioned node writes (see [`VectorIndex::write_nodes`]).
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>>;
    /// Whether the worker should send every removal of a batch in one write, whatever
    /// `upsert_batch_size` (removals then do not count towards it): true for an index whose
    /// removals cost less together than apart.
    fn bulk_removals(&self) -> bool {
        false
    }
    /// The most records one write carries, given `index.vector.upsert_batch_size`
    /// (`configured`; a node's records are never split): the setting itself for most targets.
    fn write_records(&self, configured: usize) -> usize {
        configured
    }
    /// Ends a bulk load when the worker's queue is empty (see
    /// [`VectorIndex::finish_bulk`]); nothing for most targets.
    fn finish_bulk(&self) -> Result<()> {
        Ok(())
    }
    /// Whether `finish_bulk` may have something to do (cheap, no I/O).
    fn bulk_pending(&self) -> bool {
        false
    }
}

/// The vector index as a worker target.
pub struct VectorTarget(pub Arc<dyn VectorIndex>);

impl IndexTarget for VectorTarget {
    fn kind(&self) -> IndexKind {
        IndexKind::Vector
    }
    fn uses_vectors(&self) -> bool {
        true
    }
    fn bind_model(&self, model: &ModelIdentity) -> Result<()> {
        self.0.bind_model(model)
    }
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        self.0.get(uris)
    }
    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
        self.0.vectors(uris)
    }
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        self.0.list_under(uri)
    }
    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        self.0.uris_under(uri)
    }
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        self.0.write_nodes(writes)
    }
    fn finish_bulk(&self) -> Result<()> {
        self.0.finish_bulk()
    }
    fn bulk_pending(&self) -> bool {
        self.0.bulk_pending()
    }
}

/// The keyword index as a worker target (no vectors: nothing is embedded).
pub struct KeywordTarget(pub Arc<dyn KeywordIndex>);

impl IndexTarget for KeywordTarget {
    fn kind(&self) -> IndexKind {
        IndexKind::Keyword
    }
    fn uses_vectors(&self) -> bool {
        false
    }
    fn bind_model(&self, _model: &ModelIdentity) -> Result<()> {
        Ok(())
    }
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        self.0.get(uris)
    }
    fn vectors(&self, _uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
        Ok(Vec::new())
    }
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        self.0.list_under(uri)
    }
    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        self.0.uris_under(uri)
    }
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        self.0.write_nodes(writes)
    }
    /// The embedded keyword index applies the posting changes of a write in one pass, each
    /// affected block rewritten once, so a subtree's removals are cheapest as one write.
    fn bulk_removals(&self) -> bool {
        true
    }
    /// `KEYWORD_WRITE_RECORDS` (2,048), or more if configured: the vector index's batch size does
    /// not bound the keyword index's transactions.
    fn write_records(&self, configured: usize) -> usize {
        configured.max(KEYWORD_WRITE_RECORDS)
    }
}

/// The records one keyword write carries at least (a claimed batch of 100 single-node events
/// holds ~300). Each commit rewrites the blocks of every term its records touch (the frequent
/// terms' in every commit): a cold keyword drain of 10,000 documents took 2.5 s in chunks of
/// 128 records, 1.3–1.7 s with a claimed batch per transaction (docs/benchmarks.md).
const KEYWORD_WRITE_RECORDS: usize = 2048;
