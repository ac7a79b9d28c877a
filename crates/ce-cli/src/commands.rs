//! One function per command: parse the arguments with the core types, call the store, and
//! render the answer. Every argument is validated before the first write.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ce_core::{
    Config, ContextNode, CoreError, CtxUri, DeliveryStatus, EventPayload, EventType, Level, Meta,
    OutboxEventCreate,
};
use ce_store::{
    ContextFs, LinkRequest, OutboxFilter, OutboxStore, PutRequest, RelationStore, SqliteStore,
    StoreError, layout,
};
use serde::Serialize;

use crate::cli::{
    BenchCommand, CatArgs, Cli, Command, ExportArgs, ImportArgs, LinkArgs, LsArgs, MvArgs,
    OutboxAppendArgs, OutboxCommand, OutboxListArgs, PutArgs, RmArgs, TreeArgs, UnlinkArgs,
};
use crate::error::{CliError, Result};
use crate::output::{self, Rendered};
use crate::{bench, demo};

/// Data directory used when neither `--data-dir` nor `CE_DATA_DIR` is given.
pub const DEFAULT_DATA_DIR: &str = "ce-data";

/// Name of the configuration file looked up in the data directory.
pub const CONFIG_FILE: &str = "ce.toml";

/// Opens the store; commands call it only once their arguments are valid, so that bad input
/// never creates a data directory.
type Open<'a> = &'a dyn Fn() -> Result<SqliteStore>;

/// Runs the parsed command line.
pub fn run(cli: &Cli) -> Result<Rendered> {
    let open = || open_store(cli);
    match &cli.command {
        Command::Put(a) => put(&open, a),
        Command::Cat(a) => cat(&open, a),
        Command::Stat(a) => {
            let uri = parse_uri(&a.uri)?;
            let s = open()?.stat(&uri)?;
            Rendered::new(&s, output::stat(&s))
        }
        Command::Ls(LsArgs { uri }) => {
            let uri = parse_uri(uri)?;
            let children = open()?.ls(&uri)?;
            Rendered::new(&children, output::ls(&children))
        }
        Command::Tree(TreeArgs { uri, depth }) => {
            let uri = parse_uri(uri)?;
            let nodes = open()?.tree(&uri, *depth)?;
            Rendered::new(&nodes, output::tree(&uri, &nodes))
        }
        Command::Rm(a) => rm(&open, a),
        Command::Mv(MvArgs { from, to }) => {
            let (from, to) = (parse_uri(from)?, parse_uri(to)?);
            let o = open()?.mv(&from, &to, None)?;
            Rendered::new(&o, output::outcome(&o))
        }
        Command::Link(a) => link(&open, a),
        Command::Unlink(UnlinkArgs {
            from,
            to,
            relation_type,
        }) => {
            let (from, to) = (parse_uri(from)?, parse_uri(to)?);
            let o = open()?.unlink(&from, &to, relation_type, None)?;
            Rendered::new(&o, output::outcome(&o))
        }
        Command::Relations(a) => {
            let uri = parse_uri(&a.uri)?;
            let r = open()?.relations(&uri)?;
            Rendered::new(&r, output::relations(&uri, &r))
        }
        Command::Outbox(c) => outbox(&open, c),
        Command::Import(a) => import(&open, a),
        Command::Export(a) => export(&open, a),
        Command::Demo(args) => {
            let started = Instant::now();
            let store = open()?;
            demo::run(&store, args, started.elapsed())
        }
        Command::Bench(BenchCommand::Outbox(args)) => {
            let json = bench::run_outbox(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
    }
}

/// Resolves the data directory and configuration and opens the store.
fn open_store(cli: &Cli) -> Result<SqliteStore> {
    let data_dir = cli
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let config = load_config(cli.config.as_deref(), &data_dir)?;
    Ok(SqliteStore::open(&data_dir, config)?)
}

/// `--config FILE` / `CE_CONFIG`, else `<data-dir>/ce.toml` when it exists, else defaults.
fn load_config(explicit: Option<&Path>, data_dir: &Path) -> Result<Config> {
    let in_data_dir = data_dir.join(CONFIG_FILE);
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if in_data_dir.is_file() => in_data_dir,
        None => return Ok(Config::default()),
    };
    let text = fs_err::read_to_string(&path)?;
    Ok(Config::from_toml(&text)?)
}

/// Parses a URI argument into its canonical form (bad input is `CoreError::InvalidUri`).
pub fn parse_uri(s: &str) -> Result<CtxUri> {
    Ok(CtxUri::parse(s).map_err(CoreError::from)?)
}

fn put(open: Open<'_>, a: &PutArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let files = [&a.abstract_file, &a.overview_file, &a.content_file];
    let stdin_readers = files
        .iter()
        .filter(|f| f.as_deref() == Some(Path::new("-")))
        .count();
    if stdin_readers > 1 {
        return Err(CliError::Usage(
            "only one of --abstract-file, --overview-file, --content-file can read stdin (-)"
                .to_owned(),
        ));
    }
    let req = PutRequest {
        mode: a.mode.parse()?,
        context_type: a.context_type.as_deref().map(str::parse).transpose()?,
        category: a.category.clone(),
        owner_space: a.owner_space.as_deref().map(str::parse).transpose()?,
        meta: parse_meta(&a.meta)?,
        expect_version: a.expect_version,
        trace_id: a.trace_id.clone(),
        abstract_text: text_arg(&a.abstract_text, &a.abstract_file)?,
        overview: text_arg(&a.overview, &a.overview_file)?,
        content: text_arg(&a.content, &a.content_file)?,
    };
    let o = open()?.put(&uri, req)?;
    Rendered::new(&o, output::outcome(&o))
}

/// A layer given inline or from a file (`-` reads stdin).
fn text_arg(inline: &Option<String>, file: &Option<PathBuf>) -> Result<Option<String>> {
    match (inline, file) {
        (Some(t), _) => Ok(Some(t.clone())),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| std::io::Error::new(e.kind(), format!("reading stdin: {e}")))?;
            Ok(Some(s))
        }
        (None, Some(p)) => Ok(Some(fs_err::read_to_string(p)?)),
        (None, None) => Ok(None),
    }
}

