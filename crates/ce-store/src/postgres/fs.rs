//! ContextFS on PostgreSQL (being ported from `sqlite/fs.rs`).

use ce_core::{ContextNode, CtxUri};

use super::PgStore;
use crate::error::Result;
use crate::model::{
    ContextFs, NodeStat, PutRequest, UriVersion, WriteFence, WriteOp, WriteOutcome,
};

impl ContextFs for PgStore {
    fn put(&self, _uri: &CtxUri, _req: PutRequest) -> Result<WriteOutcome> {
        unimplemented!()
    }
    fn rm(
        &self,
        _uri: &CtxUri,
        _recursive: bool,
        _expected: Option<u64>,
        _trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        unimplemented!()
    }
    fn mv(&self, _from: &CtxUri, _to: &CtxUri, _trace_id: Option<String>) -> Result<WriteOutcome> {
        unimplemented!()
    }
    fn apply_fenced(
        &self,
        _fences: &[WriteFence],
        _ops: Vec<WriteOp>,
    ) -> Result<Vec<WriteOutcome>> {
        unimplemented!()
    }
    fn purge_missing(&self, _uri: &CtxUri, _trace_id: Option<String>) -> Result<Option<String>> {
        unimplemented!()
    }
    fn read_node(&self, _uri: &CtxUri) -> Result<Option<ContextNode>> {
        unimplemented!()
    }
    fn read_nodes(&self, _uris: &[CtxUri]) -> Result<Vec<ContextNode>> {
        unimplemented!()
    }
    fn versions(&self, _uris: &[CtxUri]) -> Result<Vec<UriVersion>> {
        unimplemented!()
    }
    fn stat(&self, _uri: &CtxUri) -> Result<NodeStat> {
        unimplemented!()
    }
    fn ls(&self, _uri: &CtxUri) -> Result<Vec<NodeStat>> {
        unimplemented!()
    }
    fn tree(&self, _uri: &CtxUri, _depth: Option<u32>) -> Result<Vec<NodeStat>> {
        unimplemented!()
    }
    fn read_subtree(&self, _uri: &CtxUri) -> Result<Vec<ContextNode>> {
        unimplemented!()
    }
}
