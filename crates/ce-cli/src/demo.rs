//! `ce demo`: imports the shipped demo tree into `ctx://demo`, shows it the way a user would
//! explore it (tree, two cats), runs the index workers until the vector outbox is drained,
//! then runs a few searches — timing each step.
//!
//! The demo needs the embedding model: when it is missing the demo stops before importing,
//! with the fix (`scripts/fetch-model.sh`).

use ce_core::clock::ms_of;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ce_core::ErrorCode;
use ce_core::{CtxUri, Level};
use ce_retrieval::{SearchRequest, SearchResponse};
use ce_server::status::{DrainReport, Status};
use ce_server::{Engine, ServerError};
use ce_store::NodeStat;
use ce_store::layout::{self, ImportReport};
use serde::Serialize;

use crate::cli::DemoArgs;
use crate::commands::{drain_with_progress, parse_uri, read_node};
use crate::error::Result;
use crate::output::{self, Rendered};

/// Where the demo tree is imported.
pub const DEMO_URI: &str = "ctx://demo";

/// The demo tree, relative to the current directory (the repository root).
const DEMO_TREE: &str = "examples/demo-tree";

/// The demo tree in the source checkout this binary was built from.
const DEMO_TREE_IN_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/demo-tree");

/// The nodes shown with `cat` when they exist: (path below the demo root, level).
const SHOWCASE: [(&str, Level); 2] = [
    (
        "users/alice/memories/preferences/communication-style",
        Level::L1,
    ),
    ("resources/docs/refund-policy", Level::L0),
];

/// The searches run once the index has caught up.
const QUERIES: [&str; 4] = [
    "how does Alice like answers to be written?",
    "customer was charged twice for one order",
    "when should the bot hand the conversation to a person?",
    "which projects is Alice working on?",
];

/// Hits shown per search.
const DEMO_TOP_K: usize = 3;

/// One `cat` of the demo.
#[derive(Debug, Serialize)]
struct DemoCat {
    uri: CtxUri,
    level: Level,
    text: String,
    ms: f64,
}

/// One search of the demo.
#[derive(Debug, Serialize)]
struct DemoSearch {
    query: String,
    ms: f64,
    result: SearchResponse,
}

/// The `--json` answer of `ce demo`.
#[derive(Debug, Serialize)]
struct DemoOutput {
    tree_dir: PathBuf,
    into: CtxUri,
    open_ms: f64,
    model: String,
    import: ImportReport,
    import_ms: f64,
    tree: Vec<NodeStat>,
    tree_ms: f64,
    cat: Vec<DemoCat>,
    index: DrainReport,
    searches: Vec<DemoSearch>,
    status: Status,
}

fn demo_tree(args: &DemoArgs) -> PathBuf {
    if let Some(t) = &args.tree {
        return t.clone();
    }
    let local = Path::new(DEMO_TREE);
    if local.is_dir() {
        local.to_path_buf()
    } else {
        PathBuf::from(DEMO_TREE_IN_SOURCE)
    }
}

/// Runs the demo on an open engine; `open` is how long opening it (and loading the model)
/// took.
pub fn run(engine: &Engine, args: &DemoArgs, open: Duration, json: bool) -> Result<Rendered> {
    let readiness = engine.readiness();
    if !readiness.ready {
        let code = if engine.embedder().is_ok() {
            ErrorCode::SchemaMismatch
        } else {
            ErrorCode::Unavailable
        };
        return Err(ServerError::NotReady {
            reason: format!(
                "the demo needs the embedding model: {}",
                readiness.reasons.join("; ")
            ),
            code,
        }
        .into());
    }
    let model = engine
        .embedder()
        .map(|e| ce_embed::Embedder::identity(e.as_ref()).key())
        .unwrap_or_default();
    let store = engine.store();
    let dir = demo_tree(args);
    let into = parse_uri(DEMO_URI)?;

    let t = Instant::now();
    let import = layout::import_dir(store.as_ref(), &dir, &into)?;
    let import_ms = ms_of(t.elapsed());
    engine.wakeup().notify();

    let t = Instant::now();
    let tree = store.tree(&into, None)?;
    let tree_ms = ms_of(t.elapsed());

    let mut cat = Vec::new();
    for (uri, level) in showcase(&into, &tree)? {
        let t = Instant::now();
        let node = read_node(store.as_ref(), &uri)?;
        let text = node.layers.get(level).to_owned();
        cat.push(DemoCat {
            uri,
            level,
            text,
            ms: ms_of(t.elapsed()),
        });
    }

    let index = drain_with_progress(engine, json, "indexing")?;

    let mut searches = Vec::new();
    for q in QUERIES {
        let mut req = SearchRequest::new(q);
        req.top_k = DEMO_TOP_K;
        req.filter.subtree = Some(into.clone());
        let t = Instant::now();
        let result = engine.search(&req)?;
        searches.push(DemoSearch {
            query: q.to_owned(),
            ms: ms_of(t.elapsed()),
            result,
        });
    }
    let status = engine.status()?;

    let out = DemoOutput {
        tree_dir: dir,
        into,
        open_ms: ms_of(open),
        model,
        import,
        import_ms,
        tree,
        tree_ms,
        cat,
        index,
        searches,
        status,
    };
    let human = human(&out);
    Rendered::new(&out, human)
}

/// The showcase nodes when the tree has them, else the first two nodes with content.
fn showcase(into: &CtxUri, tree: &[NodeStat]) -> Result<Vec<(CtxUri, Level)>> {
    let mut picked = Vec::new();
    for (path, level) in SHOWCASE {
        let uri = parse_uri(&format!("{into}/{path}"))?;
        if tree.iter().any(|n| n.uri == uri) {
            picked.push((uri, level));
        }
    }
    if picked.is_empty() {
        picked = tree
            .iter()
            .filter(|n| n.layer_bytes[2] > 0)
            .take(2)
            .map(|n| (n.uri.clone(), Level::L2))
            .collect();
    }
    Ok(picked)
}

fn human(o: &DemoOutput) -> String {
    let i = &o.import;
    let mut s = format!(
        "opened the store and loaded the model {} in {} ms\n\
         imported {} into {} in {} ms: {} nodes written, {} unchanged, {} relations, {} events\n",
        o.model,
        o.open_ms,
        o.tree_dir.display(),
        o.into,
        o.import_ms,
        i.nodes_written,
        i.nodes_unchanged,
        i.relations_written,
        i.events,
    );
    s.push_str(&format!("\n$ ce tree {}    ({} ms)\n", o.into, o.tree_ms));
    s.push_str(&output::tree(&o.into, &o.tree));
    for c in &o.cat {
        s.push_str(&format!(
            "\n$ ce cat {} --level {}    ({} ms)\n",
            c.uri, c.level, c.ms
        ));
        s.push_str(&c.text);
        if !c.text.ends_with('\n') {
            s.push('\n');
        }
    }
    s.push_str("\n$ ce worker --once    (index the outbox)\n");
    s.push_str(&output::drain(&o.index));
    for q in &o.searches {
        s.push_str(&format!(
            "\n$ ce search {:?} --top-k {DEMO_TOP_K} --subtree {}    ({} ms)\n",
            q.query, o.into, q.ms
        ));
        s.push_str(&output::search(&q.result, output::LOCAL_CATCH_UP));
    }
    s.push_str("\n$ ce status\n");
    s.push_str(&output::status(&o.status));
    s
}
