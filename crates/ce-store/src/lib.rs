//! ContextEngine's source of truth: nodes (ContextFS), relations (RelationStore) and the
//! transactional outbox (OutboxStore).
//!
//! Every mutation writes its rows and appends its outbox events in one transaction
//! (DESIGN.md decision 1): there is no commit without its event and no event without its
//! commit. Indexes read from here; nothing here calls an index.
//!
//! - [`model`]: requests, answers and the backend traits
//! - [`jobs`]: durable workflow jobs (the same queue rules as the outbox, `queue.rs`)
//! - [`kb`]: knowledge bases and their items (the ingestion workflow's durable rows)
//! - [`plan`]: pure write planning shared by backends (merge rules, versions, moves)
//! - [`sqlite`]: the embedded backend (SQLite, WAL)
//! - [`postgres`]: the scale backend (PostgreSQL), same schema semantics
//! - [`layout`]: import / export in the on-disk node layout (spec §2.2)

pub mod derive;
pub mod error;
pub mod jobs;
pub mod kb;
pub mod layout;
pub mod model;
mod outbox;
pub mod plan;
pub mod postgres;
mod queue;
mod shared;
pub mod sqlite;
mod txn;

pub use derive::DeriveStore;
pub use error::{Result, StoreError};
pub use jobs::{
    ClaimedJob, Enqueued, Heartbeat, Job, JobClaim, JobCount, JobFailure, JobFilter, JobSpec,
    JobState, JobStore, MAX_IDEMPOTENCY_KEY_CHARS, MAX_JOB_PAYLOAD_BYTES, TypeSlots,
};
pub use kb::{
    BaseStatus, ItemError, ItemKind, ItemStatus, KbFailure, KbItem, KbOp, KbOverview, KbStore,
    KnowledgeBase,
};
pub use model::LAG_SCAN_LIMIT;
pub use model::{
    Claim, ClaimedEvent, ConsumerError, ConsumerLag, ConsumerStats, ContextFs, DeliveryRow,
    Failure, Hold, HoldStore, IndexOwner, LinkRequest, MAX_LIST_LIMIT, NodeStamp, NodeStat,
    OutboxFilter, OutboxStore, OwnerStore, PutMode, PutRequest, RelationStore, Relations,
    UriVersion, WriteFence, WriteOp, WriteOutcome, check_list_limit,
};
pub use sqlite::SqliteStore;

/// Everything a backend provides: one transactional store for nodes, relations, outbox and
/// jobs.
pub trait SourceStore:
    ContextFs + RelationStore + OutboxStore + HoldStore + OwnerStore + JobStore + DeriveStore + KbStore
{
}

impl<
    T: ContextFs
        + RelationStore
        + OutboxStore
        + HoldStore
        + OwnerStore
        + JobStore
        + DeriveStore
        + KbStore,
> SourceStore for T
{
}
