//! RelationStore on PostgreSQL (being ported from `sqlite/relations.rs`).

use ce_core::{CtxUri, RelationEdge};

use super::PgStore;
use crate::error::Result;
use crate::model::{LinkRequest, RelationStore, Relations, WriteOutcome};

impl RelationStore for PgStore {
    fn link(&self, _req: LinkRequest) -> Result<WriteOutcome> {
        unimplemented!()
    }
    fn unlink(
        &self,
        _from: &CtxUri,
        _to: &CtxUri,
        _relation_type: &str,
        _trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        unimplemented!()
    }
    fn relations(&self, _uri: &CtxUri) -> Result<Relations> {
        unimplemented!()
    }
    fn get_edges(&self, _uri: &CtxUri) -> Result<Vec<RelationEdge>> {
        unimplemented!()
    }
}
