//! Import and export in the on-disk node layout (spec §2.2).

use std::path::Path;

use ce_core::CtxUri;
use serde::Serialize;

use crate::SourceStore;
use crate::error::Result;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    /// Nodes created or changed.
    pub nodes_written: u64,
    /// Nodes already identical (no event).
    pub nodes_unchanged: u64,
    /// Relations created or changed.
    pub relations_written: u64,
    /// Events appended.
    pub events: u64,
    /// Files that are not part of the layout and were not imported, relative to the root.
    pub skipped: Vec<String>,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    /// Nodes exported.
    pub nodes: u64,
    /// Files written.
    pub files: u64,
}

/// Imports the node tree in `dir` so that `dir` itself becomes `into`, in one transaction.
pub fn import_dir(store: &dyn SourceStore, dir: &Path, into: &CtxUri) -> Result<ImportReport> {
    let _ = (store, dir, into);
    Ok(ImportReport::default())
}

/// Exports the subtree at `uri` into `dir` (created if missing; must be empty).
pub fn export_tree(store: &dyn SourceStore, uri: &CtxUri, dir: &Path) -> Result<ExportReport> {
    let _ = (store, uri, dir);
    Ok(ExportReport::default())
}
