//! Command-line arguments (clap derive). Values with a domain meaning (URIs, levels, types,
//! modes, statuses) are taken as plain text here and parsed by the core types in
//! `commands`, so that bad input gets the same typed error (and exit code) as everywhere else.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::bench::BenchOutboxArgs;
use crate::bench_ingest::BenchIngestArgs;
use crate::bench_pipeline::BenchPipelineArgs;
use crate::bench_retrieval::BenchRetrievalArgs;
use crate::eval::EvalArgs;
use crate::jobs::JobsCommand;
use crate::kb::KbCommand;
use crate::repair::RepairCommand;

/// ContextEngine: a context database for AI agents.
#[derive(Debug, Parser)]
#[command(name = "ce", version)]
pub struct Cli {
    /// Data directory holding the store (`ce.db`) [default: ./ce-data].
    #[arg(
        long,
        global = true,
        env = "CE_DATA_DIR",
        value_name = "DIR",
        display_order = 900
    )]
    pub data_dir: Option<PathBuf>,
    /// Source of truth: a postgres:// or postgresql:// URL, overriding `store.url`
    /// [default: the embedded SQLite file in the data directory].
    #[arg(
        long,
        global = true,
        env = "CE_STORE",
        hide_env_values = true,
        value_name = "URL",
        display_order = 900
    )]
    pub store: Option<String>,
    /// Configuration file [default: <data-dir>/ce.toml when it exists, else built-in defaults].
    #[arg(
        long,
        global = true,
        env = "CE_CONFIG",
        value_name = "FILE",
        display_order = 901
    )]
    pub config: Option<PathBuf>,
    /// Print one JSON document (errors as JSON on stderr).
    #[arg(long, global = true, display_order = 902)]
    pub json: bool,
    /// Send the command to a running `ce serve` at URL (e.g. http://127.0.0.1:7420) instead of
    /// opening the data directory.
    #[arg(
        long,
        global = true,
        env = "CE_SERVER",
        value_name = "URL",
        display_order = 903
    )]
    pub server: Option<String>,
    /// API key sent to the `--server` with every request (`Authorization: Bearer KEY`);
    /// needed when the server has `[[server.api_keys]]`.
    #[arg(
        long,
        global = true,
        env = "CE_API_KEY",
        hide_env_values = true,
        value_name = "KEY",
        display_order = 905
    )]
    pub api_key: Option<String>,
    /// More detail in human output: every event id of a write.
    #[arg(long, short = 'v', global = true, display_order = 906)]
    pub verbose: bool,
    /// Log format on stderr: human or json (level from $CE_LOG, e.g. `info`, `debug`).
    #[arg(
        long,
        global = true,
        value_name = "FORMAT",
        default_value = "human",
        display_order = 904
    )]
    pub log_format: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands that work on the data directory only: `--server` and `--api-key` do not
/// apply to them, so their help does not list the two (given anyway, the command says so).
pub const LOCAL_ONLY: [&str; 8] = [
    "import", "export", "demo", "bench", "eval", "serve", "worker", "migrate",
];

/// The global options that only matter with a server.
const REMOTE_OPTIONS: [&str; 2] = ["server", "api_key"];

/// The clap command of [`Cli`], with the remote options hidden from the local-only commands.
///
/// Clap has no per-subcommand switch for a global option, and changing arguments after the
/// command is built breaks its lookup tables. So each local-only command gets, before the
/// build, a hidden non-global copy of each remote option: the global one is then not
/// propagated to it (clap skips an id the subcommand has), the option stays accepted there
/// and its value still reaches [`Cli`], where the command refuses it with a reason.
pub fn command() -> clap::Command {
    let cmd = Cli::command();
    let hidden: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| REMOTE_OPTIONS.contains(&a.get_id().as_str()))
        .map(|a| a.clone().global(false).hide(true))
        .collect();
    LOCAL_ONLY.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |sub| sub.args(hidden.iter().cloned()))
    })
}

