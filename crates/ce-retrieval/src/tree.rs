//! Hierarchical search (directory-recursive retrieval, after OpenViking's): score the L0 of
//! containers first, descend into the best subtrees, propagate scores down, return the top-k
//! leaves with their path. The algorithm and its parameters are in docs/retrieval.md.
//!
//! 1. **embed** the query once;
//! 2. **seed**: one vector search over the L0 records within the start (the filter's subtree,
//!    else everything): the containers among the hits (nodes with children) enter a max-heap
//!    frontier with their L0 score; a leaf among them brings its parent container in with the
//!    leaf's score (a matching note suggests its folder); with no seed, the start itself;
//! 3. **expand** the best container of the frontier: one vector search restricted to its
//!    children (`parent_uri`) and one `ls` of the source for which children are containers.
//!    A child's propagated score is `alpha · own + (1 − alpha) · parent's propagated score`
//!    (its own score alone below a start without a score). Containers join the frontier —
//!    those without text (no index record) with their parent's score; a leaf becomes a
//!    candidate with the best of its records that passes the request's filter. Every leaf is
//!    scored through its parent, whatever route found it;
//! 4. **stop** when the frontier is empty, `max_expansions` containers were expanded, or the
//!    top-k leaves stayed the same for `convergence_rounds` expansions in a row;
//! 5. **hydrate** the best leaves and the containers on their paths, `2 × top_k` leaves per
//!    batched read (one read unless stale leaves were dropped): a leaf whose node is gone,
//!    moved or newer than its record is dropped and counted; path L0s are the current ones.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use ce_core::{Classify as _, CoreError, CtxUri, ErrorCode, IndexRecord, Level};
use ce_index::vector::{SearchFilter, VectorHit};
use ce_store::SourceStore;
use serde::{Deserialize, Serialize};

use crate::hydrate::Current;
use crate::lag::{self, IndexLag};
use crate::{Result, RetrievalError, SearchRequest, VectorSide, embed_query};
use ce_core::clock::ms_of;

/// Parameters of [`hierarchical_search`] (defaults in [`HierarchicalParams::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HierarchicalParams {
    /// L0 records asked for by the seed search (1..=200).
    pub seeds: usize,
    /// Weight of a node's own score against its parent's propagated score (0..=1).
    pub alpha: f32,
    /// Containers expanded at most (1..=1000).
    pub max_expansions: usize,
    /// Child records asked for per expanded container (1..=500).
    pub per_container: usize,
    /// Expansions in a row without a change of the top-k leaves that end the search (1..=100).
    pub convergence_rounds: usize,
    /// Levels below the seeds that are descended at most (1..=64).
    pub max_depth: usize,
}

impl Default for HierarchicalParams {
    fn default() -> Self {
        HierarchicalParams {
            seeds: 20,
            alpha: 0.5,
            max_expansions: 30,
            per_container: 50,
            convergence_rounds: 3,
            max_depth: 8,
        }
    }
}

impl HierarchicalParams {
    /// Checks every parameter's range; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| {
            Err(RetrievalError::InvalidRequest(CoreError::InvalidField {
                field,
                reason,
            }))
        };
        let ranges = [
            ("seeds", self.seeds, 1, 200),
            ("max_expansions", self.max_expansions, 1, 1000),
            ("per_container", self.per_container, 1, 500),
            ("convergence_rounds", self.convergence_rounds, 1, 100),
            ("max_depth", self.max_depth, 1, 64),
        ];
        for (field, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return bad(field, format!("{v} is outside {lo}..={hi}"));
            }
        }
        if !(0.0..=1.0).contains(&self.alpha) {
            return bad("alpha", format!("{} is outside 0..=1", self.alpha));
        }
        Ok(())
    }
}

/// A hierarchical search: the query, `top_k`, filter (its `subtree` is where the descent
/// starts) and embedding timeout of `search`, and the descent's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HierarchicalRequest {
    /// Query, `top_k`, filter, timeout (`mode` and `min_score` are not used).
    pub search: SearchRequest,
    /// The descent.
    pub params: HierarchicalParams,
}

/// One container on a hit's path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PathStep {
    /// The container.
    pub uri: CtxUri,
    /// Its current L0 abstract.
    #[serde(rename = "abstract")]
    pub abstract_text: String,
    /// Its propagated score.
    pub score: f32,
}

