//! The `derive` consumer's operations (docs/derive.md): from a batch of outbox events to
//! fenced write-backs of derived layers.
//!
//! 1. [`DeriveHandler::compact`]: an event names the nodes whose inputs it may have changed —
//!    an upsert its node and that node's parent, a delete the removed root's parent, a move
//!    both parents and the moved subtree.
//! 2. [`DeriveHandler::apply`]: of those, the ones with an open dirty key are read (node,
//!    children, key, in one snapshot each), deepest first, so a folder whose children are
//!    derived in the same batch is rolled up once, from their new abstracts. A folder with a
//!    child whose L0 is still pending waits: that child's write-back dirties it again.
//! 3. An input whose hash equals the stored one needs no generator call; the others go to
//!    the generator in batches, and every result goes back in one store transaction that
//!    re-checks the coalesce and node versions ([`ce_store::DeriveStore::write_derived`]).
//!
//! A retryable generator failure fails only the events that needed that node (they retry;
//! a rate limit pauses the worker). A permanent one (a refusal, an unusable answer) falls
//! back to the extractive generator for that node, and is counted and reported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ce_core::{
    Classify, Clock, ContextType, CtxUri, Derivation, DeriveFailure, EventPayload, IndexProjector,
    Level,
};
use ce_index::worker::compact::{self, Op, Plan};
use ce_index::worker::dry_run::{DryRunReport, SpendEstimate};
use ce_index::worker::{OpHandler, OpOutcomes, WorkError};
use ce_store::derive::{
    DeriveChild, DeriveSnapshot, DerivedOutcome, DerivedWrite, LayerWrite, LeafLayers,
    WaitingFolders,
};
use ce_store::{ClaimedEvent, SourceStore};
use serde::{Deserialize, Serialize};

use crate::{Budget, Child, DeriveError, DeriveInput, Derived, Extractive, Generator};

/// Dirty nodes a dry run reads per snapshot.
const DRY_RUN_READ: usize = 256;

/// Settings of the handler.
#[derive(Debug, Clone)]
pub struct DeriveSettings {
    /// Length limits of derived layers.
    pub budget: Budget,
    /// Nodes per generator call.
    pub batch_size: usize,
    /// Timeout of one generator call.
    pub timeout: Duration,
    /// Tokens the generator may spend per UTC day (0: unlimited).
    pub max_tokens_per_day: u64,
    /// The context types that are derived.
    pub types: Vec<ContextType>,
}

/// Counters since the handler started (status and metrics).
#[derive(Debug, Default, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
pub struct DeriveCounters {
    /// Write-backs that rewrote a node.
    pub written: u64,
    /// Write-backs that found the node already as derived (or an unchanged input).
    pub unchanged: u64,
    /// Write-backs discarded because newer inputs were committed meanwhile.
    pub discarded: u64,
    /// Folders left for later because a child's L0 was still pending.
    pub deferred: u64,
    /// Generator calls.
    pub generator_calls: u64,
    /// Nodes the configured generator refused for good (the extractive result was kept).
    pub refused: u64,
    /// Nodes derived by the extractive fallback because the day's token budget was spent.
    pub over_budget: u64,
}

impl DeriveCounters {
    fn add(&mut self, o: &DeriveCounters) {
        self.written += o.written;
        self.unchanged += o.unchanged;
        self.discarded += o.discarded;
        self.deferred += o.deferred;
        self.generator_calls += o.generator_calls;
        self.refused += o.refused;
        self.over_budget += o.over_budget;
    }
}

/// The `derive` consumer's [`OpHandler`].
pub struct DeriveHandler {
    store: Arc<dyn SourceStore>,
    generator: Arc<dyn Generator>,
    fallback: Extractive,
    settings: DeriveSettings,
    projector: IndexProjector,
    clock: Arc<dyn Clock>,
    counters: Mutex<DeriveCounters>,
    last_refusal: Mutex<Option<String>>,
}

impl DeriveHandler {
    /// A handler deriving with `generator` into `store`.
    pub fn new(
        store: Arc<dyn SourceStore>,
        generator: Arc<dyn Generator>,
        settings: DeriveSettings,
        projector: IndexProjector,
        clock: Arc<dyn Clock>,
    ) -> Self {
        DeriveHandler {
            store,
            generator,
            fallback: Extractive::default(),
            settings,
            projector,
            clock,
            counters: Mutex::new(DeriveCounters::default()),
            last_refusal: Mutex::new(None),
        }
    }

    /// The configured generator.
    pub fn generator(&self) -> &Arc<dyn Generator> {
        &self.generator
    }

