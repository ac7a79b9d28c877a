//! Requests and answers of the store API, and the traits every backend implements.

use std::str::FromStr;

use ce_core::{
    ContextNode, ContextType, CoreError, CtxUri, Delivery, DeliveryStatus, ErrorCode, EventType,
    Level, Meta, Millis, NodeKind, OutboxEvent, OutboxEventCreate, OwnerSpace, RelationEdge,
};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

/// How `put` combines the request with an existing node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PutMode {
    /// The node becomes exactly the request: absent layers become empty, meta is replaced.
    #[default]
    Replace,
    /// Given layers and attributes overwrite, the rest is kept; meta keys are merged (a JSON
    /// `null` value removes a key).
    Merge,
    /// Given content is appended verbatim to the existing content; other fields merge.
    Append,
}

impl FromStr for PutMode {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s {
            "replace" => Ok(PutMode::Replace),
            "merge" => Ok(PutMode::Merge),
            "append" => Ok(PutMode::Append),
            _ => Err(CoreError::InvalidField {
                field: "mode",
                reason: format!("{s:?} is not one of replace, merge, append"),
            }),
        }
    }
}

/// A write of one node.
#[derive(Debug, Clone, Default)]
pub struct PutRequest {
    /// Combination mode.
    pub mode: PutMode,
    /// L0 text.
    pub abstract_text: Option<String>,
    /// L1 text.
    pub overview: Option<String>,
    /// L2 text.
    pub content: Option<String>,
    /// Context type (default: derived from the path).
    pub context_type: Option<ContextType>,
    /// Category (default: derived from the path).
    pub category: Option<String>,
    /// Owner space (default: derived from the path).
    pub owner_space: Option<OwnerSpace>,
    /// Metadata entries.
    pub meta: Meta,
    /// Optimistic concurrency: the version the caller last saw (0 = must not exist).
    pub expect_version: Option<u64>,
    /// Trace id (generated when absent).
    pub trace_id: Option<String>,
    /// Layers (L0, L1) whose client text is dropped so that they are derived again
    /// (`ce put --derive-abstract`); refused with text for the same layer.
    pub derive: Vec<Level>,
}

/// What a mutation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WriteOutcome {
    /// The node written, removed or moved (its new URI for a move).
    pub uri: CtxUri,
    /// Its version after the write (for rm: the version it had when removed).
    pub version: u64,
    /// Whether anything changed; an unchanged write appends no event.
    pub changed: bool,
    /// Ids of the events appended, in order.
    pub event_ids: Vec<String>,
    /// Number of nodes affected (ancestors created, subtree removed or moved).
    pub nodes_affected: u64,
    /// The trace id of the write.
    pub trace_id: String,
    /// Layers a put in replace mode emptied because the request did not give them (absent
    /// from JSON when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers_removed: Vec<Level>,
    /// The job a [`WriteOp::Enqueue`] or [`WriteOp::CompleteJob`] acted on (absent from JSON
    /// for node writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

/// What tells whether a stored node is still the one seen earlier: its version and the time
/// that version was written (an import's stat cache keeps it per node it read; a version
/// alone could repeat in a source restored from an older copy and written again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStamp {
    /// The node's version.
    pub version: u64,
    /// When that version was written.
    pub updated_at: Millis,
}

/// What the source knows about a URI's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum UriVersion {
    /// A node lives at the URI with this version.
    Live(u64),
    /// The node was removed (or moved away) at this version.
    Deleted(u64),
    /// Nothing was ever stored at the URI.
    Unknown,
}