/// Parses the process arguments (exits with clap's usage error, or prints help).
pub fn parse() -> Cli {
    use clap::FromArgMatches as _;
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The `ce` commands.
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing would only add noise"
)]
pub enum Command {
    /// Create or change a node (missing ancestors are created as containers).
    Put(PutArgs),
    /// Print one text layer of a node.
    Cat(CatArgs),
    /// Print a node's attributes and sizes.
    Stat(UriArg),
    /// List the direct children of a node (the root lists accounts).
    Ls(LsArgs),
    /// Print a node and its descendants.
    Tree(TreeArgs),
    /// Remove a node (`-r` for a node with children).
    Rm(RmArgs),
    /// Move a node and its subtree.
    Mv(MvArgs),
    /// Add or update a typed relation between two nodes.
    Link(LinkArgs),
    /// Remove a typed relation.
    Unlink(UnlinkArgs),
    /// Print a node's outgoing and incoming relations.
    Relations(UriArg),
    /// A node's edges from the relation index, strongest first, checked against the source.
    Related(RelatedArgs),
    /// Search the indexes (hybrid by default: vector and keyword, fused); hits are checked
    /// against the source of truth.
    Search(SearchArgs),
    /// Inspect or repair the outbox.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Readiness, model, index size, and outbox progress and lag per consumer.
    Status,
    /// Apply the pending schema migrations of the store (`--store` / `store.url`) and print
    /// its schema version before and after.
    Migrate,
    /// Retrieval quality on a BEIR-format data set: nDCG@k, recall@k, MRR@k, recall@100 and
    /// latency per search mode (the corpus is indexed in --data-dir, kept, else in a temporary
    /// data directory).
    Eval(EvalArgs),
    /// Rebuild an index from the source of truth (embedding cache makes it cheap), as a
    /// `reindex` job.
    Reindex(ReindexArgs),
    /// Durable jobs: list, show, cancel, retry (docs/jobs.md).
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Knowledge bases: add files, directories, URLs and notes, and index them
    /// (docs/ingestion.md).
    #[command(subcommand)]
    Kb(KbCommand),
    /// Repair jobs: requeue or force-done dead deliveries; reconcile the indexes with the
    /// source of truth (docs/repair.md).
    #[command(subcommand)]
    Repair(RepairCommand),
    /// Sessions: append messages, commit (archive + memory extraction) (docs/sessions.md).
    #[command(subcommand)]
    Session(crate::session::SessionCommand),
    /// Run the HTTP server (API, health, readiness, metrics) with the index workers.
    Serve(ServeArgs),
    /// Run index workers and the job runner against the data directory (without the HTTP
    /// server).
    Worker(WorkerArgs),
    /// Serve MCP (Model Context Protocol) over stdin / stdout for an agent: on the data
    /// directory with its index workers, or bridged to `--server URL`'s `/mcp`
    /// (docs/mcp.md).
    Mcp(McpArgs),
    /// Import a directory in the node layout into a subtree.
    Import(ImportArgs),
    /// Export a subtree into a directory in the node layout.
    Export(ExportArgs),
    /// Import the shipped demo tree into ctx://demo and show it.
    Demo(DemoArgs),
    /// Benchmarks that print JSON figures.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// A single URI argument.
#[derive(Debug, Args)]
pub struct UriArg {
    /// Node URI, e.g. ctx://acc1/users/u1/memories/preferences/theme.
    pub uri: String,
}

/// `ce put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// Node URI.
    pub uri: String,
    /// L0 abstract text.
    #[arg(
        long = "abstract",
        value_name = "TEXT",
        conflicts_with = "abstract_file"
    )]
    pub abstract_text: Option<String>,
    /// Read the L0 abstract from a file (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub abstract_file: Option<PathBuf>,
    /// L1 overview text.
    #[arg(long, value_name = "TEXT", conflicts_with = "overview_file")]
    pub overview: Option<String>,
    /// Read the L1 overview from a file (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub overview_file: Option<PathBuf>,
    /// L2 content text.
    #[arg(long, value_name = "TEXT", conflicts_with = "content_file")]
    pub content: Option<String>,
    /// Read the L2 content from a file (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub content_file: Option<PathBuf>,
    /// Context type: memory, resource, skill or session [default: from the path].
    #[arg(long = "type", value_name = "TYPE")]
    pub context_type: Option<String>,
    /// Category [default: from the path].
    #[arg(long, value_name = "C")]
    pub category: Option<String>,
    /// Owner space: user:ID, agent:ID or shared [default: from the path].
    #[arg(long, value_name = "SPACE")]
    pub owner_space: Option<String>,
    /// Metadata entry with a string value (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// How to combine with an existing node: replace, merge or append.
    #[arg(long, value_name = "MODE", default_value = "replace")]
    pub mode: String,
    /// Fail unless the stored version is N (0 = the node must not exist).
    #[arg(long, value_name = "N")]
    pub expect_version: Option<u64>,
    /// Trace id recorded on the node and its events [default: generated].
    #[arg(long, value_name = "T")]
    pub trace_id: Option<String>,
    /// Drop the client's L0 (abstract) so that the derive consumer writes it again.
    #[arg(long, conflicts_with_all = ["abstract_text", "abstract_file"])]
    pub derive_abstract: bool,
    /// Drop the client's L1 (overview) so that the derive consumer writes it again.
    #[arg(long, conflicts_with_all = ["overview", "overview_file"])]
    pub derive_overview: bool,
}

