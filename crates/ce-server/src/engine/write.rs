//! The write façade: every write commits to the source of truth (rm / mv / import under
//! their path locks, [`Guarded`]), then wakes the workers.

use std::path::Path;

use ce_core::{CtxUri, OutboxEvent, OutboxEventCreate};
use ce_store::{
    LinkRequest, PutRequest, WriteOutcome,
    layout::{ImportOptions, ImportReport},
};

use super::Engine;
use crate::error::Result;
use crate::guarded::Guarded;

impl Engine {
    fn woke<T>(&self, r: ce_store::Result<T>) -> Result<T> {
        let v = r?;
        self.wake.notify();
        Ok(v)
    }

    /// `ContextFs::put`, then a wake-up.
    pub fn put(&self, uri: &CtxUri, req: PutRequest) -> Result<WriteOutcome> {
        self.woke(self.store.put(uri, req))
    }

    /// The path locks of this engine's multi-step writes.
    pub fn locks(&self) -> &ce_lock::LockManager {
        &self.locks
    }

    pub(crate) fn guarded(&self) -> Guarded<'_> {
        Guarded {
            store: self.store.as_ref(),
            locks: &self.locks,
        }
    }

    /// `rm` under its path lock ([`Guarded::rm`]), then a wake-up.
    pub fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        let r = self.guarded().rm(uri, recursive, expect_version, trace_id);
        // A refused rm of a missing node still queued its index cleanup.
        self.wake.notify();
        r
    }

    /// `mv` under its path locks ([`Guarded::mv`]), then a wake-up.
    pub fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome> {
        let r = self.guarded().mv(from, to, trace_id)?;
        self.wake.notify();
        Ok(r)
    }

    /// `import` under its lifecycle lock ([`Guarded::import`]), then a wake-up.
    pub fn import(
        &self,
        dir: &Path,
        into: &CtxUri,
        options: ImportOptions,
    ) -> Result<(ImportReport, Option<String>)> {
        let r = self.guarded().import(dir, into, options)?;
        self.wake.notify();
        Ok(r)
    }

    /// `RelationStore::link`, then a wake-up.
    pub fn link(&self, req: LinkRequest) -> Result<WriteOutcome> {
        self.woke(self.store.link(req))
    }

    /// `RelationStore::unlink`, then a wake-up.
    pub fn unlink(
        &self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        self.woke(self.store.unlink(from, to, relation_type, trace_id))
    }

    /// `OutboxStore::append` (admin / repair), then a wake-up.
    pub fn append_event(&self, event: OutboxEventCreate) -> Result<OutboxEvent> {
        self.woke(self.store.append(event))
    }
}