/// A node without its text, plus sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeStat {
    /// URI.
    pub uri: CtxUri,
    /// Parent URI.
    pub parent_uri: CtxUri,
    /// Context type.
    pub context_type: ContextType,
    /// Category.
    pub category: String,
    /// Owner space.
    pub owner_space: OwnerSpace,
    /// Version.
    pub version: u64,
    /// Content hash.
    pub content_hash: String,
    /// Relation version.
    pub relation_version: u64,
    /// Byte sizes of L0, L1, L2.
    pub layer_bytes: [u64; 3],
    /// Number of direct children.
    pub children: u64,
    /// Account, container or leaf (derived from the URI and `children`, not stored).
    #[serde(default)]
    pub kind: NodeKind,
    /// Metadata.
    pub meta: Meta,
    /// Creation time.
    pub created_at_ms: Millis,
    /// Last change.
    pub updated_at_ms: Millis,
    /// Where L0 and L1 came from (docs/derive.md).
    #[serde(default)]
    pub provenance: ce_core::Provenance,
}

/// A node's edges in both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct Relations {
    /// Edges from the node.
    pub outgoing: Vec<RelationEdge>,
    /// Edges into the node.
    pub incoming: Vec<RelationEdge>,
}

/// A link request.
#[derive(Debug, Clone)]
pub struct LinkRequest {
    /// Source node (must exist).
    pub from: CtxUri,
    /// Target node (must exist).
    pub to: CtxUri,
    /// Relation type.
    pub relation_type: String,
    /// Weight (finite; 1.0 by default).
    pub weight: f64,
    /// Reason.
    pub reason: String,
    /// Trace id (generated when absent).
    pub trace_id: Option<String>,
}

/// One write of a batch applied in a single transaction ([`ContextFs::apply_batch`]).
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// A node write.
    Put {
        /// The node.
        uri: CtxUri,
        /// The write.
        req: PutRequest,
    },
    /// Replace the whole outgoing edge set of `from` (one `UPSERT_RELATION` if it changed).
    SetRelations {
        /// The owner node.
        from: CtxUri,
        /// The new edges (their `from` is ignored).
        edges: Vec<LinkRequest>,
        /// Trace id (generated when absent).
        trace_id: Option<String>,
    },
    /// [`ContextFs::rm`] as one op of a batch.
    Rm {
        /// The node (with its subtree when `recursive`).
        uri: CtxUri,
        /// Remove a node that has children, with them.
        recursive: bool,
        /// Refuse unless the node is at this version.
        expect_version: Option<u64>,
        /// Trace id (generated when absent).
        trace_id: Option<String>,
    },
    /// Records a [`Hold`]: `lease` (the lock layer's serialised hand-off reference, opaque
    /// here) is held until every consumer has applied the events of the batch up to this op
    /// (put it last). It supersedes an earlier hold on the same `at` (the writer took its
    /// lease over). Its outcome's `uri` is `at`, and `changed` says whether it was recorded.
    Hold {
        /// The hold's id.
        id: String,
        /// The subtree it protects (reporting only).
        at: CtxUri,
        /// The serialised lease reference.
        lease: String,
        /// Record it only when an earlier op of the batch appended events (a write that
        /// changed nothing has nothing to wait for).
        only_with_events: bool,
    },
    /// [`ContextFs::mv`] as one op of a batch.
    Mv {
        /// The source node (with its subtree).
        from: CtxUri,
        /// The target, which must not exist.
        to: CtxUri,
        /// Trace id (generated when absent).
        trace_id: Option<String>,
    },
    /// [`crate::JobStore::enqueue`] in the batch's transaction: the job exists if and only if
    /// the batch commits. Its outcome's `job_id` is the new job, or the non-terminal one
    /// holding the idempotency key (then `changed` is false); `uri` is the root.
    Enqueue(crate::jobs::JobSpec),
    /// A knowledge-base write ([`crate::kb::KbOp`]) in the batch's transaction: item rows,
    /// the nodes they own and the jobs that follow commit together. A failed check (e.g.
    /// the stale guard) fails the whole batch. Its outcome's `changed` says whether it
    /// changed anything; `uri` is the root.
    Kb(crate::kb::KbOp),
    /// [`crate::JobStore::complete`] in the batch's transaction, so a handler's source writes
    /// and the end of its job commit together: a claim that is no longer live fails the whole
    /// batch with its claim conflict, writing nothing. Its outcome's `job_id` is the job,
    /// `changed` false when it was completed already; `uri` is the root.
    CompleteJob {
        /// The handler's claim.
        claim: crate::jobs::JobClaim,
        /// The job's result, stored as its progress.
        result: Option<serde_json::Value>,
    },
}

