//! ContextEngine core model. No I/O: every other crate builds on these types.
//!
//! - [`uri`]: `ctx://` canonicalization and tree arithmetic (spec §2.1.1)
//! - [`hash`]: stable record ids and content hashes
//! - [`node`]: nodes, layers, levels, attributes, relation edges
//! - [`event`]: outbox events and delivery states (spec §2.3, §3)
//! - [`provenance`]: where a node's L0 and L1 came from (DESIGN.md §8)
//! - [`projector`]: the index projector (spec §4)
//! - [`config`]: configuration keys, defaults and ranges (spec §12)
//! - [`error`]: error codes and classification

pub mod clock;
pub mod config;
pub mod error;
pub mod event;
pub mod failpoint;
pub mod hash;
pub mod node;
pub mod parallel;
pub mod projector;
pub mod provenance;
pub mod racy;
pub mod safety;
pub mod text;
pub mod uri;

pub use clock::{Clock, ManualClock, Millis, SystemClock, rfc3339};
pub use config::{Config, RetrievalConfig};
pub use error::{Classify, CoreError, ErrorCode};
pub use event::{
    DeleteContextPayload, Delivery, DeliveryStatus, EVENT_VERSION, EventPayload, EventType,
    MoveContextPayload, OutboxEvent, OutboxEventCreate, RelationMode, UpsertContextPayload,
    UpsertReason, UpsertRelationPayload,
};
pub use hash::{sha256_hex, sha256_tagged, stable_hash};
pub use node::{
    ContextNode, ContextType, Layers, Level, Meta, NodeKind, OwnerSpace, PathDefaults, RelationEdge,
};
pub use projector::{
    IndexProjector, IndexRecord, LevelSource, MoveProjection, NodeProjection, ProjectionWarning,
    RelationIndexRecord,
};
pub use provenance::{Derivation, DeriveFailure, LayerOrigin, Provenance};
pub use uri::{CtxUri, UriError, canonicalize_uri};

/// Number of property-test cases: `default`, or `CE_PROPTEST_CASES` when set (soak runs).
#[doc(hidden)]
pub fn test_cases(default: u32) -> u32 {
    std::env::var("CE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