    /// What the handler did since it started.
    pub fn counters(&self) -> DeriveCounters {
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last permanent refusal of the configured generator, if any.
    pub fn last_refusal(&self) -> Option<String> {
        self.last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the day's token budget is spent (the configured generator then rests).
    pub fn over_budget(&self) -> Result<bool, WorkError> {
        let max = self.settings.max_tokens_per_day;
        if max == 0 {
            return Ok(false);
        }
        let used = self.store.derive_usage(self.clock.now_ms())?;
        Ok(used.tokens() >= max)
    }

    /// What a derivation of `s` reads, or `None` when it must wait (a child's L0 is
    /// pending) or needs no derivation (the node's type is not derived).
    fn input(&self, s: &DeriveSnapshot) -> Option<DeriveInput> {
        if !self.settings.types.contains(&s.node.context_type) || s.waiting {
            return None;
        }
        if s.children.is_empty() {
            return Some(DeriveInput::Leaf {
                content: s.node.layers.content.clone(),
            });
        }
        if s.children
            .iter()
            .any(|c| c.provenance.abstract_origin.is_pending())
        {
            return None;
        }
        Some(DeriveInput::Container {
            content: s.node.layers.content.clone(),
            children: s.children.iter().map(|c| self.child(c)).collect(),
        })
    }

    fn child(&self, c: &DeriveChild) -> Child {
        Child {
            name: c.uri.name().to_owned(),
            abstract_text: self
                .projector
                .layers_text(&c.layers, &c.provenance, Level::L0)
                .unwrap_or_default(),
        }
    }

    /// Derives the open dirty keys among `uris` (all of one depth) and writes them back;
    /// the failure of each URI that failed.
    fn derive_level(
        &self,
        uris: &[CtxUri],
        tally: &mut DeriveCounters,
    ) -> Result<BTreeMap<CtxUri, WorkError>, WorkError> {
        let mut failed = BTreeMap::new();
        let snapshots = self.store.derive_snapshots(uris, WaitingFolders::Skip)?;
        let mut writes = Vec::new();
        let mut due: Vec<(DeriveSnapshot, DeriveInput, String)> = Vec::new();
        let over_budget = self.over_budget()?;
        let generator: &dyn Generator = if over_budget {
            &self.fallback
        } else {
            self.generator.as_ref()
        };
        for s in snapshots {
            let Some(input) = self.input(&s) else {
                if self.settings.types.contains(&s.node.context_type) {
                    tally.deferred += 1;
                } else {
                    writes.push(keep(&s));
                }
                continue;
            };
            let hash = input.hash(generator.identity(), self.settings.budget);
            if s.node.provenance.derived_from(&hash) {
                writes.push(keep(&s));
            } else {
                due.push((s, input, hash));
            }
        }
        for chunk in due.chunks(self.settings.batch_size.max(1)) {
            let inputs: Vec<DeriveInput> = chunk.iter().map(|(_, i, _)| i.clone()).collect();
            tally.generator_calls += 1;
            let results = generator.derive(&inputs, self.settings.budget, self.settings.timeout);
            for ((s, input, hash), result) in chunk.iter().zip(results) {
                match result {
                    Ok(d) => writes.push(self.write_of(s, generator, hash, d)),
                    Err(e) if e.is_retryable() => {
                        failed.insert(s.node.uri.clone(), work_error(&e));
                    }
                    Err(e) => {
                        tally.refused += 1;
                        writes.push(self.after_refusal(s, input, generator, hash, &e));
                    }
                }
            }
            if over_budget {
                tally.over_budget += chunk.len() as u64;
            }
        }
        if writes.is_empty() {
            return Ok(failed);
        }
        for outcome in self.store.write_derived(writes)? {
            match outcome {
                DerivedOutcome::Written { .. } => tally.written += 1,
                DerivedOutcome::Unchanged => tally.unchanged += 1,
                DerivedOutcome::Discarded { .. } => tally.discarded += 1,
            }
        }
        Ok(failed)
    }

    fn write_of(
        &self,
        s: &DeriveSnapshot,
        generator: &dyn Generator,
        hash: &str,
        d: Derived,
    ) -> DerivedWrite {
        let (tokens_in, tokens_out) = (d.tokens_in, d.tokens_out);
        let layers = layers_of(generator, hash, d, self.clock.now_ms());
        DerivedWrite {
            uri: s.node.uri.clone(),
            node_version: s.node.version,
            coalesce_version: s.key.coalesce_version,
            abstract_layer: layers.abstract_layer,
            overview_layer: layers.overview_layer,
            tokens_in,
            tokens_out,
        }
    }

    /// The write-back after `generator` refused `input` for good: the extractive result
    /// when the refusing generator was another one, else the failure itself (the fallback
    /// then applies to the layers).
    fn after_refusal(
        &self,
        s: &DeriveSnapshot,
        input: &DeriveInput,
        generator: &dyn Generator,
        hash: &str,
        e: &DeriveError,
    ) -> DerivedWrite {
        let message = format!("{}: {} refused: {e}", s.node.uri, generator.identity());
        tracing::warn!(uri = %s.node.uri, generator = %generator.identity(), error = %e, "derivation refused");
        *self
            .last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(message);
        if generator.identity() != self.fallback.identity() {
            let budget = self.settings.budget;
            let hash = input.hash(self.fallback.identity(), budget);
            if let Some(Ok(d)) = self
                .fallback
                .derive(std::slice::from_ref(input), budget, self.settings.timeout)
                .pop()
            {
                return self.write_of(s, &self.fallback, &hash, d);
            }
        }
        let failure = DeriveFailure {
            generator: generator.identity().key(),
            input_hash: hash.to_owned(),
            code: e.code().as_str().to_owned(),
            message: e.to_string(),
            at_ms: self.clock.now_ms(),
        };
        DerivedWrite {
            uri: s.node.uri.clone(),
            node_version: s.node.version,
            coalesce_version: s.key.coalesce_version,
            abstract_layer: LayerWrite::Failed(failure.clone()),
            overview_layer: LayerWrite::Failed(failure),
            tokens_in: 0,
            tokens_out: 0,
        }
    }

    /// What draining the first `limit` open dirty keys (by URI) would do, without calling
    /// the generator or writing anything: nodes to derive, current or not derived, and the
    /// tokens the generator would spend. A folder whose children are still pending counts
    /// as one derivation, estimated with its pending children's abstracts at most
    /// `l0_chars` of their content.
    pub fn dry_run(&self, limit: usize) -> Result<DryRunReport, WorkError> {
        let started = std::time::Instant::now();
        let keys = self.store.dirty_within(&CtxUri::root())?;
        let truncated = keys.len() > limit;
        let uris: Vec<CtxUri> = keys.into_iter().take(limit).map(|k| k.uri).collect();
        let generator: &dyn Generator = if self.over_budget()? {
            &self.fallback
        } else {
            self.generator.as_ref()
        };
        let budget = self.settings.budget;
        let mut actions: BTreeMap<String, u64> = BTreeMap::new();
        let mut samples: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut spend = SpendEstimate {
            generator: generator.identity().key(),
            ..SpendEstimate::default()
        };
        for chunk in uris.chunks(DRY_RUN_READ) {
            for s in self.store.derive_snapshots(chunk, WaitingFolders::Read)? {
                let action = match self.estimated_input(&s) {
                    None => "skip",
                    Some(input)
                        if s.node
                            .provenance
                            .derived_from(&input.hash(generator.identity(), budget)) =>
                    {
                        "unchanged"
                    }
                    Some(input) => {
                        let (tokens_in, tokens_out) = generator.estimate(&input, budget);
                        spend.derivations += 1;
                        spend.tokens_in += tokens_in;
                        spend.tokens_out += tokens_out;
                        "derive"
                    }
                };
                *actions.entry(action.to_owned()).or_default() += 1;
                let sample = samples.entry(action.to_owned()).or_default();
                if action == "derive" && sample.len() < ce_index::worker::dry_run::SAMPLE_SIZE {
                    sample.push(s.node.uri.to_string());
                }
            }
        }
        samples.retain(|_, v| !v.is_empty());
        Ok(DryRunReport {
            consumer: ce_core::config::DERIVE_CONSUMER.to_owned(),
            events: uris.len() as u64,
            through_seq: None,
            truncated,
            actions,
            samples,
            errors: Vec::new(),
            valid: true,
            took_ms: ce_core::clock::ms_of(started.elapsed()),
            spend: Some(spend),
        })
    }

    /// [`Self::input`] for an estimate: a folder waiting for its children is estimated
    /// with their abstracts at most `l0_chars` of their content.
    fn estimated_input(&self, s: &DeriveSnapshot) -> Option<DeriveInput> {
        if let Some(input) = self.input(s) {
            return Some(input);
        }
        if !self.settings.types.contains(&s.node.context_type) {
            return None;
        }
        let children = s.children.iter().map(|c| {
            let mut child = self.child(c);
            if c.provenance.abstract_origin.is_pending() {
                child.abstract_text = c
                    .layers
                    .content
                    .chars()
                    .take(self.settings.budget.l0_chars)
                    .collect();
            }
            child
        });
        Some(DeriveInput::Container {
            content: s.node.layers.content.clone(),
            children: children.collect(),
        })
    }

    /// The nodes operation `op` derives (a subtree: its open dirty keys).
    fn uris_of(&self, op: &Op) -> Result<Vec<CtxUri>, WorkError> {
        Ok(match op {
            Op::SyncNode(u) => vec![u.clone()],
            Op::SyncSubtree(u) => self
                .store
                .dirty_within(u)?
                .into_iter()
                .map(|k| k.uri)
                .collect(),
            Op::Move { .. } => Vec::new(),
        })
    }
}

/// A write-back that changes no layer: it only records that the key's inputs were seen.
fn keep(s: &DeriveSnapshot) -> DerivedWrite {
    DerivedWrite {
        uri: s.node.uri.clone(),
        node_version: s.node.version,
        coalesce_version: s.key.coalesce_version,
        abstract_layer: LayerWrite::Keep,
        overview_layer: LayerWrite::Keep,
        tokens_in: 0,
        tokens_out: 0,
    }
}

/// The layers `generator` derived as `d` from the input of `hash`, at `at_ms`.
pub(crate) fn layers_of(
    generator: &dyn Generator,
    hash: &str,
    d: Derived,
    at_ms: ce_core::Millis,
) -> LeafLayers {
    let derivation = Derivation {
        generator: generator.identity().key(),
        input_hash: hash.to_owned(),
        tokens_in: d.tokens_in,
        tokens_out: d.tokens_out,
        at_ms,
    };
    let layer = |text: Option<String>| LayerWrite::Derived {
        text: text.unwrap_or_default(),
        derivation: derivation.clone(),
    };
    LeafLayers {
        abstract_layer: layer(d.abstract_text),
        overview_layer: layer(d.overview),
    }
}

fn work_error(e: &DeriveError) -> WorkError {
    let mut w = WorkError::classified(e);
    if let DeriveError::RateLimited { retry_after, .. } = e {
        w.retry_after = *retry_after;
    }
    w
}

/// The nodes whose inputs `event` may have changed, as operations.
fn ops_of(event: &EventPayload) -> Vec<Op> {
    let parent = |u: &CtxUri| u.parent().filter(|p| !p.is_root()).map(Op::SyncNode);
    match event {
        EventPayload::UpsertContext(p) => std::iter::once(Op::SyncNode(p.uri.clone()))
            .chain(parent(&p.uri))
            .collect(),
        EventPayload::DeleteContext(p) => parent(&p.uri).into_iter().collect(),
        EventPayload::MoveContext(p) if p.from_uri == p.to_uri => Vec::new(),
        EventPayload::MoveContext(p) => parent(&p.from_uri)
            .into_iter()
            .chain([Op::SyncSubtree(p.to_uri.clone())])
            .chain(parent(&p.to_uri))
            .collect(),
        EventPayload::UpsertRelation(_) => Vec::new(),
    }
}

impl OpHandler for DeriveHandler {
    fn compact(&self, events: &[ClaimedEvent]) -> Plan {
        compact::plan(events.iter().map(|e| ops_of(&e.event.payload)).collect())
    }

    fn apply(&self, ops: &[Op]) -> OpOutcomes {
        let mut results: Vec<Result<(), WorkError>> = vec![Ok(()); ops.len()];
        let mut needed: Vec<Vec<CtxUri>> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match self.uris_of(op) {
                Ok(u) => needed.push(u),
                Err(e) => {
                    results[i] = Err(e);
                    needed.push(Vec::new());
                }
            }
        }
        // Deepest first: children are written back before their folders are read.
        let mut by_depth: BTreeMap<std::cmp::Reverse<usize>, Vec<CtxUri>> = BTreeMap::new();
        for u in needed.iter().flatten() {
            let level = by_depth.entry(std::cmp::Reverse(u.depth())).or_default();
            if !level.contains(u) {
                level.push(u.clone());
            }
        }
        let mut tally = DeriveCounters::default();
        let mut failed: BTreeMap<CtxUri, WorkError> = BTreeMap::new();
        for uris in by_depth.values() {
            match self.derive_level(uris, &mut tally) {
                Ok(f) => failed.extend(f),
                Err(e) => {
                    for u in uris {
                        failed.insert(u.clone(), e.clone());
                    }
                }
            }
        }
        for (i, uris) in needed.iter().enumerate() {
            if let Some(e) = uris.iter().find_map(|u| failed.get(u)) {
                results[i] = Err(e.clone());
            }
        }
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(&tally);
        OpOutcomes {
            results,
            actions: vec![
                ("derived", tally.written),
                ("unchanged", tally.unchanged),
                ("discarded", tally.discarded),
                ("deferred", tally.deferred),
                ("refused", tally.refused),
            ],
        }
    }

    fn paused_for(&self) -> Option<Duration> {
        self.generator.paused_for()
    }
}