impl WriteOp {
    /// The node a [`WriteOp::Put`] writes; `None` for every other op.
    pub fn put_uri(&self) -> Option<&CtxUri> {
        match self {
            WriteOp::Put { uri, .. } => Some(uri),
            _ => None,
        }
    }
}

/// A path lock's fencing token carried by a write made under the lock (docs/locks.md,
/// docs/store.md "Fencing"). The store keeps the newest token it has seen per path and, in
/// the write's own transaction, refuses a write whose token is older than one seen for the
/// path, an ancestor or a descendant: the lease it was taken under has been lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFence {
    /// The locked path.
    pub path: CtxUri,
    /// The grant's token.
    pub token: u64,
}

/// Proof of a claim: the fencing token that `mark_done` / `mark_failed` / `renew` check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claim {
    /// Consumer the delivery belongs to.
    pub consumer: String,
    /// Event sequence.
    pub seq: i64,
    /// Event id.
    pub event_id: String,
    /// Worker that claimed.
    pub worker_id: String,
    /// Token of this claim; a later claim of the same delivery gets another.
    pub token: String,
    /// Lease end.
    pub claimed_until_ms: Millis,
}

/// Why a claimed delivery failed ([`OutboxStore::mark_failed`]): the consumer's classified
/// error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure<'a> {
    /// The error's stable code, recorded as the delivery's `error_code`.
    pub code: ErrorCode,
    /// Whether a later attempt can succeed (spec §8.4): `retry_wait` with backoff, else
    /// `dead`.
    pub retryable: bool,
    /// What went wrong, recorded as its `last_error` (the first 4096 characters).
    pub message: &'a str,
}

/// An event handed to a worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimedEvent {
    /// The event.
    pub event: OutboxEvent,
    /// The claim to acknowledge with.
    pub claim: Claim,
    /// Failures so far.
    pub retry_count: u32,
}

/// Which deliveries `list` returns.
#[derive(Debug, Clone, Default)]
pub struct OutboxFilter {
    /// Only this status.
    pub status: Option<DeliveryStatus>,
    /// Only this consumer (default: every configured consumer).
    pub consumer: Option<String>,
    /// Only this event type.
    pub event_type: Option<EventType>,
    /// Only rows after this sequence (paging) ...
    pub after_seq: Option<i64>,
    /// ... or, when set, after `(after_seq, after_consumer)`: pass the last row's sequence
    /// and consumer to get the next page without skipping rows.
    pub after_consumer: Option<String>,
    /// At most this many rows (default 100; users may ask for up to [`MAX_LIST_LIMIT`]).
    pub limit: Option<u32>,
}

/// Most rows a user's `outbox list` may ask for (page with `after_seq` / `after_consumer`
/// for more).
pub const MAX_LIST_LIMIT: u32 = 10_000;

/// Checks a row limit asked by a user (`ce outbox list --limit`, `GET
/// /v1/outbox/list?limit=`): outside 1..=[`MAX_LIST_LIMIT`] is an `invalid_field` error. The
/// store itself takes any limit (internal callers page with their own).
pub fn check_list_limit(limit: Option<u32>) -> Result<()> {
    match limit {
        Some(limit) if !(1..=MAX_LIST_LIMIT).contains(&limit) => Err(CoreError::InvalidField {
            field: "limit",
            reason: format!(
                "{limit} is outside 1..={MAX_LIST_LIMIT} (page with after for more rows)"
            ),
        }
        .into()),
        _ => Ok(()),
    }
}