/// `ce cat`.
#[derive(Debug, Args)]
pub struct CatArgs {
    /// Node URI.
    pub uri: String,
    /// Layer: 0 abstract, 1 overview, 2 content.
    #[arg(
        long,
        value_name = "LEVEL",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub level: i64,
}

/// `ce ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Node URI.
    #[arg(default_value = "ctx://")]
    pub uri: String,
}

/// `ce tree`.
#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Root of the listing.
    pub uri: String,
    /// Levels below the root to show [default: all].
    #[arg(long, value_name = "N")]
    pub depth: Option<u32>,
}

/// `ce rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Node URI.
    pub uri: String,
    /// Remove the whole subtree.
    #[arg(short, long)]
    pub recursive: bool,
    /// Fail unless the stored version is N.
    #[arg(long, value_name = "N")]
    pub expect_version: Option<u64>,
}

/// `ce mv`.
#[derive(Debug, Args)]
pub struct MvArgs {
    /// Current URI.
    pub from: String,
    /// New URI (must not exist; must not lie inside FROM).
    pub to: String,
}

/// `ce link`.
#[derive(Debug, Args)]
pub struct LinkArgs {
    /// Source node.
    pub from: String,
    /// Target node.
    pub to: String,
    /// Relation type, e.g. references.
    #[arg(long = "type", value_name = "T")]
    pub relation_type: String,
    /// Weight.
    #[arg(
        long,
        value_name = "W",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub weight: f64,
    /// Why the relation exists.
    #[arg(long, value_name = "R", default_value = "")]
    pub reason: String,
}

/// `ce unlink`.
#[derive(Debug, Args)]
pub struct UnlinkArgs {
    /// Source node.
    pub from: String,
    /// Target node.
    pub to: String,
    /// Relation type.
    #[arg(long = "type", value_name = "T")]
    pub relation_type: String,
}

/// `ce outbox ...`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List deliveries (one row per event and consumer), in sequence order.
    List(OutboxListArgs),
    /// Show one event and its deliveries.
    Show(OutboxShowArgs),
    /// Delivery counts and lag per consumer.
    Stats,
    /// Append an event by hand (admin / repair).
    Append(OutboxAppendArgs),
}

/// `ce outbox list`.
#[derive(Debug, Args)]
pub struct OutboxListArgs {
    /// Only this status: pending, claimed, retry_wait, done, failed or dead.
    #[arg(long, value_name = "STATUS")]
    pub status: Option<String>,
    /// Only this consumer.
    #[arg(long, value_name = "C")]
    pub consumer: Option<String>,
    /// Only this event type, e.g. UPSERT_CONTEXT.
    #[arg(long = "type", value_name = "EVENT_TYPE")]
    pub event_type: Option<String>,
    /// Only rows after this sequence number (paging: the last row's seq).
    #[arg(long, value_name = "SEQ")]
    pub after: Option<i64>,
    /// With --after: continue after this consumer's row of that event (the last row's
    /// consumer), so a page boundary inside one event skips nothing.
    #[arg(long, value_name = "CONSUMER", requires = "after")]
    pub after_consumer: Option<String>,
    /// At most N rows, 1-10000 (page with --after for more) [default: 100].
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
}

