//! ContextEngine's derived indexes and the worker that keeps them in step with the source of
//! truth through the outbox.
//!
//! - [`vector`]: the `VectorIndex` contract (spec §6) and its implementations
//! - [`keyword`]: the `KeywordIndex` contract (BM25, Chinese and English) and its
//!   implementations
//! - [`records`]: the version rule every versioned index obeys (invariant VX1) and the
//!   record rules shared by the implementations
//! - [`relation`]: the `RelationIndex` contract (spec §4.3, §6.2: typed edges by owner, with
//!   versioned replaces) and its implementations
//! - [`worker`]: `IndexWorker` (spec §5): claim → dispatch → read source → project → embed →
//!   write → ack
//! - [`repair`]: reconcile an index with the source (spec §8.3.2) and the delete-safety
//!   policy of derived deletions

pub mod error;
pub mod keyword;
pub mod records;
pub mod relation;
pub mod repair;
mod sqlite;
pub mod vector;
pub mod worker;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking over a poisoned lock: everything this crate guards with a mutex is
/// validated before it is mutated (or is a connection whose transaction rolls back on drop),
/// so a panic never leaves it half-written.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub use error::{IndexError, Result};
pub use vector::{PgVectorIndex, PgVectorOptions};