/// Which dead deliveries a repair acts on ([`OutboxStore::count_dead`],
/// [`OutboxStore::requeue_dead_matching`], [`OutboxStore::force_done`]): every set field must
/// match. Deliveries of consumers no longer configured are never touched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DeadFilter {
    /// Only this consumer.
    pub consumer: Option<String>,
    /// Only events of this type.
    pub event_type: Option<EventType>,
    /// Only events whose URI is this URI or lies below it (the root matches every event).
    pub subtree: Option<CtxUri>,
    /// Only deliveries whose recorded error code is this one.
    pub error_code: Option<String>,
    /// Only sequences at or above this one.
    pub min_seq: Option<i64>,
    /// Only sequences at or below this one.
    pub max_seq: Option<i64>,
    /// Only deliveries that died by exhausting `index.outbox.max_retries` (every failure
    /// classified retryable: a transient outage that outlasted the backoff), not those killed
    /// at once by a non-retryable error.
    pub exhausted_only: bool,
}

/// Dead deliveries counted or moved by a repair, per consumer (consumers with none are absent).
pub type DeadCounts = std::collections::BTreeMap<String, u64>;

/// The error code a forced delivery records ([`OutboxStore::force_done`]).
pub const FORCED_DONE_CODE: &str = "forced_done";

/// One row of `outbox list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeliveryRow {
    /// The event.
    pub event: OutboxEvent,
    /// Its delivery to one consumer.
    pub delivery: Delivery,
}

/// Delivery counts of one consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ConsumerStats {
    /// Consumer name.
    pub consumer: String,
    /// Deliveries per status (`failed` is always 0 at rest).
    pub pending: u64,
    /// Claimed deliveries.
    pub claimed: u64,
    /// Waiting to retry.
    pub retry_wait: u64,
    /// Done.
    pub done: u64,
    /// Dead.
    pub dead: u64,
    /// Lowest sequence not yet done or dead (the low watermark), if any.
    pub low_watermark_seq: Option<i64>,
    /// Append time of the oldest delivery not yet done or dead.
    pub oldest_pending_created_at_ms: Option<Millis>,
    /// The most recent failure among the deliveries not done (waiting, retrying or dead).
    #[serde(default)]
    pub last_error: Option<ConsumerError>,
}

/// Most deliveries [`OutboxStore::lag`] examines (the consumer's oldest not applied yet), so
/// that a large backlog costs a bounded read.
pub const LAG_SCAN_LIMIT: u64 = 1000;

/// How far one consumer is behind the journal ([`OutboxStore::lag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ConsumerLag {
    /// Deliveries not applied yet (pending, claimed or waiting to retry) within the scope,
    /// among the consumer's oldest [`LAG_SCAN_LIMIT`] + 1 such deliveries.
    pub events: u64,
    /// Whether the consumer has more than [`LAG_SCAN_LIMIT`] deliveries not applied yet (in
    /// any scope): `events` is then a lower bound.
    pub capped: bool,
    /// Age of the oldest of them (since its event was appended, by the store's clock), in
    /// milliseconds; `None` without lag.
    pub oldest_age_ms: Option<u64>,
}

/// A consumer's most recent failure (see [`ConsumerStats::last_error`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConsumerError {
    /// Sequence of the failed delivery.
    pub seq: i64,
    /// Its event.
    pub event_id: String,
    /// The error code recorded.
    pub code: String,
    /// The message recorded.
    pub message: String,
    /// When it was recorded.
    pub at_ms: Millis,
    /// Whether the delivery is dead (else it will be retried).
    pub dead: bool,
}

