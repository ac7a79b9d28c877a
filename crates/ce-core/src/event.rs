//! Outbox events (spec §2.3, §3.1) and delivery states (spec §3.2).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::error::CoreError;
use crate::uri::CtxUri;

/// The payload schema version written into every event.
pub const EVENT_VERSION: u32 = 1;

/// The four event types of spec §2.5.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum EventType {
    /// A node was created or changed.
    #[serde(rename = "UPSERT_CONTEXT")]
    UpsertContext,
    /// A node (or subtree) was removed.
    #[serde(rename = "DELETE_CONTEXT")]
    DeleteContext,
    /// A node (or subtree) was moved.
    #[serde(rename = "MOVE_CONTEXT")]
    MoveContext,
    /// A node's outgoing relations changed.
    #[serde(rename = "UPSERT_RELATION")]
    UpsertRelation,
}

impl EventType {
    /// The wire name, e.g. `UPSERT_CONTEXT`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::UpsertContext => "UPSERT_CONTEXT",
            EventType::DeleteContext => "DELETE_CONTEXT",
            EventType::MoveContext => "MOVE_CONTEXT",
            EventType::UpsertRelation => "UPSERT_RELATION",
        }
    }
}

impl FromStr for EventType {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s {
            "UPSERT_CONTEXT" => Ok(EventType::UpsertContext),
            "DELETE_CONTEXT" => Ok(EventType::DeleteContext),
            "MOVE_CONTEXT" => Ok(EventType::MoveContext),
            "UPSERT_RELATION" => Ok(EventType::UpsertRelation),
            other => Err(CoreError::UnknownEventType {
                found: other.to_owned(),
            }),
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a node was upserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpsertReason {
    /// The node did not exist.
    Create,
    /// The node's layers and attributes were replaced.
    Replace,
    /// Given fields were merged into the node.
    Merge,
    /// Text was appended to the node's content.
    Append,
    /// Re-emitted by repair or reconcile.
    Repair,
    /// The `derive` consumer wrote the node's derived L0 / L1.
    Derived,
}

/// `UPSERT_CONTEXT` payload (spec §3.1.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertContextPayload {
    /// Always [`EVENT_VERSION`].
    pub event_version: u32,
    /// The node.
    pub uri: CtxUri,
    /// The node version this event announces.
    pub expected_node_version: u64,
    /// Why.
    pub reason: UpsertReason,
    /// Trace id of the write.
    pub trace_id: String,
}

/// `DELETE_CONTEXT` payload (spec §3.1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteContextPayload {
    /// Always [`EVENT_VERSION`].
    pub event_version: u32,
    /// The removed node (root of the removed subtree when recursive).
    pub uri: CtxUri,
    /// The version the node had when it was removed.
    pub expected_deleted_version: u64,
    /// Whether the whole subtree went.
    pub recursive: bool,
    /// Trace id of the write.
    pub trace_id: String,
}

/// `MOVE_CONTEXT` payload (spec §3.1.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveContextPayload {
    /// Always [`EVENT_VERSION`].
    pub event_version: u32,
    /// Old URI of the moved root.
    pub from_uri: CtxUri,
    /// New URI of the moved root.
    pub to_uri: CtxUri,
    /// Whether descendants moved too (always true: a move takes the subtree).
    pub recursive: bool,
    /// Parent of `from_uri`.
    pub old_parent_uri: CtxUri,
    /// Parent of `to_uri`.
    pub new_parent_uri: CtxUri,
    /// Trace id of the write.
    pub trace_id: String,
}

/// `UPSERT_RELATION` payload (spec §3.1.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertRelationPayload {
    /// Always [`EVENT_VERSION`].
    pub event_version: u32,
    /// The node whose outgoing relations changed.
    pub uri: CtxUri,
    /// The node's relation version after the change.
    pub relation_version: u64,
    /// Always `replace`: consumers replace the node's whole edge set.
    pub mode: RelationMode,
    /// Trace id of the write.
    pub trace_id: String,
}

/// How a relation event applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RelationMode {
    /// The edge set replaces the indexed one.
    Replace,
}

/// A typed event payload.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum EventPayload {
    /// `UPSERT_CONTEXT`.
    UpsertContext(UpsertContextPayload),
    /// `DELETE_CONTEXT`.
    DeleteContext(DeleteContextPayload),
    /// `MOVE_CONTEXT`.
    MoveContext(MoveContextPayload),
    /// `UPSERT_RELATION`.
    UpsertRelation(UpsertRelationPayload),
}

