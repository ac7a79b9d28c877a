//! Hierarchical search (directory-recursive retrieval, after OpenViking's): score the L0 of
//! containers first, descend into the best subtrees, propagate scores down, return the top-k
//! leaves with their path. The algorithm and its parameters are in docs/retrieval.md.
//!
//! 1. **embed** the query once;
//! 2. **seed**: one vector search over the L0 records within the start (the filter's subtree,
//!    else everything): the containers among the hits (nodes with children) enter a max-heap
//!    frontier with their L0 score; leaves among them are candidates;
//! 3. **expand** the best container of the frontier: one vector search restricted to its
//!    children (`parent_uri`), best record per child, and one `ls` of the source for which
//!    children are containers. A child's propagated score is
//!    `alpha · own + (1 − alpha) · parent's propagated score`; containers join the frontier,
//!    leaves passing the request's filter become candidates;
//! 4. **stop** when the frontier is empty, `max_expansions` containers were expanded, or the
//!    top-k leaves stayed the same for `convergence_rounds` expansions in a row;
//! 5. **hydrate** the leaves and the containers on their paths in one batched read: a leaf
//!    whose node is gone, moved or newer than its record is dropped and counted; path L0s are
//!    the current ones.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use ce_core::{CoreError, CtxUri, IndexRecord, Level};
use ce_embed::Embedder;
use ce_index::vector::{SearchFilter, VectorHit, VectorIndex};
use ce_store::SourceStore;
use serde::{Deserialize, Serialize};

use crate::hydrate::Current;
use crate::{Result, RetrievalError, SearchRequest, embed_query, ms};

/// Parameters of [`hierarchical_search`] (defaults in [`HierarchicalParams::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HierarchicalHit {
    /// The node.
    pub uri: CtxUri,
    /// Propagated score (the ranking key).
    pub score: f32,
    /// Cosine similarity of its best record alone.
    pub own_score: f32,
    /// The level of that record.
    pub level: Level,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HierarchicalResponse {
    /// Leaves found, best first (at most `top_k`).
    pub hits: Vec<HierarchicalHit>,
    /// Leaf candidates dropped because the source no longer holds them at the indexed version.
    pub dropped_by_hydration: usize,
    /// The embedding model.
    pub model: String,
    /// Counters and timings.
    pub stats: HierarchicalStats,
}

/// A container waiting to be expanded.
struct Frontier {
    score: f32,
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
        self.score
            .total_cmp(&o.score)
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

/// The best record of each node among `hits` (they come best first).
fn best_per_node(hits: Vec<VectorHit>) -> Vec<VectorHit> {
    let mut seen = std::collections::BTreeSet::new();
    hits.into_iter()
        .filter(|h| seen.insert(h.record.uri.clone()))
        .collect()
}

/// Runs `req` (see the module docs).
pub fn hierarchical_search(
    source: &dyn SourceStore,
    embedder: &dyn Embedder,
    index: &dyn VectorIndex,
    req: &HierarchicalRequest,
) -> Result<HierarchicalResponse> {
    let started = Instant::now();
    req.search.validate()?;
    req.params.validate()?;
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
    stats.embed_ms = ms(t.elapsed());

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
    for h in best_per_node(seeds) {
        let children = source.stat(&h.record.uri).map_or(0, |s| s.children);
        if children > 0 {
            frontier.push(Frontier {
                score: h.score,
                uri: h.record.uri.clone(),
                depth: 0,
                path: Vec::new(),
            });
        } else {
            offer(&mut leaves, user, h.record, h.score, h.score, Vec::new());
        }
    }
    if frontier.is_empty()
        && let Some(start) = &user.subtree
    {
        frontier.push(Frontier {
            score: 0.0,
            uri: start.clone(),
            depth: 0,
            path: Vec::new(),
        });
    }

    let mut last_top: Vec<CtxUri> = top_uris(&leaves, top_k);
    let mut stable = 0;
    while let Some(c) = frontier.pop() {
        if stats.containers_expanded >= p.max_expansions {
            break;
        }
        if !expanded.insert(c.uri.clone()) {
            continue;
        }
        stats.containers_expanded += 1;
        let kinds: BTreeMap<CtxUri, u64> = source
            .ls(&c.uri)?
            .into_iter()
            .map(|s| (s.uri, s.children))
            .collect();
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
        path.push((c.uri.clone(), c.score));
        for h in best_per_node(hits) {
            let prop = if path.len() == 1 && c.score == 0.0 {
                h.score
            } else {
                p.alpha * h.score + (1.0 - p.alpha) * c.score
            };
            let is_container = kinds.get(&h.record.uri).is_some_and(|&n| n > 0);
            if is_container {
                if c.depth < p.max_depth {
                    frontier.push(Frontier {
                        score: prop,
                        uri: h.record.uri.clone(),
                        depth: c.depth + 1,
                        path: path.clone(),
                    });
                }
            } else {
                offer(&mut leaves, user, h.record, h.score, prop, path.clone());
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
    stats.descend_ms = ms(t.elapsed());

    // Hydrate the leaves and every container on their paths in one read.
    let t = Instant::now();
    let mut ranked: Vec<Leaf> = leaves.into_values().collect();
    ranked.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.uri.cmp(&b.record.uri))
    });
    let containers: Vec<CtxUri> = ranked
        .iter()
        .flat_map(|l| l.path.iter().map(|(u, _)| u.clone()))
        .collect();
    let current = Current::read_uris(
        source,
        ranked
            .iter()
            .map(|l| l.record.uri.clone())
            .chain(containers),
    )?;
    let mut hits = Vec::with_capacity(top_k);
    let mut dropped = 0;
    for l in ranked {
        if hits.len() >= top_k {
            break;
        }
        let Some(node) = current.of(&l.record) else {
            dropped += 1;
            continue;
        };
        let drill_down = Level::ALL
            .into_iter()
            .filter(|lv| !node.layers.get(*lv).is_empty())
            .collect();
        hits.push(HierarchicalHit {
            uri: node.uri.clone(),
            score: l.score,
            own_score: l.own,
            level: l.record.level,
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
            drill_down,
        });
    }
    stats.hydrate_ms = ms(t.elapsed());
    stats.total_ms = ms(started.elapsed());
    metrics::histogram!("retrieval_search_latency_ms", "mode" => "hierarchical")
        .record(stats.total_ms);
    if dropped > 0 {
        metrics::counter!("retrieval_dropped_by_hydration_total", "mode" => "hierarchical")
            .increment(dropped as u64);
    }
    Ok(HierarchicalResponse {
        hits,
        dropped_by_hydration: dropped,
        model: identity.key(),
        stats,
    })
}

/// Records a leaf candidate that passes the request's filter, keeping its best score.
fn offer(
    leaves: &mut BTreeMap<CtxUri, Leaf>,
    filter: &SearchFilter,
    record: IndexRecord,
    own: f32,
    score: f32,
    path: Vec<(CtxUri, f32)>,
) {
    if !filter.matches(&record) {
        return;
    }
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
        hierarchical_search(f.store.as_ref(), f.embedder.as_ref(), f.index.as_ref(), r)
            .expect("hierarchical search")
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
                hierarchical_search(f.store.as_ref(), f.embedder.as_ref(), f.index.as_ref(), &r)
                    .expect_err("invalid");
            assert_eq!(err.code(), ErrorCode::InvalidField);
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