/// The source of truth for nodes (spec: ContextFS).
pub trait ContextFs: Send + Sync {
    /// Creates or changes a node; appends its events in the same transaction.
    fn put(&self, uri: &CtxUri, req: PutRequest) -> Result<WriteOutcome>;
    /// Removes a node (or its subtree); appends `DELETE_CONTEXT` in the same transaction.
    fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome>;
    /// Moves a node and its subtree; appends `MOVE_CONTEXT` in the same transaction.
    fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome>;
    /// Applies several writes atomically: all commit with their events, or none does.
    fn apply_batch(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteOutcome>> {
        self.apply_fenced(&[], ops)
    }
    /// Applies `ops` in one transaction after checking `fences` in it (see [`WriteFence`]):
    /// a stale token fails the whole batch with `LeaseLost` and writes nothing.
    fn apply_fenced(&self, fences: &[WriteFence], ops: Vec<WriteOp>) -> Result<Vec<WriteOutcome>>;
    /// For a URI the source does not hold: appends a recursive DELETE_CONTEXT so that index
    /// records left behind under it (a crash between steps, an index restored from an old
    /// snapshot) are removed (OpenViking #3064). Returns the event id; `None` when the node
    /// exists (an `rm` is what removes it).
    fn purge_missing(&self, uri: &CtxUri, trace_id: Option<String>) -> Result<Option<String>>;
    /// Reads a node, `None` when absent.
    fn read_node(&self, uri: &CtxUri) -> Result<Option<ContextNode>>;
    /// Reads several nodes in one snapshot (absent ones are skipped).
    fn read_nodes(&self, uris: &[CtxUri]) -> Result<Vec<ContextNode>>;
    /// The kind of the node at each URI, in order (one snapshot; see [`NodeKind::of`]).
    fn kinds(&self, uris: &[CtxUri]) -> Result<Vec<NodeKind>>;
    /// The version state of each URI, in order (one snapshot).
    fn versions(&self, uris: &[CtxUri]) -> Result<Vec<UriVersion>>;
    /// Stats a node.
    fn stat(&self, uri: &CtxUri) -> Result<NodeStat>;
    /// Lists the direct children of `uri` (the root lists accounts), by URI.
    fn ls(&self, uri: &CtxUri) -> Result<Vec<NodeStat>>;
    /// Lists `uri` and its descendants down to `depth` levels below it, in URI order.
    fn tree(&self, uri: &CtxUri, depth: Option<u32>) -> Result<Vec<NodeStat>>;
    /// Reads every node of a subtree (for export and reconcile), in URI order.
    fn read_subtree(&self, uri: &CtxUri) -> Result<Vec<ContextNode>>;
    /// The URIs of `uri` and its descendants, in URI order, without reading the nodes (what
    /// a delete-safety count or an import's prune needs).
    fn subtree_uris(&self, uri: &CtxUri) -> Result<Vec<CtxUri>>;
    /// [`ContextFs::subtree_uris`] with each node's [`NodeStamp`], in URI order.
    fn subtree_stamps(&self, uri: &CtxUri) -> Result<Vec<(CtxUri, NodeStamp)>>;
    /// The [`NodeStamp`] of the node at each URI, in order (`None` where there is none), in
    /// one snapshot.
    fn stamps(&self, uris: &[CtxUri]) -> Result<Vec<Option<NodeStamp>>>;
    /// [`ContextFs::subtree_uris`] of each URI, in order, in one snapshot (an index worker's
    /// batch of subtree operations reads them at once, not one transaction each).
    fn subtrees_uris(&self, uris: &[CtxUri]) -> Result<Vec<Vec<CtxUri>>>;
}

/// The source of truth for relations (spec: RelationStore).
pub trait RelationStore: Send + Sync {
    /// Adds or updates an edge; appends `UPSERT_RELATION` for `from` in the same transaction.
    fn link(&self, req: LinkRequest) -> Result<WriteOutcome>;
    /// Removes an edge; appends `UPSERT_RELATION` for `from` in the same transaction.
    fn unlink(
        &self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome>;
    /// Edges from and into `uri`.
    fn relations(&self, uri: &CtxUri) -> Result<Relations>;
    /// Edges from `uri` (spec `get_edges`).
    fn get_edges(&self, uri: &CtxUri) -> Result<Vec<RelationEdge>>;
}

/// The transactional outbox: a journal plus per-consumer delivery state (spec §3, §11.1).
///
/// Claims carry a fencing token: `mark_done`, `mark_failed` and `renew` succeed only for the
/// live claim that handed the event out. This is the spec's `mark_done(event_id)` with the
/// token check the spec leaves to the implementation (§3.4.2) made explicit in the type.
pub trait OutboxStore: Send + Sync {
    /// Appends one event (for repair and tools; writes append theirs themselves).
    fn append(&self, event: OutboxEventCreate) -> Result<OutboxEvent> {
        let mut v = self.append_batch(vec![event])?;
        v.pop()
            .ok_or_else(|| StoreError::Corrupt("append returned no event".into()))
    }
    /// Appends events in one transaction, with a delivery for every configured consumer.
    fn append_batch(&self, events: Vec<OutboxEventCreate>) -> Result<Vec<OutboxEvent>> {
        self.append_batch_for(&self.consumers(), events)
    }
    /// Appends events in one transaction with deliveries for `consumers` only (repair of one
    /// index, e.g. a rebuild, leaves the others' queues alone). Every name must be a
    /// configured consumer.
    fn append_batch_for(
        &self,
        consumers: &[String],
        events: Vec<OutboxEventCreate>,
    ) -> Result<Vec<OutboxEvent>>;
    /// Claims up to `limit` runnable deliveries of `consumer` in sequence order: pending or
    /// retry-wait ones that are visible, and claimed ones whose lease expired.
    fn claim_batch(
        &self,
        consumer: &str,
        worker_id: &str,
        limit: usize,
    ) -> Result<Vec<ClaimedEvent>>;
    /// Extends a live claim's lease; returns the new lease end.
    fn renew(&self, claim: &Claim) -> Result<Millis>;
    /// Marks a claimed delivery done; repeating it on a done delivery succeeds unchanged.
    fn mark_done(&self, claim: &Claim) -> Result<()>;
    /// Marks several claimed deliveries done in one transaction; each claim gets its own
    /// answer (a lost claim does not stop the others).
    fn mark_done_batch(&self, claims: &[Claim]) -> Result<Vec<Result<()>>>;
    /// Records a failure: `retry_wait` with backoff, or `dead` when not retryable or out of
    /// retries. Returns the new status.
    fn mark_failed(&self, claim: &Claim, failure: &Failure<'_>) -> Result<DeliveryStatus>;
    /// Puts dead deliveries back to pending with a fresh retry budget; returns how many.
    fn requeue_dead(&self, consumer: Option<&str>, seqs: Option<&[i64]>) -> Result<u64>;
    /// Counts the dead deliveries `filter` selects, per consumer (changes nothing).
    fn count_dead(&self, filter: &DeadFilter) -> Result<DeadCounts>;
    /// [`OutboxStore::requeue_dead`] for the dead deliveries `filter` selects, in one
    /// transaction: back to pending, visible now, with a fresh retry budget (the last error
    /// is kept for inspection). Returns how many per consumer.
    fn requeue_dead_matching(&self, filter: &DeadFilter) -> Result<DeadCounts>;
    /// Marks the dead deliveries `filter` selects done *without applying them* (spec §8.3.2
    /// `force_done`, after a human confirmed), in one transaction. Only `dead` deliveries
    /// move; each records [`FORCED_DONE_CODE`] as its error code and the error it died with
    /// in its last error, so `outbox show` tells it from an applied one. Returns how many
    /// per consumer.
    fn force_done(&self, filter: &DeadFilter) -> Result<DeadCounts>;
    /// Lists deliveries.
    fn list(&self, filter: &OutboxFilter) -> Result<Vec<DeliveryRow>>;
    /// An event with all its deliveries, by event id or sequence number.
    fn show(&self, event_id: &str) -> Result<(OutboxEvent, Vec<Delivery>)>;
    /// Counts per consumer. What runs periodically (lag samples, metrics' gauges, the
    /// console) may call it: every count but `done` comes from the partial indexes of the
    /// deliveries not applied yet and of the dead ones, and `done` is a maintained count
    /// (docs/store.md "Done counts"), so its cost follows the backlog, not the journal's
    /// history (counting done rows took ~1 s at 4 × 1,000,000 of them).
    fn stats(&self) -> Result<Vec<ConsumerStats>>;
    /// Whether any of `consumers` has a delivery pending or claimed — `pending + claimed > 0`
    /// of [`OutboxStore::stats`] (retry-wait deliveries are not counted), answered by one
    /// indexed probe per consumer instead of counting every delivery: the check a drain
    /// repeats while other workers hold claims.
    fn has_unfinished(&self, consumers: &[String]) -> Result<bool>;
    /// The deliveries of `consumer` not applied yet, of events on `within` or below it when
    /// given (an event counts by its `uri`): one query over the oldest [`LAG_SCAN_LIMIT`] + 1
    /// runnable deliveries (a partial index), never the consumer's history nor its whole
    /// backlog. An unconfigured consumer is [`StoreError::UnknownConsumer`].
    fn lag(&self, consumer: &str, within: Option<&CtxUri>) -> Result<ConsumerLag>;
    /// Prunes the journal (docs/store.md "Journal retention"): the done deliveries last
    /// changed more than `retain_ms` ago, then the events appended more than `retain_ms` ago
    /// that no delivery refers to any more — never a delivery still to apply or dead, never
    /// the newest event — in transactions of at most `chunk` rows each, until none is left.
    /// A consumer that later needs events pruned here (one added, or switched back on) is
    /// flagged for a rebuild from the source instead of a back-fill
    /// ([`OutboxStore::rebuilds_needed`]).
    fn prune_journal(&self, retain_ms: Millis, chunk: usize) -> Result<JournalPruned>;
    /// The journal's extent.
    fn journal(&self) -> Result<JournalExtent>;
    /// The consumers whose index must be rebuilt from the source because the journal no
    /// longer holds events they missed (recorded when the store opened), by name.
    fn rebuilds_needed(&self) -> Result<Vec<String>>;
    /// Records that `consumer`'s rebuild has appended its repair events: the flag is cleared
    /// (whether it was set).
    fn rebuild_queued(&self, consumer: &str) -> Result<bool>;
    /// The configured consumers.
    fn consumers(&self) -> Vec<String>;
}

/// What [`OutboxStore::prune_journal`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalPruned {
    /// Done deliveries deleted.
    pub deliveries: u64,
    /// Events deleted.
    pub events: u64,
}

/// The journal's extent ([`OutboxStore::journal`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct JournalExtent {
    /// Events held.
    pub events: u64,
    /// Deliveries held (every status).
    pub deliveries: u64,
    /// The oldest event's sequence (`None`: the journal is empty).
    pub oldest_seq: Option<i64>,
    /// The newest event's sequence.
    pub newest_seq: Option<i64>,
    /// The newest untargeted event pruned (0: none): a consumer that has not covered it
    /// can no longer be back-filled from the journal and is rebuilt from the source.
    pub pruned_through: i64,
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;