impl EventPayload {
    /// The event type this payload belongs to.
    pub fn event_type(&self) -> EventType {
        match self {
            EventPayload::UpsertContext(_) => EventType::UpsertContext,
            EventPayload::DeleteContext(_) => EventType::DeleteContext,
            EventPayload::MoveContext(_) => EventType::MoveContext,
            EventPayload::UpsertRelation(_) => EventType::UpsertRelation,
        }
    }

    /// The URI the event is about (`from_uri` for a move).
    pub fn uri(&self) -> &CtxUri {
        match self {
            EventPayload::UpsertContext(p) => &p.uri,
            EventPayload::DeleteContext(p) => &p.uri,
            EventPayload::MoveContext(p) => &p.from_uri,
            EventPayload::UpsertRelation(p) => &p.uri,
        }
    }

    /// The trace id.
    pub fn trace_id(&self) -> &str {
        match self {
            EventPayload::UpsertContext(p) => &p.trace_id,
            EventPayload::DeleteContext(p) => &p.trace_id,
            EventPayload::MoveContext(p) => &p.trace_id,
            EventPayload::UpsertRelation(p) => &p.trace_id,
        }
    }

    /// Parses and validates a payload of a named type (for events that come from outside:
    /// the CLI, HTTP, or a stored row).
    pub fn parse(event_type: &str, payload: &serde_json::Value) -> Result<Self, CoreError> {
        let t: EventType = event_type.parse()?;
        let bad = |e: serde_json::Error| CoreError::InvalidPayload {
            event_type: t.as_str(),
            reason: e.to_string(),
        };
        // serde's derived structs would also take an array of the fields in order.
        if !payload.is_object() {
            return Err(CoreError::InvalidPayload {
                event_type: t.as_str(),
                reason: "the payload must be a JSON object".into(),
            });
        }
        let p = match t {
            EventType::UpsertContext => {
                EventPayload::UpsertContext(serde_json::from_value(payload.clone()).map_err(bad)?)
            }
            EventType::DeleteContext => {
                EventPayload::DeleteContext(serde_json::from_value(payload.clone()).map_err(bad)?)
            }
            EventType::MoveContext => {
                EventPayload::MoveContext(serde_json::from_value(payload.clone()).map_err(bad)?)
            }
            EventType::UpsertRelation => {
                EventPayload::UpsertRelation(serde_json::from_value(payload.clone()).map_err(bad)?)
            }
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks what the types cannot: the event version, a non-root URI, and that a move's
    /// parents are the parents of its ends.
    pub fn validate(&self) -> Result<(), CoreError> {
        let t = self.event_type().as_str();
        let bad = |reason: String| CoreError::InvalidPayload {
            event_type: t,
            reason,
        };
        let version = match self {
            EventPayload::UpsertContext(p) => p.event_version,
            EventPayload::DeleteContext(p) => p.event_version,
            EventPayload::MoveContext(p) => p.event_version,
            EventPayload::UpsertRelation(p) => p.event_version,
        };
        if version != EVENT_VERSION {
            return Err(bad(format!(
                "event_version {version} is not supported (expected 1)"
            )));
        }
        if self.uri().is_root() {
            return Err(bad("uri must not be the root ctx://".into()));
        }
        if let EventPayload::MoveContext(p) = self {
            let parents_ok = p.from_uri.parent().as_ref() == Some(&p.old_parent_uri)
                && p.to_uri.parent().as_ref() == Some(&p.new_parent_uri);
            if p.to_uri.is_root() || !parents_ok {
                return Err(bad("old/new parent must be the parents of from/to".into()));
            }
        }
        Ok(())
    }
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEventCreate {
    /// The typed payload (its type is the event type).
    pub payload: EventPayload,
}

/// An event of the journal. In JSON the payload is an object of its event type's schema; it
/// is decoded and validated by `event_type` ([`EventPayload::parse`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "OutboxEventJson")]
pub struct OutboxEvent {
    /// Global, gap-tolerant, strictly increasing sequence.
    pub seq: i64,
    /// Unique id (`evt-` + UUIDv7).
    pub event_id: String,
    /// The event type.
    pub event_type: EventType,
    /// The URI the event is about.
    pub uri: CtxUri,
    /// The payload.
    pub payload: EventPayload,
    /// Append time.
    pub created_at_ms: Millis,
}

/// [`OutboxEvent`] as it is read from JSON, before its payload is decoded by its type.
#[derive(Deserialize, schemars::JsonSchema)]
struct OutboxEventJson {
    seq: i64,
    event_id: String,
    event_type: EventType,
    uri: CtxUri,
    payload: serde_json::Value,
    created_at_ms: Millis,
}

impl TryFrom<OutboxEventJson> for OutboxEvent {
    type Error = CoreError;
    fn try_from(e: OutboxEventJson) -> Result<Self, CoreError> {
        Ok(OutboxEvent {
            payload: EventPayload::parse(e.event_type.as_str(), &e.payload)?,
            seq: e.seq,
            event_id: e.event_id,
            event_type: e.event_type,
            uri: e.uri,
            created_at_ms: e.created_at_ms,
        })
    }
}

/// Delivery status of one event for one consumer (spec §3.2).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Waiting to be claimed.
    Pending,
    /// Held by a worker's lease.
    Claimed,
    /// Failed; claimable again at `next_visible_at`.
    RetryWait,
    /// Applied (terminal).
    Done,
    /// Transient: a failure being classified. The store moves `failed` to `retry_wait` or
    /// `dead` in the same transaction, so it is never observed at rest.
    Failed,
    /// Gave up: out of retries or not retryable (terminal until repair).
    Dead,
}

impl DeliveryStatus {
    /// All statuses.
    pub const ALL: [DeliveryStatus; 6] = [
        DeliveryStatus::Pending,
        DeliveryStatus::Claimed,
        DeliveryStatus::RetryWait,
        DeliveryStatus::Done,
        DeliveryStatus::Failed,
        DeliveryStatus::Dead,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Claimed => "claimed",
            DeliveryStatus::RetryWait => "retry_wait",
            DeliveryStatus::Done => "done",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Dead => "dead",
        }
    }

    /// The integer stored in the database.
    pub fn as_i64(self) -> i64 {
        match self {
            DeliveryStatus::Pending => 0,
            DeliveryStatus::Claimed => 1,
            DeliveryStatus::RetryWait => 2,
            DeliveryStatus::Done => 3,
            DeliveryStatus::Failed => 4,
            DeliveryStatus::Dead => 5,
        }
    }

    /// Decodes [`DeliveryStatus::as_i64`].
    pub fn from_i64(v: i64) -> Option<Self> {
        DeliveryStatus::ALL.into_iter().find(|s| s.as_i64() == v)
    }

    /// Whether no worker will touch the delivery again without repair.
    pub fn is_terminal(self) -> bool {
        matches!(self, DeliveryStatus::Done | DeliveryStatus::Dead)
    }
}

impl FromStr for DeliveryStatus {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        DeliveryStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| CoreError::InvalidField {
                field: "status",
                reason: format!(
                    "{s:?} is not one of pending, claimed, retry_wait, done, failed, dead"
                ),
            })
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The delivery state of one event for one consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Delivery {
    /// Consumer name.
    pub consumer: String,
    /// Event sequence.
    pub seq: i64,
    /// Status.
    pub status: DeliveryStatus,
    /// Retries scheduled so far: retryable failures that led to `retry_wait` (never above
    /// `max_retries`; the failure that sends a delivery to `dead` does not count).
    pub retry_count: u32,
    /// When a `pending` / `retry_wait` delivery becomes claimable.
    pub next_visible_at_ms: Option<Millis>,
    /// Worker holding (or last holding) the claim.
    pub claimed_by: Option<String>,
    /// Token of the current (or last) claim.
    pub claim_token: Option<String>,
    /// Lease end of the current claim.
    pub claimed_until_ms: Option<Millis>,
    /// Last failure message.
    pub last_error: Option<String>,
    /// Last failure code.
    pub error_code: Option<String>,
    /// Last change.
    pub updated_at_ms: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_payload_is_an_object_not_an_array_of_its_fields() {
        let e = EventPayload::parse("DELETE_CONTEXT", &json!([1, "ctx://a/b", 3, true, "t"]))
            .expect_err("array");
        assert!(e.to_string().contains("must be a JSON object"), "{e}");
    }

    #[test]
    fn parses_spec_payloads() {
        let p = EventPayload::parse(
            "UPSERT_CONTEXT",
            &json!({"event_version": 1, "uri": "ctx://acc1/users/u1/memories/preferences/theme",
                    "expected_node_version": 12, "reason": "merge", "trace_id": "t-001"}),
        )
        .expect("valid");
        assert_eq!(p.event_type(), EventType::UpsertContext);
        let p = EventPayload::parse(
            "MOVE_CONTEXT",
            &json!({"event_version": 1, "from_uri": "ctx://a/users/u/memories/entities/project-x",
                    "to_uri": "ctx://a/users/u/memories/entities/project-y", "recursive": true,
                    "old_parent_uri": "ctx://a/users/u/memories/entities",
                    "new_parent_uri": "ctx://a/users/u/memories/entities", "trace_id": "x"}),
        )
        .expect("valid");
        let round = serde_json::to_value(&p).expect("serializes");
        assert_eq!(
            EventPayload::parse("MOVE_CONTEXT", &round).expect("round trip"),
            p
        );
    }

    #[test]
    fn rejects_bad_events() {
        assert!(matches!(
            EventPayload::parse("FROB", &json!({})),
            Err(CoreError::UnknownEventType { .. })
        ));
        let missing = EventPayload::parse(
            "DELETE_CONTEXT",
            &json!({"event_version": 1, "uri": "ctx://a/b"}),
        );
        assert!(
            matches!(missing, Err(CoreError::InvalidPayload { .. })),
            "{missing:?}"
        );
        let bad_uri = EventPayload::parse(
            "UPSERT_RELATION",
            &json!({"event_version": 1, "uri": "http://x", "relation_version": 1, "mode": "replace", "trace_id": ""}),
        );
        assert!(matches!(bad_uri, Err(CoreError::InvalidPayload { .. })));
        let bad_parent = EventPayload::parse(
            "MOVE_CONTEXT",
            &json!({"event_version": 1, "from_uri": "ctx://a/x", "to_uri": "ctx://a/y/z", "recursive": true,
                    "old_parent_uri": "ctx://a", "new_parent_uri": "ctx://a", "trace_id": ""}),
        );
        assert!(matches!(bad_parent, Err(CoreError::InvalidPayload { .. })));
    }

    #[test]
    fn status_codes_round_trip() {
        for s in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::from_i64(s.as_i64()), Some(s));
            assert_eq!(s.as_str().parse::<DeliveryStatus>().ok(), Some(s));
        }
        assert!("claimedx".parse::<DeliveryStatus>().is_err());
    }

    #[test]
    fn events_and_deliveries_round_trip_through_json() {
        let payload = EventPayload::parse(
            "DELETE_CONTEXT",
            &json!({"event_version": 1, "uri": "ctx://a/users/u/memories/x",
                    "expected_deleted_version": 3, "recursive": false, "trace_id": "t"}),
        )
        .expect("valid");
        let event = OutboxEvent {
            seq: 7,
            event_id: "evt-1".into(),
            event_type: EventType::DeleteContext,
            uri: payload.uri().clone(),
            payload,
            created_at_ms: 1_773_482_400_123,
        };
        let json = serde_json::to_value(&event).expect("serializes");
        assert_eq!(json["payload"]["expected_deleted_version"], 3);
        assert_eq!(
            serde_json::from_value::<OutboxEvent>(json.clone()).expect("decodes"),
            event
        );
        // The payload is decoded by the event type, and validated.
        let mut wrong_type = json.clone();
        wrong_type["event_type"] = json!("UPSERT_CONTEXT");
        assert!(serde_json::from_value::<OutboxEvent>(wrong_type).is_err());
        let mut bad_version = json;
        bad_version["payload"]["event_version"] = json!(2);
        assert!(serde_json::from_value::<OutboxEvent>(bad_version).is_err());

        let delivery = Delivery {
            consumer: "vector".into(),
            seq: 7,
            status: DeliveryStatus::RetryWait,
            retry_count: 1,
            next_visible_at_ms: Some(5),
            claimed_by: Some("w1".into()),
            claim_token: None,
            claimed_until_ms: None,
            last_error: Some("timeout".into()),
            error_code: Some("embed_timeout".into()),
            updated_at_ms: 4,
        };
        let json = serde_json::to_value(&delivery).expect("serializes");
        assert_eq!(json["status"], "retry_wait");
        assert_eq!(
            serde_json::from_value::<Delivery>(json).expect("decodes"),
            delivery
        );
    }
}