/// One leaf found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HierarchicalHit {
    /// The node.
    pub uri: CtxUri,
    /// Propagated score (the ranking key).
    pub score: f32,
    /// Cosine similarity of its best record alone.
    pub own_score: f32,
    /// The level of that record.
    pub level: Level,
    /// The stable id of that record, `stable_hash(uri, level)` (spec §2.1.1).
    pub record_id: String,
    /// The node's current L0 abstract.
    #[serde(rename = "abstract")]
    pub abstract_text: String,
    /// The node's current version.
    pub version: u64,
    /// The containers from the seed down to the parent, best first reached.
    pub path: Vec<PathStep>,
    /// Levels with text to drill down to (`ce cat --level N URI`).
    pub drill_down: Vec<Level>,
}

/// Counters and timings of one hierarchical search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HierarchicalStats {
    /// Containers expanded.
    pub containers_expanded: usize,
    /// Vector index searches (the seed search included).
    pub index_searches: usize,
    /// Whether the search stopped because the top-k leaves stopped changing.
    pub converged: bool,
    /// Embedding the query, in ms.
    pub embed_ms: f64,
    /// Seed search and expansions, in ms.
    pub descend_ms: f64,
    /// The batched source read and checks, in ms.
    pub hydrate_ms: f64,
    /// The whole search, in ms.
    pub total_ms: f64,
}

/// The answer of [`hierarchical_search`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HierarchicalResponse {
    /// Leaves found, best first (at most `top_k`).
    pub hits: Vec<HierarchicalHit>,
    /// Leaf candidates dropped because the source no longer holds them at the indexed version.
    pub dropped_by_hydration: usize,
    /// The embedding model.
    pub model: String,
    /// The vector index's changes within the start not applied yet.
    #[serde(default)]
    pub lag: Vec<IndexLag>,
    /// Counters and timings.
    pub stats: HierarchicalStats,
}

/// A container waiting to be expanded.
struct Frontier {
    /// Propagated score; `None` for a start without one (its children score alone).
    score: Option<f32>,
    uri: CtxUri,
    depth: usize,
    path: Vec<(CtxUri, f32)>,
}

