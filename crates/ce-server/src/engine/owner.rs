//! What a process may consume, and what its predecessors left behind.
//!
//! **Ownership of embedded consumers.** Deliveries are per consumer, not per data
//! directory: two data directories consuming `keyword` from one PostgreSQL store would each
//! take part of the queue into their own embedded index, and both indexes would miss records
//! while the outbox shows everything done. So the consumers whose index lives in the data
//! directory (keyword, relation, and vector with `index.vector.destination = "embedded"`;
//! each registration says, [`super::consumers::Registration::embedded`]) are owned by one index instance: the data directory's id ([`INSTANCE_FILE`]), recorded in
//! the store by the first instance to consume the consumer ([`ce_store::OwnerStore`]). Any
//! other instance is refused before it claims anything ([`ServerError::ConsumerOwned`]);
//! `ce reindex --consumer C --take-over` makes it the owner and rebuilds its index. A shared
//! destination (pgvector) has no owner: any number of processes consume it.
//!
//! **Claims of a crashed predecessor.** Every engine that runs a consumer's workers holds a
//! shared lock on `<data-dir>/workers/<consumer>.lock` ([`WorkerLock`]). On the embedded
//! store every claimer of the data directory's outbox runs on it, so an engine that gets the
//! lock exclusively first knows that no live worker holds a claim of that consumer: the
//! claims left are a crashed process's, and their leases are ended at once
//! ([`ce_store::OwnerStore::expire_claims`]) instead of after `index.worker.lease_seconds`.
//! On PostgreSQL, workers of other hosts may hold claims, so the lease rule stays.

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use ce_core::Config;
use ce_store::IndexOwner;
use tracing::{info, warn};

use super::consumers::is_embedded;
use crate::error::{Result, ServerError};
use crate::source::Source;

/// The data directory's index instance id (one line), created on first need.
pub const INSTANCE_FILE: &str = "index-instance";
/// The per-consumer worker locks, inside the data directory.
pub const WORKERS_DIR: &str = "workers";

fn io(context: String) -> impl FnOnce(std::io::Error) -> ServerError {
    move |source| ServerError::Io { context, source }
}

/// The data directory's instance id, created (race-free) when it has none.
fn instance_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(INSTANCE_FILE);
    let read = |p: &Path| -> Result<String> {
        let text = std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())))?;
        let id = text.trim();
        if id.is_empty() {
            return Err(ServerError::CorruptFile {
                path: p.display().to_string(),
                reason: "it is empty: delete it (this data directory becomes a new index instance)"
                    .into(),
            });
        }
        Ok(id.to_owned())
    };
    if path.exists() {
        return read(&path);
    }
    std::fs::create_dir_all(data_dir).map_err(io(format!("creating {}", data_dir.display())))?;
    let tmp = data_dir.join(format!("{INSTANCE_FILE}.{}.tmp", std::process::id()));
    let id = uuid::Uuid::now_v7().simple().to_string();
    std::fs::write(&tmp, format!("{id}\n")).map_err(io(format!("writing {}", tmp.display())))?;
    // A hard link fails when another process created the file first: its id wins.
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => read(&path),
        Err(e) => Err(io(format!("creating {}", path.display()))(e)),
    }
}

/// The host name for messages (`/proc/sys/kernel/hostname`, else `$HOSTNAME`).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown host".into())
}

/// Records this data directory's instance as the owner of `consumer` when its index is
/// embedded and nobody owns it (or `take_over`); another owner is
/// [`ServerError::ConsumerOwned`]. A consumer with a shared destination passes.
pub fn claim(
    store: &Source,
    config: &Config,
    data_dir: &Path,
    consumer: &str,
    take_over: bool,
) -> Result<()> {
    if !is_embedded(config, consumer) {
        return Ok(());
    }
    let me = IndexOwner {
        instance: instance_id(data_dir)?,
        host: host_name(),
        data_dir: std::path::absolute(data_dir)
            .unwrap_or_else(|_| data_dir.to_owned())
            .display()
            .to_string(),
        since_ms: 0,
    };
    let owner = store.claim_owner(consumer, &me, take_over)?;
    if owner.instance == me.instance {
        if take_over {
            info!(consumer, instance = %me.instance, "consumer taken over by this data directory");
        }
        return Ok(());
    }
    let age_seconds = (store.clock().now_ms() - owner.since_ms).max(0) / 1000;
    Err(ServerError::ConsumerOwned {
        consumer: consumer.to_owned(),
        owner: Box::new(owner),
        me: Box::new(me),
        age_seconds: u64::try_from(age_seconds).unwrap_or(0),
    })
}

/// A shared lock on one consumer's worker lock file, held while this engine may run the
/// consumer's workers (released when dropped).
#[derive(Debug)]
pub struct WorkerLock {
    _file: File,
}

/// Takes `consumer`'s worker lock. When no other process holds it and the store is the
/// embedded one, first ends the leases of the claims earlier processes left.
pub fn worker_lock(store: &Source, data_dir: &Path, consumer: &str) -> Result<WorkerLock> {
    let dir = data_dir.join(WORKERS_DIR);
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let path: PathBuf = dir.join(format!("{consumer}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(format!("opening {}", path.display())))?;
    if store.postgres().is_none() {
        match file.try_lock() {
            Ok(()) => match store.expire_claims(consumer) {
                Ok(0) => {}
                Ok(released) => {
                    info!(
                        consumer,
                        released, "claims left by an earlier process released"
                    )
                }
                Err(e) => {
                    warn!(consumer, error = %e, "claims of earlier processes not released (their leases expire)")
                }
            },
            // Another live process runs this consumer's workers: its claims are its own.
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io(format!("locking {}", path.display()))(e));
            }
        }
    }
    // From exclusive (or nothing) to shared: others may run the consumer's workers too.
    file.lock_shared()
        .map_err(io(format!("locking {}", path.display())))?;
    Ok(WorkerLock { _file: file })
}
