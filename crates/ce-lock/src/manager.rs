//! The lock manager: waiting with jittered backoff, renewal every `expire / 3`, hand-off and
//! adopt. (To be written: helper brief "ce-lock core".)

/// Settings of a [`LockManager`].
#[derive(Debug, Clone)]
pub struct LockSettings;

/// Hands out leases.
#[derive(Debug, Clone)]
pub struct LockManager;

/// A held lease.
#[derive(Debug)]
pub struct Lease;

/// A serialisable reference to a handed-off lease.
#[derive(Debug, Clone)]
pub struct LeaseRef;