    use super::*;

    fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
        let json = serde_json::to_value(v).expect("serializes");
        assert_eq!(&serde_json::from_value::<T>(json).expect("decodes"), v);
    }

    #[test]
    fn answers_round_trip_through_json() {
        let uri = |s: &str| CtxUri::parse(s).expect("uri");
        round_trips(&WriteOutcome {
            uri: uri("ctx://a/users/u/memories/x"),
            version: 2,
            changed: true,
            event_ids: vec!["evt-1".into()],
            nodes_affected: 1,
            trace_id: "t".into(),
            layers_removed: vec![Level::L0, Level::L2],
            job_id: None,
        });
        round_trips(&WriteOutcome {
            uri: CtxUri::root(),
            version: 0,
            changed: true,
            event_ids: Vec::new(),
            nodes_affected: 0,
            trace_id: String::new(),
            layers_removed: Vec::new(),
            job_id: Some("job-1".into()),
        });
        round_trips(&NodeStat {
            uri: uri("ctx://a/users/u/memories/x"),
            parent_uri: uri("ctx://a/users/u/memories"),
            context_type: ContextType::Memory,
            category: "memories".into(),
            owner_space: OwnerSpace::User("u".into()),
            version: 2,
            content_hash: "h".into(),
            relation_version: 1,
            layer_bytes: [1, 2, 3],
            children: 0,
            kind: NodeKind::Leaf,
            meta: Meta::from([("k".to_owned(), serde_json::json!({"n": [1, null]}))]),
            created_at_ms: 1,
            updated_at_ms: 2,
            provenance: ce_core::Provenance {
                abstract_origin: ce_core::LayerOrigin::Pending,
                overview_origin: ce_core::LayerOrigin::User,
            },
        });
        round_trips(&Relations {
            outgoing: vec![RelationEdge {
                from_uri: uri("ctx://a/x"),
                to_uri: uri("ctx://a/y"),
                relation_type: "references".into(),
                weight: 0.5,
                reason: String::new(),
            }],
            incoming: Vec::new(),
        });
        round_trips(&ConsumerStats {
            consumer: "vector".into(),
            pending: 1,
            low_watermark_seq: Some(3),
            ..ConsumerStats::default()
        });
    }
}