/// `ce outbox show`.
#[derive(Debug, Args)]
pub struct OutboxShowArgs {
    /// Event id (evt-...) or sequence number.
    pub id: String,
}

/// `ce outbox append`.
#[derive(Debug, Args)]
pub struct OutboxAppendArgs {
    /// Event type: UPSERT_CONTEXT, DELETE_CONTEXT, MOVE_CONTEXT or UPSERT_RELATION.
    #[arg(long = "type", value_name = "EVENT_TYPE")]
    pub event_type: String,
    /// Payload as a JSON object.
    #[arg(long, value_name = "JSON")]
    pub payload: String,
}

/// `ce search`.
#[derive(Debug, Clone, Args)]
pub struct SearchArgs {
    /// The query text.
    pub query: String,
    /// Only records of this level (0, 1 or 2).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub level: Option<i64>,
    /// Filter KEY=VALUE, repeatable: subtree, parent_uri, context_type, category,
    /// owner_space (repeat for any of several), account_id, level, or any metadata key.
    #[arg(long = "filter", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// Number of nodes to return (1-100).
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub top_k: usize,
    /// Only nodes at or below this URI.
    #[arg(long, value_name = "URI")]
    pub subtree: Option<String>,
    /// Skip vector candidates below this cosine similarity (-1..1; not in keyword mode).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub min_score: Option<f32>,
    /// vector, keyword or hybrid (default: retrieval.default_mode; `auto` = hybrid when both
    /// indexes serve, keyword with a notice when the vector index cannot), or hierarchical
    /// (descend the best containers; leaves with their path).
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// Hierarchical mode: weight of a node's own score against its parent's (0-1, default 0.5).
    #[arg(long, value_name = "A")]
    pub alpha: Option<f32>,
}

/// `ce related`.
#[derive(Debug, Args)]
pub struct RelatedArgs {
    /// The node.
    pub uri: String,
    /// Only edges of this relation type.
    #[arg(long = "type", value_name = "T")]
    pub relation_type: Option<String>,
    /// out (the node owns the edge), in, or both.
    #[arg(long, value_name = "D", default_value = "out")]
    pub direction: String,
    /// At most this many edges (1-1000).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,
}

/// `ce reindex`.
#[derive(Debug, Args)]
pub struct ReindexArgs {
    /// The consumer whose index to rebuild.
    #[arg(long, value_name = "C", default_value = "vector")]
    pub consumer: String,
    /// Only enqueue the `reindex` job and print its id (a running `ce serve` or `ce worker`,
    /// or `ce worker --once`, runs it); without it the command follows the job, then (locally)
    /// runs the workers until the index is rebuilt.
    #[arg(long)]
    pub no_wait: bool,
    /// Make this data directory the owner of the consumer's embedded index first, in place
    /// of the instance that owns it (its data directory is gone; stop its processes first).
    /// Local only.
    #[arg(long)]
    pub take_over: bool,
}

/// `ce serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Listen address (port 0 picks a free port; the first line on stdout names it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7420")]
    pub bind: String,
    /// Index worker threads.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: usize,
    /// Largest request body in bytes [default: 3 × store.max_layer_bytes + 1 MiB].
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
}

/// `ce mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Index worker threads (local mode).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: usize,
}

/// `ce worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The consumer to work for (default: every configured consumer with an index).
    #[arg(long, value_name = "C")]
    pub consumer: Option<String>,
    /// Worker threads.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: usize,
    /// Run the due jobs and drain the outbox, until neither has work (waiting for the claims
    /// of crashed processes to expire), and exit.
    #[arg(long)]
    pub once: bool,
    /// Report the delta the open events would apply (counts by action, sample URIs) without
    /// claiming, embedding, writing or advancing anything, and exit.
    #[arg(long, conflicts_with = "once")]
    pub dry_run: bool,
    /// With --dry-run: open events examined per consumer, oldest first.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub limit: usize,
}

