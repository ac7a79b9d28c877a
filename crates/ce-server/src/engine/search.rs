//! The search policy: which indexes a search reads (see `ce-retrieval` for how), with the
//! not-ready answers when the vector side cannot serve.

use ce_embed::Embedder;
use ce_retrieval::{
    Fusion, HierarchicalRequest, HierarchicalResponse, KeywordSide, RelatedRequest,
    RelatedResponse, RetrievalError, Retriever, SearchRequest, SearchResponse, VectorSide,
};

use super::Engine;
use super::consumers::{Consumer as _, KeywordConsumer, RelationConsumer, VectorConsumer};
use crate::error::Result;

impl Engine {
    /// Searches the indexes and hydrates the hits (see `ce-retrieval`). Without a mode the
    /// configured default runs (`retrieval.default_mode`; `auto`: hybrid when both the vector
    /// and keyword indexes serve, else the one that does). When the vector side is not ready,
    /// `auto` falls back to keyword search with a notice in the answer; a named mode that
    /// needs vectors gets the not-ready error. Keyword search works without the model.
    pub fn search(&self, req: &SearchRequest) -> Result<SearchResponse> {
        let readiness = self.readiness();
        let embedder = self.ready_embedder().ok().filter(|_| readiness.ready);
        let vector = embedder
            .as_deref()
            .zip(self.consumers.get::<VectorConsumer>())
            .map(|(e, v)| VectorSide {
                embedder: e as &dyn Embedder,
                index: v.index().as_ref(),
                consumer: v.registration().name,
            });
        let keyword = self
            .consumers
            .get::<KeywordConsumer>()
            .map(|k| KeywordSide {
                index: k.index().as_ref(),
                consumer: k.registration().name,
            });
        let why = readiness.reasons.join("; ");
        let retriever = Retriever {
            source: self.store.as_ref(),
            vector,
            keyword,
            fusion: Fusion::from_config(&self.config.retrieval),
            vector_unavailable: (vector.is_none() && self.configured(VectorConsumer::NAME))
                .then_some(why.as_str()),
        };
        match retriever.search(req) {
            Err(RetrievalError::VectorUnavailable { .. }) => Err(self.not_ready()),
            r => {
                let mut r = r?;
                // Deleted knowledge items are invisible at once, before their cleanup.
                self.kb_hide_deleting(&mut r.hits, |h| &h.uri)?;
                self.current_memories_first(r)
            }
        }
    }

    /// Moves superseded memories (docs/sessions.md) after every other hit, keeping each
    /// group's order: a superseded memory is still findable ("what was true before"), never
    /// ahead of its successor. Their status is read from the source in one batch, like the
    /// hydration (a memory superseded a moment ago is already ranked last).
    fn current_memories_first(&self, mut r: SearchResponse) -> Result<SearchResponse> {
        let memories: Vec<ce_core::CtxUri> = r
            .hits
            .iter()
            .filter(|h| h.context_type == ce_core::ContextType::Memory.as_str())
            .map(|h| h.uri.clone())
            .collect();
        if memories.is_empty() {
            return Ok(r);
        }
        let superseded: std::collections::BTreeSet<ce_core::CtxUri> = self
            .store
            .read_nodes(&memories)?
            .into_iter()
            .filter(|n| {
                n.meta.get(ce_session::layout::memory_meta::STATUS)
                    == Some(&serde_json::Value::from(
                        ce_session::layout::memory_meta::SUPERSEDED,
                    ))
            })
            .map(|n| n.uri)
            .collect();
        if !superseded.is_empty() {
            let (current, old): (Vec<_>, Vec<_>) = r
                .hits
                .into_iter()
                .partition(|h| !superseded.contains(&h.uri));
            r.hits = current.into_iter().chain(old).collect();
        }
        Ok(r)
    }

    /// Hierarchical search (see `ce_retrieval::hierarchical_search`); needs the vector side.
    pub fn hierarchical(&self, req: &HierarchicalRequest) -> Result<HierarchicalResponse> {
        if !self.readiness().ready {
            return Err(self.not_ready());
        }
        let embedder = self.ready_embedder()?;
        let vector = self
            .consumers
            .get::<VectorConsumer>()
            .ok_or_else(|| self.no_index(VectorConsumer::NAME))?;
        let side = VectorSide {
            embedder: embedder.as_ref(),
            index: vector.index().as_ref(),
            consumer: vector.registration().name,
        };
        let mut r = ce_retrieval::hierarchical_search(self.store.as_ref(), side, req)?;
        // As in flat search: deleted knowledge items are invisible at once.
        self.kb_hide_deleting(&mut r.hits, |h| &h.uri)?;
        Ok(r)
    }

    /// The edges of a node from the relation index, each checked against the source of
    /// truth (see `ce_retrieval::related`).
    pub fn related(&self, req: &RelatedRequest) -> Result<RelatedResponse> {
        let relations = self
            .consumers
            .get::<RelationConsumer>()
            .ok_or_else(|| self.no_index(RelationConsumer::NAME))?;
        Ok(ce_retrieval::related(
            self.store.as_ref(),
            relations.index().as_ref(),
            relations.registration().name,
            req,
        )?)
    }
}