/// A lease handed off to background work: held until the events of the write that recorded
/// it are applied (spec path-locks "add_resource": the lifecycle lock of an import).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The hold's id.
    pub id: String,
    /// The subtree it protects.
    pub at: CtxUri,
    /// The serialised lease reference (the lock layer's format).
    pub lease: String,
    /// The last journal sequence of the write: the hold ends once every served consumer has
    /// applied (or dead-lettered) everything up to it.
    pub through_seq: i64,
    /// When it was recorded.
    pub created_at_ms: Millis,
}

/// Leases held for background work ([`WriteOp::Hold`]).
pub trait HoldStore: Send + Sync {
    /// Open holds, oldest first.
    fn holds(&self) -> Result<Vec<Hold>>;
    /// The lowest sequence of a delivery of `consumers` not done or dead yet (`None`: every
    /// one is): one read answers [`HoldStore::applied_through`] for any number of sequences.
    fn first_open(&self, consumers: &[String]) -> Result<Option<i64>>;
    /// Whether every delivery of `consumers` with a sequence up to `seq` is done or dead.
    fn applied_through(&self, consumers: &[String], seq: i64) -> Result<bool> {
        Ok(self.first_open(consumers)?.is_none_or(|open| open > seq))
    }
    /// Ends a hold; false when it was already ended.
    fn end_hold(&self, id: &str) -> Result<bool>;
}