/// `KEY=VALUE` pairs as string-valued metadata (later keys win).
fn parse_meta(pairs: &[String]) -> Result<Meta> {
    let mut meta = Meta::new();
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CoreError::InvalidField {
                field: "meta",
                reason: format!("{pair:?} must be KEY=VALUE"),
            })?;
        meta.insert(k.to_owned(), serde_json::Value::String(v.to_owned()));
    }
    Ok(meta)
}

/// The `--json` answer of `ce cat`.
#[derive(Debug, Serialize)]
pub struct CatOutput {
    /// Node URI.
    pub uri: CtxUri,
    /// The layer printed.
    pub level: Level,
    /// Node version.
    pub version: u64,
    /// Node content hash.
    pub content_hash: String,
    /// The layer's text (empty when the layer is empty; there is no fallback).
    pub text: String,
}

fn cat(open: Open<'_>, a: &CatArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let level = Level::from_i64(a.level)?;
    let node = read_node(&open()?, &uri)?;
    cat_node(&node, level)
}

/// Reads a node that must exist.
pub fn read_node(store: &SqliteStore, uri: &CtxUri) -> Result<ContextNode> {
    store
        .read_node(uri)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() }.into())
}

/// Renders one layer of `node`.
pub fn cat_node(node: &ContextNode, level: Level) -> Result<Rendered> {
    let out = CatOutput {
        uri: node.uri.clone(),
        level,
        version: node.version,
        content_hash: node.content_hash.clone(),
        text: node.layers.get(level).to_owned(),
    };
    Rendered::new(&out, output::layer_text(node, level))
}

fn rm(open: Open<'_>, a: &RmArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let o = open()?.rm(&uri, a.recursive, a.expect_version, None)?;
    Rendered::new(&o, output::outcome(&o))
}

