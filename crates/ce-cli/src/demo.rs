//! `ce demo`: imports the shipped demo tree into `ctx://demo`, then shows it the way a user
//! would explore it (tree, two cats, outbox stats), timing each step.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ce_core::{CtxUri, Level};
use ce_store::layout::{self, ImportReport};
use ce_store::{ConsumerStats, ContextFs, NodeStat, OutboxStore, SqliteStore};
use serde::Serialize;

use crate::cli::DemoArgs;
use crate::commands::{parse_uri, read_node};
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

/// One `cat` of the demo.
#[derive(Debug, Serialize)]
struct DemoCat {
    uri: CtxUri,
    level: Level,
    text: String,
    ms: f64,
}

/// The `--json` answer of `ce demo`.
#[derive(Debug, Serialize)]
struct DemoOutput {
    tree_dir: PathBuf,
    into: CtxUri,
    open_ms: f64,
    import: ImportReport,
    import_ms: f64,
    tree: Vec<NodeStat>,
    tree_ms: f64,
    cat: Vec<DemoCat>,
    outbox_stats: Vec<ConsumerStats>,
    stats_ms: f64,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
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

/// Runs the demo on an open store; `open` is how long opening it took.
pub fn run(store: &SqliteStore, args: &DemoArgs, open: Duration) -> Result<Rendered> {
    let dir = demo_tree(args);
    let into = parse_uri(DEMO_URI)?;

    let t = Instant::now();
    let import = layout::import_dir(store, &dir, &into)?;
    let import_ms = ms(t.elapsed());

    let t = Instant::now();
    let tree = store.tree(&into, None)?;
    let tree_ms = ms(t.elapsed());

    let mut cat = Vec::new();
    for (uri, level) in showcase(&into, &tree)? {
        let t = Instant::now();
        let node = read_node(store, &uri)?;
        let text = node.layers.get(level).to_owned();
        cat.push(DemoCat {
            uri,
            level,
            text,
            ms: ms(t.elapsed()),
        });
    }

    let t = Instant::now();
    let outbox_stats = store.stats()?;
    let stats_ms = ms(t.elapsed());

    let out = DemoOutput {
        tree_dir: dir,
        into,
        open_ms: ms(open),
        import,
        import_ms,
        tree,
        tree_ms,
        cat,
        outbox_stats,
        stats_ms,
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
        "opened the store in {} ms\n\
         imported {} into {} in {} ms: {} nodes written, {} unchanged, {} relations, {} events\n",
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
    s.push_str(&format!("\n$ ce outbox stats    ({} ms)\n", o.stats_ms));
    s.push_str(&output::outbox_stats(&o.outbox_stats));
    s
}