/// The index instance that applies a consumer's deliveries to an embedded (per data
/// directory) index: deliveries are per consumer, so a second instance consuming it would
/// take part of the queue into an index nobody searches (docs/indexing.md, "One index per
/// consumer").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexOwner {
    /// The instance's id, kept in its data directory (a new data directory is a new
    /// instance).
    pub instance: String,
    /// The host it ran on when it last claimed the consumer (for messages).
    pub host: String,
    /// Its data directory there (for messages).
    pub data_dir: String,
    /// When it first claimed the consumer.
    pub since_ms: Millis,
}

/// Ownership of consumers by index instances, and the claims a process's predecessors left.
pub trait OwnerStore: Send + Sync {
    /// Records `me` as the owner of `consumer` when it has none (or `take_over`), refreshing
    /// the host and data directory of an instance that already owns it; returns the owner
    /// recorded afterwards (someone else when refused).
    fn claim_owner(&self, consumer: &str, me: &IndexOwner, take_over: bool) -> Result<IndexOwner>;
    /// Ends the leases of every claim of `consumer` now, so the next claim takes them over
    /// at once; returns how many. Only for a caller that knows no live worker holds them
    /// (the claims of a crashed predecessor).
    fn expire_claims(&self, consumer: &str) -> Result<u64>;
}