fn link(open: Open<'_>, a: &LinkArgs) -> Result<Rendered> {
    let req = LinkRequest {
        from: parse_uri(&a.from)?,
        to: parse_uri(&a.to)?,
        relation_type: a.relation_type.clone(),
        weight: a.weight,
        reason: a.reason.clone(),
        trace_id: None,
    };
    let o = open()?.link(req)?;
    Rendered::new(&o, output::outcome(&o))
}

/// The `--json` answer of `ce outbox show`.
#[derive(Debug, Serialize)]
struct ShowOutput<'a> {
    event: &'a ce_core::OutboxEvent,
    deliveries: &'a [ce_core::Delivery],
}

fn outbox(open: Open<'_>, c: &OutboxCommand) -> Result<Rendered> {
    match c {
        OutboxCommand::List(a) => outbox_list(open, a),
        OutboxCommand::Show(a) => {
            let (event, deliveries) = open()?.show(a.id.trim())?;
            let out = ShowOutput {
                event: &event,
                deliveries: &deliveries,
            };
            Rendered::new(&out, output::outbox_show(&event, &deliveries))
        }
        OutboxCommand::Stats => {
            let stats = open()?.stats()?;
            Rendered::new(&stats, output::outbox_stats(&stats))
        }
        OutboxCommand::Append(a) => outbox_append(open, a),
    }
}

fn outbox_list(open: Open<'_>, a: &OutboxListArgs) -> Result<Rendered> {
    let filter = OutboxFilter {
        status: a
            .status
            .as_deref()
            .map(str::parse::<DeliveryStatus>)
            .transpose()?,
        consumer: a.consumer.clone(),
        event_type: a
            .event_type
            .as_deref()
            .map(str::parse::<EventType>)
            .transpose()?,
        after_seq: a.after,
        after_consumer: a.after_consumer.clone(),
        limit: a.limit,
    };
    let rows = open()?.list(&filter)?;
    Rendered::new(&rows, output::outbox_list(&rows))
}

fn outbox_append(open: Open<'_>, a: &OutboxAppendArgs) -> Result<Rendered> {
    let event_type: EventType = a.event_type.parse()?;
    let json: serde_json::Value =
        serde_json::from_str(&a.payload).map_err(|e| CoreError::InvalidPayload {
            event_type: event_type.as_str(),
            reason: format!("not valid JSON: {e}"),
        })?;
    let payload = EventPayload::parse(event_type.as_str(), &json)?;
    let event = open()?.append(OutboxEventCreate { payload })?;
    Rendered::new(&event, output::event_kv(&event))
}

fn import(open: Open<'_>, a: &ImportArgs) -> Result<Rendered> {
    let into = parse_uri(&a.into)?;
    let report = layout::import_dir(&open()?, &a.dir, &into)?;
    Rendered::new(&report, output::import(&report))
}

fn export(open: Open<'_>, a: &ExportArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let report = layout::export_tree(&open()?, &uri, &a.dir)?;
    Rendered::new(&report, output::export(&report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_values_are_strings_and_may_be_empty() {
        let m = parse_meta(&["a=1".into(), "b=".into(), "c=x=y".into(), "d=null".into()])
            .expect("valid pairs");
        assert_eq!(m["a"], serde_json::json!("1"));
        assert_eq!(m["b"], serde_json::json!(""));
        assert_eq!(m["c"], serde_json::json!("x=y"));
        assert_eq!(m["d"], serde_json::json!("null"));
        assert!(matches!(
            parse_meta(&["novalue".into()]),
            Err(CliError::Core(CoreError::InvalidField {
                field: "meta",
                ..
            }))
        ));
    }

    #[test]
    fn config_comes_from_the_data_dir_when_not_given() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            load_config(None, dir.path()).expect("defaults"),
            Config::default()
        );
        std::fs::write(
            dir.path().join(CONFIG_FILE),
            "[store]\nmax_layer_bytes = 2048\n",
        )
        .expect("write config");
        let c = load_config(None, dir.path()).expect("from data dir");
        assert_eq!(c.store.max_layer_bytes, 2048);
        let missing = load_config(Some(&dir.path().join("nope.toml")), dir.path());
        assert!(matches!(missing, Err(CliError::Io(_))), "{missing:?}");
    }
}