/// `ce import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Directory in the node layout; it becomes the node INTO.
    pub dir: PathBuf,
    /// Target URI.
    #[arg(long, value_name = "URI")]
    pub into: String,
    /// Also remove nodes under INTO that DIR no longer has (a re-sync; refused over the
    /// delete-safety limits: more than 1000 nodes, or more than 25 % of at least 20).
    #[arg(long)]
    pub prune: bool,
    /// Lift the delete-safety limits of --prune (check that DIR is complete first).
    #[arg(long, requires = "prune")]
    pub allow_large_delete: bool,
    /// Read and compare every file, also those whose size, times and inode are as the last
    /// import of DIR into INTO recorded them (by default such files are not read again);
    /// what is read is recorded for the next import.
    #[arg(long)]
    pub read_all: bool,
}

/// `ce export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Subtree to export.
    pub uri: String,
    /// Target directory (created if missing; must be empty).
    pub dir: PathBuf,
}

/// `ce demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Tree to import [default: examples/demo-tree].
    #[arg(long, value_name = "DIR")]
    pub tree: Option<PathBuf>,
}

/// `ce bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Outbox throughput and claim latency.
    Outbox(BenchOutboxArgs),
    /// Commit → searchable: worker throughput (hash embedder and local model), vector search
    /// latency and recall at 100k, commit→searchable latency at a steady write rate, peak RSS.
    Pipeline(BenchPipelineArgs),
    /// Keyword back-fill of a new consumer over the journal (docs/s), and vector / keyword /
    /// hybrid / hierarchical search latency at 100k nodes.
    Retrieval(BenchRetrievalArgs),
    /// Path locks: acquire + release latency of EXACT and TREE locks, and the grant rate of
    /// one contended path, per provider.
    Locks(BenchLocksArgs),
    /// Derived layers: extractive derivation throughput over 1–5 KB documents, and how many
    /// times a folder is derived when 100 of its children change at once.
    Derive(crate::bench_derive::BenchDeriveArgs),
    /// The user's ingest path: `ce import` of generated documents then `ce worker --once`,
    /// cold and for no-op, 1 % text, 1 % metadata and 1 % delete re-imports (wall seconds,
    /// texts embedded, sizes on disk); with `--source kb`, generated Markdown, HTML, PDF and
    /// code files through `ce kb add` (cold, no-op, 1 % edited, 1 % deleted), parser MB/s
    /// per format, and the pipeline against the raw model.
    Ingest(BenchIngestArgs),
    /// Sessions: append throughput and latency, Phase 1 commit latency at 1,000-message
    /// sessions, Phase 2 cost with a loopback LLM, and duplicates and recall of planted facts.
    Sessions(crate::bench_sessions::BenchSessionsArgs),
    /// The web console's tree page on a large account: p50/p95 of the API calls of its first
    /// screen (and of opening a node) over loopback HTTP, and the size of the embedded assets.
    Ui(crate::bench_ui::BenchUiArgs),
}

/// `ce bench locks`.
#[derive(Debug, Args)]
pub struct BenchLocksArgs {
    /// Acquire + release rounds per measurement.
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Providers to measure (`memory`, `filesystem`, `redis`).
    #[arg(long, value_delimiter = ',', default_value = "memory,filesystem,redis")]
    pub providers: Vec<String>,
    /// Redis server of the `redis` provider.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn help(path: &[&str]) -> String {
        let mut cmd = command();
        // Global options reach the subcommands when the command is built.
        cmd.build();
        let mut sub = &mut cmd;
        for name in path {
            sub = sub.find_subcommand_mut(name).expect("subcommand");
        }
        sub.render_long_help().to_string()
    }

    #[test]
    fn remote_options_are_listed_only_where_they_apply() {
        for path in [
            &["serve"][..],
            &["worker"],
            &["import"],
            &["migrate"],
            &["bench", "outbox"],
        ] {
            let h = help(path);
            assert!(
                !h.contains("--server") && !h.contains("--api-key"),
                "{path:?}: {h}"
            );
            assert!(h.contains("--data-dir"), "{path:?}: {h}");
        }
        for path in [&["put"][..], &["status"], &["outbox", "list"]] {
            let h = help(path);
            assert!(
                h.contains("--server") && h.contains("--api-key"),
                "{path:?}: {h}"
            );
        }
        command().debug_assert();
    }

    #[test]
    fn local_only_names_are_commands() {
        let cmd = command();
        for name in LOCAL_ONLY {
            assert!(cmd.find_subcommand(name).is_some(), "{name}");
        }
    }
}