impl PartialEq for Frontier {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Frontier {}
impl PartialOrd for Frontier {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Frontier {
    /// Best score first; ties by URI (ascending) so runs are deterministic.
    fn cmp(&self, o: &Self) -> Ordering {
        let key = |f: &Frontier| f.score.unwrap_or(f32::INFINITY);
        key(self)
            .total_cmp(&key(o))
            .then_with(|| o.uri.cmp(&self.uri))
    }
}

/// A leaf candidate: its best record, own and propagated scores, and path.
struct Leaf {
    record: IndexRecord,
    own: f32,
    score: f32,
    path: Vec<(CtxUri, f32)>,
}

/// Per child among `hits` (best first): its best record (for scoring a container) and its
/// best record that passes `filter` (for a leaf), in the order of the best records.
fn per_child(hits: Vec<VectorHit>, filter: &SearchFilter) -> Vec<(VectorHit, Option<VectorHit>)> {
    let mut order: Vec<CtxUri> = Vec::new();
    let mut by: BTreeMap<CtxUri, (VectorHit, Option<VectorHit>)> = BTreeMap::new();
    for h in hits {
        let passes = filter.matches(&h.record);
        match by.get_mut(&h.record.uri) {
            Some(e) => {
                if passes && e.1.is_none() {
                    e.1 = Some(h);
                }
            }
            None => {
                order.push(h.record.uri.clone());
                let leaf = passes.then(|| h.clone());
                by.insert(h.record.uri.clone(), (h, leaf));
            }
        }
    }
    order.into_iter().filter_map(|u| by.remove(&u)).collect()
}

/// Children of `uri` per the source (`uri → children count`); a node gone meanwhile has none.
fn children_of(source: &dyn SourceStore, uri: &CtxUri) -> Result<BTreeMap<CtxUri, u64>> {
    match source.ls(uri) {
        Ok(v) => Ok(v.into_iter().map(|s| (s.uri, s.children)).collect()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `uri` has children per the source (a node gone meanwhile has none).
fn is_container(source: &dyn SourceStore, uri: &CtxUri) -> Result<bool> {
    match source.stat(uri) {
        Ok(s) => Ok(s.children > 0),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `uri` is within the search's start (`scope.subtree`; everything without one).
fn within(uri: &CtxUri, scope: &SearchFilter) -> bool {
    !uri.is_root() && scope.subtree.as_ref().is_none_or(|s| uri.is_within(s))
}

/// Runs `req` (see the module docs).
pub fn hierarchical_search(
    source: &dyn SourceStore,
    vector: VectorSide<'_>,
    req: &HierarchicalRequest,
) -> Result<HierarchicalResponse> {
    let VectorSide {
        embedder,
        index,
        consumer,
    } = vector;
    let started = Instant::now();
    req.search.validate()?;
    req.params.validate()?;
    if req.search.min_score.is_some() {
        return Err(RetrievalError::InvalidRequest(CoreError::InvalidField {
            field: "min_score",
            reason: "not used by hierarchical search (its scores are propagated)".into(),
        }));
    }
    let p = req.params;
    let identity = embedder.identity();
    if let Some(bound) = index.model()?
        && bound != *identity
    {
        return Err(RetrievalError::ModelMismatch {
            index: bound.key(),
            embedder: identity.key(),
        });
    }
    let mut stats = HierarchicalStats::default();
    let t = Instant::now();
    let q = embed_query(embedder, &req.search.query, req.search.embed_timeout)?;
    stats.embed_ms = ms_of(t.elapsed());

    let t = Instant::now();
    let user = &req.search.filter;
    // Containers are reached whatever the leaf filters say; the scope (start, account,
    // owner spaces) binds every search.
    let scope = SearchFilter {
        subtree: user.subtree.clone(),
        account_id: user.account_id.clone(),
        owner_spaces: user.owner_spaces.clone(),
        ..SearchFilter::default()
    };
    let top_k = req.search.top_k;
    let mut frontier: BinaryHeap<Frontier> = BinaryHeap::new();
    let mut leaves: BTreeMap<CtxUri, Leaf> = BTreeMap::new();
    let mut expanded = std::collections::BTreeSet::new();

    // Seeds: L0 records within the start.
    let seeds = index.search(
        &q,
        &SearchFilter {
            level: Some(Level::L0),
            ..scope.clone()
        },
        p.seeds,
    )?;
    stats.index_searches += 1;
    for (h, _) in per_child(seeds, &SearchFilter::default()) {
        let uri = h.record.uri.clone();
        let entry = if is_container(source, &uri)? {
            Some(uri)
        } else {
            // A matching leaf brings its folder in; the leaf is scored when it is expanded.
            uri.parent().filter(|parent| within(parent, &scope))
        };
        if let Some(uri) = entry {
            frontier.push(Frontier {
                score: Some(h.score),
                uri,
                depth: 0,
                path: Vec::new(),
            });
        }
    }
    if frontier.is_empty() {
        frontier.push(Frontier {
            score: None,
            uri: user.subtree.clone().unwrap_or_else(CtxUri::root),
            depth: 0,
            path: Vec::new(),
        });
    }

    let mut last_top: Vec<CtxUri> = Vec::new();
    let mut stable = 0;
    while let Some(c) = frontier.pop() {
        if stats.containers_expanded >= p.max_expansions {
            break;
        }
        // A folder may be queued several times (as a seed, via a leaf, from its parent): the
        // best entry comes first.
        if !expanded.insert(c.uri.clone()) {
            continue;
        }
        stats.containers_expanded += 1;
        let kinds = children_of(source, &c.uri)?;
        let hits = index.search(
            &q,
            &SearchFilter {
                parent_uri: Some(c.uri.clone()),
                ..scope.clone()
            },
            p.per_container * Level::ALL.len(),
        )?;
        stats.index_searches += 1;
        let mut path = c.path.clone();
        if let Some(score) = c.score {
            path.push((c.uri.clone(), score));
        }
        let propagate = |own: f32| match c.score {
            Some(parent) => p.alpha * own + (1.0 - p.alpha) * parent,
            None => own,
        };
        let mut scored = std::collections::BTreeSet::new();
        for (best, leaf) in per_child(hits, user) {
            scored.insert(best.record.uri.clone());
            if kinds.get(&best.record.uri).is_some_and(|&n| n > 0) {
                if c.depth < p.max_depth {
                    frontier.push(Frontier {
                        score: Some(propagate(best.score)),
                        uri: best.record.uri.clone(),
                        depth: c.depth + 1,
                        path: path.clone(),
                    });
                }
            } else if let Some(l) = leaf {
                let own = l.score;
                offer(&mut leaves, l.record, own, propagate(own), path.clone());
            }
        }
        // Containers without text have no record: they inherit their parent's score.
        if c.depth < p.max_depth {
            for (uri, _) in kinds
                .into_iter()
                .filter(|(u, n)| *n > 0 && !scored.contains(u))
            {
                frontier.push(Frontier {
                    score: c.score,
                    uri,
                    depth: c.depth + 1,
                    path: path.clone(),
                });
            }
        }
        let top = top_uris(&leaves, top_k);
        if top.len() >= top_k && top == last_top {
            stable += 1;
            if stable >= p.convergence_rounds {
                stats.converged = true;
                break;
            }
        } else {
            stable = 0;
        }
        last_top = top;
    }
    stats.descend_ms = ms_of(t.elapsed());

    // Hydrate the best leaves and the containers on their paths, `2 × top_k` leaves per read
    // (a further read only when stale leaves were dropped).
    let t = Instant::now();
    let mut ranked: Vec<Leaf> = leaves.into_values().collect();
    ranked.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.uri.cmp(&b.record.uri))
    });
    let mut hits = Vec::with_capacity(top_k);
    let mut dropped = 0;
    for chunk in ranked.chunks(2 * top_k) {
        if hits.len() >= top_k {
            break;
        }
        let current = Current::read_uris(
            source,
            chunk.iter().flat_map(|l| {
                std::iter::once(l.record.uri.clone()).chain(l.path.iter().map(|(u, _)| u.clone()))
            }),
        )?;
        for l in chunk {
            if hits.len() >= top_k {
                break;
            }
            let Some(node) = current.of(&l.record) else {
                dropped += 1;
                continue;
            };
            hits.push(HierarchicalHit {
                uri: node.uri.clone(),
                score: l.score,
                own_score: l.own,
                level: l.record.level,
                record_id: l.record.id.clone(),
                abstract_text: node.layers.abstract_text.clone(),
                version: node.version,
                path: l
                    .path
                    .iter()
                    .map(|(u, s)| PathStep {
                        abstract_text: current
                            .node(u)
                            .map(|n| n.layers.abstract_text.clone())
                            .unwrap_or_default(),
                        uri: u.clone(),
                        score: *s,
                    })
                    .collect(),
                drill_down: Level::ALL
                    .into_iter()
                    .filter(|lv| !node.layers.get(*lv).is_empty())
                    .collect(),
            });
        }
    }
    stats.hydrate_ms = ms_of(t.elapsed());
    stats.total_ms = ms_of(started.elapsed());
    metrics::histogram!("retrieval_search_latency_ms", "mode" => "hierarchical")
        .record(stats.total_ms);
    if dropped > 0 {
        metrics::counter!("retrieval_dropped_by_hydration_total", "mode" => "hierarchical")
            .increment(dropped as u64);
    }
    let lag = lag::lag_of(
        source,
        &[consumer],
        lag::search_scope(&req.search.filter).as_ref(),
    )?;
    Ok(HierarchicalResponse {
        hits,
        dropped_by_hydration: dropped,
        model: identity.key(),
        lag,
        stats,
    })
}

/// Records a leaf candidate (its record passed the request's filter), keeping its best
/// score.
fn offer(
    leaves: &mut BTreeMap<CtxUri, Leaf>,
    record: IndexRecord,
    own: f32,
    score: f32,
    path: Vec<(CtxUri, f32)>,
) {
    match leaves.get(&record.uri) {
        Some(l) if l.score >= score => {}
        _ => {
            leaves.insert(
                record.uri.clone(),
                Leaf {
                    record,
                    own,
                    score,
                    path,
                },
            );
        }
    }
}

/// The URIs of the `k` best leaves so far.
fn top_uris(leaves: &BTreeMap<CtxUri, Leaf>, k: usize) -> Vec<CtxUri> {
    let mut v: Vec<(&CtxUri, f32)> = leaves.iter().map(|(u, l)| (u, l.score)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v.into_iter().take(k).map(|(u, _)| u.clone()).collect()
}

#[cfg(test)]
mod tests {
    use ce_core::{Classify as _, ErrorCode};
    use ce_store::ContextFs as _;

    use super::*;
    use crate::tests::{Fixture, u};

    /// Two topics: the pasta note says little that matches the query by itself, but it sits in
    /// the container that does; the chores note shares a word with the query at the top level.
    fn kb() -> Fixture {
        let f = Fixture::new();
        f.put(
            "ctx://acc/kb/cooking",
            "italian cooking recipes and kitchen technique",
            "",
        );
        f.put(
            "ctx://acc/kb/cooking/pasta",
            "pasta al pomodoro with basil",
            "boil pasta, simmer tomatoes",
        );
        f.put(
            "ctx://acc/kb/cooking/risotto",
            "saffron risotto",
            "toast the rice, add stock slowly",
        );
        f.put("ctx://acc/kb/chores", "household chores and cleaning", "");
        f.put(
            "ctx://acc/kb/chores/vinegar",
            "cleaning recipes with vinegar",
            "vinegar and baking soda",
        );
        f.index_all();
        f
    }

    fn req(q: &str) -> HierarchicalRequest {
        HierarchicalRequest {
            search: SearchRequest {
                top_k: 3,
                ..SearchRequest::new(q)
            },
            params: HierarchicalParams::default(),
        }
    }

    fn run(f: &Fixture, r: &HierarchicalRequest) -> HierarchicalResponse {
        hierarchical_search(f.store.as_ref(), f.vector_side(), r).expect("hierarchical search")
    }

    fn score_of(r: &HierarchicalResponse, uri: &str) -> Option<f32> {
        r.hits
            .iter()
            .find(|h| h.uri.as_str() == uri)
            .map(|h| h.score)
    }

    #[test]
    fn leaves_of_the_best_container_rise_with_their_path() {
        let f = kb();
        let r = run(&f, &req("italian cooking recipes"));
        let pasta = r
            .hits
            .iter()
            .find(|h| h.uri.as_str() == "ctx://acc/kb/cooking/pasta")
            .expect("pasta found through its container");
        assert_eq!(pasta.path[0].uri, u("ctx://acc/kb/cooking"), "{r:?}");
        assert_eq!(
            pasta.path[0].abstract_text,
            "italian cooking recipes and kitchen technique"
        );
        assert!(
            pasta.score > pasta.own_score,
            "the container lifts it: {pasta:?}"
        );
        assert_eq!(pasta.drill_down, [Level::L0, Level::L2]);
        // Only leaves are returned, the containers show up in paths.
        assert!(r.hits.iter().all(|h| !h.uri.as_str().ends_with("/cooking")));
        let vinegar = score_of(&r, "ctx://acc/kb/chores/vinegar").unwrap_or(f32::MIN);
        assert!(pasta.score > vinegar, "{r:?}");
        assert!(r.stats.containers_expanded >= 1 && r.stats.index_searches >= 2);
        assert_eq!(r.dropped_by_hydration, 0);
    }

    #[test]
    fn stale_and_moved_leaves_are_never_returned_as_current() {
        let f = kb();
        // Changed after indexing: dropped and counted until the worker catches up.
        f.put(
            "ctx://acc/kb/cooking/pasta",
            "pasta al pomodoro with basil",
            "now with garlic",
        );
        let r = run(&f, &req("italian cooking recipes"));
        assert!(
            score_of(&r, "ctx://acc/kb/cooking/pasta").is_none(),
            "{r:?}"
        );
        assert!(r.dropped_by_hydration >= 1, "{r:?}");
        f.index_all();
        let r = run(&f, &req("italian cooking recipes"));
        let pasta = r
            .hits
            .iter()
            .find(|h| h.uri.as_str() == "ctx://acc/kb/cooking/pasta")
            .expect("back once reindexed");
        assert_eq!(pasta.version, 2);
        // A moved subtree is found at its new path only.
        f.store
            .mv(&u("ctx://acc/kb/cooking"), &u("ctx://acc/kb/kitchen"), None)
            .expect("mv");
        f.index_all();
        let r = run(&f, &req("italian cooking recipes"));
        assert!(
            r.hits.iter().all(|h| !h.uri.as_str().contains("/cooking")),
            "{r:?}"
        );
        assert!(
            score_of(&r, "ctx://acc/kb/kitchen/pasta").is_some(),
            "{r:?}"
        );
    }

    #[test]
    fn the_descent_stops_once_the_top_k_settles() {
        let f = Fixture::new();
        for t in 0..12 {
            f.put(&format!("ctx://acc/t{t}"), &format!("topic {t} notes"), "");
            for d in 0..3 {
                f.put(
                    &format!("ctx://acc/t{t}/d{d}"),
                    &format!("note {d} of topic {t}"),
                    "",
                );
            }
        }
        f.index_all();
        let mut r = req("topic notes");
        r.params.convergence_rounds = 1;
        r.params.max_expansions = 12;
        let out = run(&f, &r);
        assert!(out.stats.converged, "{:?}", out.stats);
        assert!(out.stats.containers_expanded < 12, "{:?}", out.stats);
        assert_eq!(out.hits.len(), 3);
    }

    #[test]
    fn every_leaf_is_scored_through_its_parent_and_counters_add_up() {
        let f = kb();
        let r = run(&f, &req("cleaning recipes with vinegar"));
        assert!(!r.hits.is_empty());
        let alpha = HierarchicalParams::default().alpha;
        for h in &r.hits {
            let parent = h.path.last().expect("a leaf has its folder on its path");
            let want = alpha * h.own_score + (1.0 - alpha) * parent.score;
            assert!((h.score - want).abs() < 1e-6, "{h:?}");
        }
        assert_eq!(r.stats.index_searches, 1 + r.stats.containers_expanded);
    }

    #[test]
    fn a_level_filter_keeps_leaves_whose_best_record_is_another_level() {
        let f = kb();
        let mut r = req("italian cooking recipes");
        r.search.filter.level = Some(Level::L2);
        let out = run(&f, &r);
        assert!(!out.hits.is_empty(), "{out:?}");
        assert!(out.hits.iter().all(|h| h.level == Level::L2), "{out:?}");
        assert!(
            out.hits
                .iter()
                .any(|h| h.uri.as_str() == "ctx://acc/kb/cooking/pasta"),
            "{out:?}"
        );
    }

    #[test]
    fn folders_without_text_are_descended() {
        let f = Fixture::new();
        // Only leaves have text: every folder was created implicitly.
        f.put("ctx://acc/notes/2024/jan/standup", "standup notes", "");
        f.put(
            "ctx://acc/notes/2024/feb/offsite",
            "offsite planning agenda",
            "",
        );
        f.put("ctx://acc/notes/2023/dec/party", "holiday party", "");
        f.index_all();
        let mut r = req("offsite planning agenda");
        r.search.filter.subtree = Some(u("ctx://acc/notes"));
        let out = run(&f, &r);
        assert_eq!(
            out.hits.first().map(|h| h.uri.as_str()),
            Some("ctx://acc/notes/2024/feb/offsite"),
            "{out:?}"
        );
        // With no subtree either: seeds bring their folders in.
        let out = run(&f, &req("holiday party"));
        assert_eq!(
            out.hits.first().map(|h| h.uri.as_str()),
            Some("ctx://acc/notes/2023/dec/party"),
            "{out:?}"
        );
        let mut r = req("x");
        r.search.min_score = Some(0.1);
        let err =
            hierarchical_search(f.store.as_ref(), f.vector_side(), &r).expect_err("min_score");
        assert!(err.to_string().contains("min_score"), "{err}");
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let f = kb();
        for (field, params) in [
            (
                "alpha",
                HierarchicalParams {
                    alpha: 1.5,
                    ..HierarchicalParams::default()
                },
            ),
            (
                "seeds",
                HierarchicalParams {
                    seeds: 0,
                    ..HierarchicalParams::default()
                },
            ),
        ] {
            let r = HierarchicalRequest { params, ..req("x") };
            let err =
                hierarchical_search(f.store.as_ref(), f.vector_side(), &r).expect_err("invalid");
            assert_eq!(err.code(), ErrorCode::InvalidField);
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
