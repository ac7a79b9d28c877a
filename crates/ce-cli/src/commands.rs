//! One function per command: parse the arguments with the core types, call the store, and
//! render the answer. Every argument is validated before the first write.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ce_core::{
    Config, ContextNode, CoreError, CtxUri, DeliveryStatus, EventPayload, EventType,
    IndexProjector, Level, Meta, OutboxEventCreate,
};
use ce_lock::LockManager;
use ce_retrieval::{HierarchicalParams, HierarchicalRequest, RelatedRequest, SearchRequest};
use ce_server::guarded::Guarded;
use ce_server::jobs::JobsRun;
use ce_server::jobs::reindex::{ReindexPayload, report_of};
use ce_server::status::{DrainProgress, DrainReport, ReindexReport};
use ce_server::wire::{CatAnswer, JobQueued, PutBody};
use ce_server::{Engine, EngineOptions, Metrics, ServeOptions, ServerError, Source};
use ce_store::{ContextFs, LinkRequest, OutboxFilter, StoreError, layout};
use serde::Serialize;
use serde_json::Value;

use crate::cli::{
    BenchCommand, CatArgs, Cli, Command, ExportArgs, ImportArgs, LinkArgs, LsArgs, MvArgs,
    OutboxAppendArgs, OutboxCommand, OutboxListArgs, PutArgs, ReindexArgs, RelatedArgs, RmArgs,
    SearchArgs, ServeArgs, TreeArgs, UnlinkArgs, WorkerArgs,
};
use crate::error::{CliError, Result};
use crate::output::{self, Rendered};
use crate::{
    bench, bench_ingest, bench_locks, bench_pipeline, bench_retrieval, demo, eval, jobs, remote,
    repair,
};

/// Data directory used when neither `--data-dir` nor `CE_DATA_DIR` is given.
pub const DEFAULT_DATA_DIR: &str = "ce-data";

/// Name of the configuration file looked up in the data directory.
pub const CONFIG_FILE: &str = "ce.toml";

/// Opens the configured store (SQLite or PostgreSQL); commands call it only once their
/// arguments are valid, so that bad input never creates a data directory.
type Open<'a> = &'a dyn Fn() -> Result<Source>;

/// Most worker threads a command may ask for.
const MAX_WORKERS: usize = 64;

/// Runs the parsed command line (against `--server` when given).
pub fn run(cli: &Cli) -> Result<Rendered> {
    if let Some(url) = &cli.server {
        return remote::run(cli, url);
    }
    let open = || open_store(cli);
    match &cli.command {
        Command::Put(a) => put(&open, a, cli.verbose),
        Command::Cat(a) => cat(cli, a),
        Command::Stat(a) => {
            let uri = parse_uri(&a.uri)?;
            let s = open()?.stat(&uri)?;
            Rendered::new(&s, output::stat(&s))
        }
        Command::Ls(LsArgs { uri }) => {
            let uri = parse_uri(uri)?;
            let children = open()?.ls(&uri)?;
            Rendered::new(&children, output::ls(&uri, &children))
        }
        Command::Tree(TreeArgs { uri, depth }) => {
            let uri = parse_uri(uri)?;
            let nodes = open()?.tree(&uri, *depth)?;
            Rendered::new(&nodes, output::tree(&uri, &nodes))
        }
        Command::Rm(a) => rm(cli, a),
        Command::Mv(MvArgs { from, to }) => {
            let (from, to) = (parse_uri(from)?, parse_uri(to)?);
            let (store, locks) = open_locked(cli)?;
            let o = guarded(&store, &locks).mv(&from, &to, None)?;
            Rendered::new(&o, output::outcome(&o, cli.verbose))
        }
        Command::Link(a) => link(&open, a, cli.verbose),
        Command::Unlink(UnlinkArgs {
            from,
            to,
            relation_type,
        }) => {
            let (from, to) = (parse_uri(from)?, parse_uri(to)?);
            let o = open()?.unlink(&from, &to, relation_type, None)?;
            Rendered::new(&o, output::outcome(&o, cli.verbose))
        }
        Command::Relations(a) => {
            let uri = parse_uri(&a.uri)?;
            let r = open()?.relations(&uri)?;
            Rendered::new(&r, output::relations(&uri, &r))
        }
        Command::Outbox(c) => outbox(&open, c),
        Command::Import(a) => import(cli, a),
        Command::Export(a) => export(&open, a),
        Command::Related(a) => {
            let req = related_request(a)?;
            let engine = open_engine(cli, 1, false, "related")?;
            let r = engine.related(&req)?;
            Rendered::new(&r, output::related(&r, output::LOCAL_CATCH_UP))
        }
        Command::Search(a) if is_hierarchical(a) => {
            let req = hierarchical_request(a)?;
            let engine = open_engine(cli, 1, false, "search")?;
            let r = engine.hierarchical(&req)?;
            Rendered::new(&r, output::hierarchical(&r, output::LOCAL_CATCH_UP))
        }
        Command::Search(a) => {
            let req = search_request(a)?;
            let engine = open_engine(cli, 1, false, "search")?;
            let r = engine.search(&req)?;
            Rendered::new(&r, output::search(&r, output::LOCAL_CATCH_UP))
        }
        Command::Status => {
            let engine = observe_engine(cli, 1, "status")?;
            let s = engine.status()?;
            Rendered::new(&s, output::status(&s))
        }
        Command::Migrate => {
            let (data_dir, config) = resolve(cli)?;
            let (_, report) = Source::migrate(&data_dir, &config)?;
            Rendered::new(&report, output::migrate(&report))
        }
        Command::Reindex(a) => reindex(cli, a),
        Command::Jobs(c) => jobs::run(cli, c),
        Command::Kb(c) => crate::kb::run(cli, c),
        Command::Repair(c) => repair::run(cli, c),
        Command::Session(c) => crate::session::run(cli, c),
        Command::Serve(a) => serve(cli, a),
        Command::Worker(a) => worker(cli, a),
        Command::Mcp(a) => {
            check_workers(a.workers, 0)?;
            let (data_dir, config) = resolve(cli)?;
            let engine = start_engine(&data_dir, config, a.workers, "mcp", Vec::new())?;
            ce_server::mcp::serve_stdio(engine)?;
            // Stdout was the protocol: nothing follows it.
            Ok(Rendered::nothing())
        }
        Command::Demo(args) => {
            let started = Instant::now();
            let engine = open_engine(cli, 2, false, "demo")?;
            demo::run(&engine, args, started.elapsed(), cli.json)
        }
        Command::Eval(args) => {
            let (_, config) = resolve(cli)?;
            let report = eval::run(args, config, cli.data_dir.as_deref())?;
            Ok(Rendered {
                human: report.human(),
                json: serde_json::to_value(&report).map_err(|e| CliError::Other(e.into()))?,
            })
        }
        Command::Bench(BenchCommand::Outbox(args)) => {
            let json = bench::run_outbox(args, cli.store.as_deref()).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Pipeline(args)) => {
            let json = bench_pipeline::run_pipeline(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Retrieval(args)) => {
            let json = bench_retrieval::run_retrieval(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Derive(args)) => {
            let json = crate::bench_derive::run_derive(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Ingest(args)) => {
            let json = bench_ingest::run_ingest(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Sessions(args)) => {
            let json = crate::bench_sessions::run_sessions(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Ui(args)) => {
            let json = crate::bench_ui::run_ui(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
        Command::Bench(BenchCommand::Locks(args)) => {
            let json = bench_locks::run_locks(args).map_err(CliError::Other)?;
            Ok(Rendered {
                human: output::json_text(&json),
                json,
            })
        }
    }
}

/// The data directory and the configuration (`--store` overrides `store.url`).
pub(crate) fn resolve(cli: &Cli) -> Result<(PathBuf, Config)> {
    let data_dir = cli
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let mut config = load_config(cli.config.as_deref(), &data_dir)?;
    if let Some(url) = &cli.store {
        config.store.url.clone_from(url);
    }
    // Checked once the override is in: `index.vector.pgvector_url` may rely on it.
    config.validate()?;
    Ok((data_dir, config))
}

/// Resolves the data directory and configuration and opens the configured store.
pub(crate) fn open_store(cli: &Cli) -> Result<Source> {
    let (data_dir, config) = resolve(cli)?;
    Ok(Source::open(&data_dir, &config)?)
}

/// Opens the store and the path locks (rm, mv and import take them, so they exclude the same
/// operations of a server or another `ce` sharing the lock provider: the data directory's
/// lock files, or Redis across hosts).
pub(crate) fn open_locked(cli: &Cli) -> Result<(Source, LockManager)> {
    let (data_dir, config) = resolve(cli)?;
    open_locked_at(&data_dir, &config)
}

/// [`open_locked`] with the data directory and configuration resolved.
fn open_locked_at(data_dir: &Path, config: &Config) -> Result<(Source, LockManager)> {
    // The store first: it creates the data directory, or says why it cannot.
    let store = Source::open(data_dir, config)?;
    let locks = LockManager::from_config(&config.lock, data_dir).map_err(ServerError::from)?;
    Ok((store, locks))
}

fn guarded<'a>(store: &'a Source, locks: &'a LockManager) -> Guarded<'a> {
    Guarded {
        store: store.as_ref(),
        locks,
    }
}

/// Opens the engine (store, embedder, vector index) with `workers` worker threads, running
/// continuously when `run`, else on demand (`drain`).
pub(crate) fn open_engine(cli: &Cli, workers: usize, run: bool, role: &str) -> Result<Engine> {
    open_engine_for(cli, workers, run, role, Vec::new())
}

/// An engine that reads, reports and does work on demand, leaving an embedded index that
/// `ce worker` or `ce serve` holds to that process ([`Engine::observe`]).
pub(crate) fn observe_engine(cli: &Cli, workers: usize, role: &str) -> Result<Engine> {
    let (data_dir, config) = resolve(cli)?;
    let options = EngineOptions {
        workers,
        run_workers: false,
        role: role.to_owned(),
        consumers: Vec::new(),
    };
    Ok(Engine::observe(&data_dir, config, options)?)
}

/// An engine whose workers serve `consumers` (empty: all with an index).
fn open_engine_for(
    cli: &Cli,
    workers: usize,
    run: bool,
    role: &str,
    consumers: Vec<String>,
) -> Result<Engine> {
    let (data_dir, config) = resolve(cli)?;
    let options = EngineOptions {
        workers,
        run_workers: run,
        role: role.to_owned(),
        consumers,
    };
    Ok(Engine::open_with(&data_dir, config, options)?)
}

/// How long a long-running process keeps trying to open its engine while the store is
/// unavailable ([`ServerError::is_store_unavailable`]) before it gives up.
const START_RETRY_FOR: Duration = Duration::from_secs(60);
/// The longest pause between two attempts.
const START_RETRY_MAX_PAUSE: Duration = Duration::from_secs(5);

/// An engine running continuously (`ce serve`, `ce worker`): `workers` per consumer of
/// `consumers` (empty: all with an index), and the job runner. A store that
/// cannot be reached for now (its database restarting, a connection dropped mid-start) is
/// waited out for up to [`START_RETRY_FOR`], each failed attempt logged as a warning; any
/// other error (bad configuration, a consumer owned elsewhere) ends the process at once.
fn start_engine(
    data_dir: &Path,
    config: Config,
    workers: usize,
    role: &str,
    consumers: Vec<String>,
) -> Result<Arc<Engine>> {
    let options = EngineOptions {
        workers,
        run_workers: true,
        role: role.to_owned(),
        consumers,
    };
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match Engine::open_shared(data_dir, config.clone(), options.clone()) {
            Err(e) if e.is_store_unavailable() && started.elapsed() + pause < START_RETRY_FOR => {
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, gives_up_after_s = START_RETRY_FOR.as_secs(), "the store is unavailable: starting again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(START_RETRY_MAX_PAUSE);
            }
            opened => return Ok(opened?),
        }
    }
}

fn check_workers(n: usize, min: usize) -> Result<()> {
    if n < min || n > MAX_WORKERS {
        return Err(CoreError::InvalidField {
            field: "workers",
            reason: format!("{n} is outside {min}..={MAX_WORKERS}"),
        }
        .into());
    }
    Ok(())
}

pub(crate) fn check_consumer(consumer: &str) -> Result<()> {
    let known = ce_server::engine::consumers::names();
    if !known.contains(&consumer) {
        return Err(ServerError::UnsupportedConsumer {
            name: consumer.to_owned(),
            reason: format!("this build has indexes and workers for {known:?} only"),
        }
        .into());
    }
    Ok(())
}

/// `--config FILE` / `CE_CONFIG`, else `<data-dir>/ce.toml` when it exists, else defaults;
/// not validated yet (see [`resolve`]).
fn load_config(explicit: Option<&Path>, data_dir: &Path) -> Result<Config> {
    let in_data_dir = data_dir.join(CONFIG_FILE);
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if in_data_dir.is_file() => in_data_dir,
        None => return Ok(Config::default()),
    };
    let text = fs_err::read_to_string(&path)?;
    Ok(Config::parse_toml(&text)?)
}

/// Parses a URI argument into its canonical form (bad input is `CoreError::InvalidUri`).
pub fn parse_uri(s: &str) -> Result<CtxUri> {
    Ok(CtxUri::parse(s).map_err(CoreError::from)?)
}

fn put(open: Open<'_>, a: &PutArgs, verbose: bool) -> Result<Rendered> {
    let (uri, req) = put_body(a)?.into_request()?;
    let o = open()?.put(&uri, req)?;
    Rendered::new(&o, output::outcome(&o, verbose))
}

/// The `put` request as sent over HTTP (local mode converts it the same way the server
/// does). Reads the `--*-file` arguments.
pub fn put_body(a: &PutArgs) -> Result<PutBody> {
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
    // Checked before any file is read, in the order the local command always had.
    a.mode.parse::<ce_store::PutMode>()?;
    if let Some(t) = &a.context_type {
        t.parse::<ce_core::ContextType>()?;
    }
    if let Some(o) = &a.owner_space {
        o.parse::<ce_core::OwnerSpace>()?;
    }
    let meta = parse_meta(&a.meta)?;
    Ok(PutBody {
        uri: uri.to_string(),
        mode: Some(a.mode.clone()),
        context_type: a.context_type.clone(),
        category: a.category.clone(),
        owner_space: a.owner_space.clone(),
        meta,
        expect_version: a.expect_version,
        trace_id: a.trace_id.clone(),
        abstract_text: text_arg(&a.abstract_text, &a.abstract_file)?,
        overview: text_arg(&a.overview, &a.overview_file)?,
        content: text_arg(&a.content, &a.content_file)?,
        derive: [
            (a.derive_abstract, ce_core::Level::L0),
            (a.derive_overview, ce_core::Level::L1),
        ]
        .into_iter()
        .filter_map(|(asked, level)| asked.then_some(level))
        .collect(),
    })
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

fn cat(cli: &Cli, a: &CatArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let level = Level::from_i64(a.level)?;
    let (data_dir, config) = resolve(cli)?;
    let node = read_node(Source::open(&data_dir, &config)?.as_ref(), &uri)?;
    let out = CatAnswer::of(&node, level, &IndexProjector::new(config.projector));
    output::print_cat_note(&out, cli.json);
    Rendered::new(&out, output::cat_text(&out))
}

/// Reads a node that must exist.
pub fn read_node(store: &dyn ContextFs, uri: &CtxUri) -> Result<ContextNode> {
    store
        .read_node(uri)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() }.into())
}

fn rm(cli: &Cli, a: &RmArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let (store, locks) = open_locked(cli)?;
    let o = guarded(&store, &locks).rm(&uri, a.recursive, a.expect_version, None)?;
    Rendered::new(&o, output::outcome(&o, cli.verbose))
}

fn link(open: Open<'_>, a: &LinkArgs, verbose: bool) -> Result<Rendered> {
    let req = LinkRequest {
        from: parse_uri(&a.from)?,
        to: parse_uri(&a.to)?,
        relation_type: a.relation_type.clone(),
        weight: a.weight,
        reason: a.reason.clone(),
        trace_id: None,
    };
    let o = open()?.link(req)?;
    Rendered::new(&o, output::outcome(&o, verbose))
}

fn outbox(open: Open<'_>, c: &OutboxCommand) -> Result<Rendered> {
    match c {
        OutboxCommand::List(a) => outbox_list(open, a),
        OutboxCommand::Show(a) => {
            let (event, deliveries) = open()?.show(a.id.trim())?;
            let text = output::outbox_show(&event, &deliveries);
            Rendered::new(
                &ce_server::wire::OutboxShowAnswer { event, deliveries },
                text,
            )
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
    ce_store::check_list_limit(filter.limit)?;
    let rows = open()?.list(&filter)?;
    Rendered::new(&rows, output::outbox_list(&rows))
}

fn outbox_append(open: Open<'_>, a: &OutboxAppendArgs) -> Result<Rendered> {
    let (event_type, json) = append_payload(&a.event_type, &a.payload)?;
    let payload = EventPayload::parse(event_type.as_str(), &json)?;
    let event = open()?.append(OutboxEventCreate { payload })?;
    Rendered::new(&event, output::event_kv(&event))
}

/// Checks an `outbox append`'s type and payload; returns them parsed.
pub fn append_payload(event_type: &str, payload: &str) -> Result<(EventType, Value)> {
    let event_type: EventType = event_type.parse()?;
    let json: Value = serde_json::from_str(payload).map_err(|e| CoreError::InvalidPayload {
        event_type: event_type.as_str(),
        reason: format!("not valid JSON: {e}"),
    })?;
    EventPayload::parse(event_type.as_str(), &json)?;
    Ok((event_type, json))
}

/// The request a `ce related` asks for.
pub fn related_request(a: &RelatedArgs) -> Result<RelatedRequest> {
    Ok(RelatedRequest {
        uri: parse_uri(&a.uri)?,
        relation_type: a.relation_type.clone(),
        direction: a.direction.parse()?,
        limit: a.limit,
    })
}

/// Whether `ce search` asks for hierarchical search (`--mode hierarchical`).
pub fn is_hierarchical(a: &SearchArgs) -> bool {
    a.mode.as_deref() == Some(ce_server::wire::HIERARCHICAL_MODE)
}

/// The hierarchical search a `ce search --mode hierarchical` asks for (validated).
pub fn hierarchical_request(a: &SearchArgs) -> Result<HierarchicalRequest> {
    let mut params = HierarchicalParams::default();
    if let Some(alpha) = a.alpha {
        params.alpha = alpha;
    }
    params.validate().map_err(ServerError::from)?;
    let flat = SearchArgs {
        mode: None,
        ..a.clone()
    };
    Ok(HierarchicalRequest {
        search: search_request(&flat)?,
        params,
    })
}

/// The search a `ce search` asks for (validated).
pub fn search_request(a: &SearchArgs) -> Result<SearchRequest> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    if let Some(l) = a.level {
        pairs.push(("level".into(), Level::from_i64(l)?.as_u8().to_string()));
    }
    if let Some(s) = &a.subtree {
        pairs.push(("subtree".into(), s.clone()));
    }
    for f in &a.filters {
        let (k, v) = f.split_once('=').ok_or_else(|| CoreError::InvalidField {
            field: "filter",
            reason: format!("{f:?} must be KEY=VALUE"),
        })?;
        pairs.push((k.to_owned(), v.to_owned()));
    }
    let filter =
        ce_retrieval::filter_from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let req = SearchRequest {
        query: a.query.clone(),
        top_k: a.top_k,
        filter,
        min_score: a.min_score,
        embed_timeout: ce_retrieval::DEFAULT_EMBED_TIMEOUT,
        mode: a.mode.as_deref().map(str::parse).transpose()?,
    };
    req.validate().map_err(ServerError::from)?;
    Ok(req)
}

/// Drain progress on stderr, in both modes (stdout holds only the final answer): a line at
/// most every 200 ms — text, or one JSON object per line with `--json` — and always a last
/// line with the final totals.
pub struct Progress {
    json: bool,
    label: &'static str,
    /// When the last line was printed, and what it said.
    last: Mutex<Option<(Instant, DrainProgress)>>,
}

impl Progress {
    /// Progress of the drain named `label` (`worker`, `reindex`, ...).
    pub fn new(json: bool, label: &'static str) -> Self {
        Progress {
            json,
            label,
            last: Mutex::new(None),
        }
    }

    /// Reports totals so far (called after every batch, from any worker thread).
    pub fn update(&self, p: &DrainProgress) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|(t, _)| t.elapsed() < Duration::from_millis(200)) {
            return;
        }
        self.print(p);
        *last = Some((Instant::now(), *p));
    }

    /// Reports the final totals, unless the last line already said them.
    pub fn finish(&self, p: &DrainProgress) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let said = last.is_some_and(|(_, q)| {
            (q.events, q.succeeded, q.retried, q.failed)
                == (p.events, p.succeeded, p.retried, p.failed)
        });
        if !said {
            self.print(p);
            *last = Some((Instant::now(), *p));
        }
    }

    fn print(&self, p: &DrainProgress) {
        let line = if self.json {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            v["progress"] = self.label.into();
            format!("{v}\n")
        } else {
            output::drain_progress(self.label, p)
        };
        output::print_stderr(&line);
    }
}

/// Runs `engine`'s workers until the outbox is drained, with progress on stderr.
pub fn drain_with_progress(
    engine: &Engine,
    json: bool,
    label: &'static str,
) -> Result<DrainReport> {
    let progress = Progress::new(json, label);
    let report = engine.drain(&|p: &DrainProgress| progress.update(p))?;
    progress.finish(&report.progress);
    Ok(report)
}

/// The `--json` answer of a local `ce reindex`.
#[derive(Debug, Serialize)]
struct ReindexOutput<'a> {
    #[serde(flatten)]
    report: &'a ReindexReport,
    /// The `reindex` job that ran it.
    job_id: &'a str,
    /// The workers' run that rebuilt the index.
    drain: &'a DrainReport,
}

/// `ce reindex`: enqueues the `reindex` job; unless `--no-wait`, runs it here (or waits for
/// the runner that has it), then the workers until the index is rebuilt.
fn reindex(cli: &Cli, a: &ReindexArgs) -> Result<Rendered> {
    let payload = ReindexPayload::new(&a.consumer, a.take_over)?;
    let engine = open_engine(cli, ce_server::engine::DEFAULT_WORKERS, false, "reindex")?;
    let queued = JobQueued::from(engine.enqueue_job(payload.spec())?);
    if a.no_wait {
        engine.shutdown();
        return jobs::queued(&queued);
    }
    let job = engine.follow_job(&queued.job_id, true, &|j| {
        jobs::print_progress(j, cli.json, "reindex");
    })?;
    if let Some(e) = ce_server::jobs::job_error(&job) {
        return Err(e.into());
    }
    let report = report_of(&job)?;
    // Rebuilding the vector index may embed the whole corpus: say so before it starts.
    if !cli.json
        && let Some(model) = &report.model
    {
        output::print_stderr(&format!(
            "reindex: {} {} queued for the vector index; their texts (up to 3 per node) are \
             embedded with {} unless the embedding cache has them\n",
            report.requeued,
            if report.requeued == 1 {
                "node"
            } else {
                "nodes"
            },
            model.model
        ));
    }
    let drain = drain_with_progress(&engine, cli.json, "reindex")?;
    engine.shutdown();
    let out = ReindexOutput {
        report: &report,
        job_id: &job.id,
        drain: &drain,
    };
    Rendered::new(&out, output::reindex(&report, Some(&drain), &job.id))
}

/// Draining the vector consumer may embed a whole corpus: says how many deliveries are open
/// and with which model, before the first one runs.
fn warn_before_embedding(engine: &Engine) -> Result<()> {
    let Ok(embedder) = engine.embedder() else {
        return Ok(());
    };
    let open: u64 = engine
        .store()
        .stats()?
        .iter()
        .filter(|s| s.consumer == "vector")
        .map(|s| s.pending + s.claimed + s.retry_wait)
        .sum();
    if open > 0 {
        output::print_stderr(&format!(
            "worker: {open} vector {} to apply; their texts are embedded with {} unless the \
             embedding cache has them\n",
            if open == 1 { "event" } else { "events" },
            ce_embed::Embedder::identity(embedder.as_ref()).model
        ));
    }
    Ok(())
}

/// The `--json` answer of `ce worker --once`.
#[derive(Debug, Serialize)]
struct OnceOutput<'a> {
    #[serde(flatten)]
    report: &'a DrainReport,
    /// The jobs it ran.
    jobs: &'a JobsRun,
}

fn serve(cli: &Cli, a: &ServeArgs) -> Result<Rendered> {
    check_workers(a.workers, 0)?;
    let (data_dir, config) = resolve(cli)?;
    // The whole configuration, API keys from the environment included, before anything
    // starts (no worker runs for a server that cannot serve).
    let mut options = ServeOptions::for_config(&config)?;
    options.bind.clone_from(&a.bind);
    // A literal address is checked now too (a host name only once it is bound).
    if let Ok(addr) = a.bind.parse::<std::net::SocketAddr>() {
        ce_server::http::auth::check_bind(addr, &options.keys, &config.server)?;
    }
    if let Some(m) = a.max_body_bytes {
        options.max_body_bytes = m;
    }
    let metrics = Metrics::install()?;
    let engine = start_engine(&data_dir, config, a.workers, "serve", Vec::new())?;
    let json = cli.json;
    ce_server::serve(engine, Some(metrics), &options, |addr| {
        // The first line on stdout names the bound address (port 0 picks one).
        let line = if json {
            format!("{}\n", serde_json::json!({ "listening": addr.to_string() }))
        } else {
            format!("listening on {addr}\n")
        };
        let _ = output::print_stdout(&line);
    })?;
    Ok(Rendered {
        json: serde_json::json!({ "stopped": true }),
        human: "stopped\n".into(),
    })
}

fn worker(cli: &Cli, a: &WorkerArgs) -> Result<Rendered> {
    if let Some(c) = &a.consumer {
        check_consumer(c)?;
    }
    check_workers(a.workers, 1)?;
    let consumers: Vec<String> = a.consumer.iter().cloned().collect();
    if a.dry_run {
        let engine = open_engine_for(cli, a.workers, false, "worker", consumers.clone())?;
        let names: Vec<String> = if consumers.is_empty() {
            // Every configured consumer that has a dry run.
            engine
                .dry_run_consumers()
                .into_iter()
                .map(str::to_owned)
                .collect()
        } else {
            consumers
        };
        let reports = names
            .iter()
            .map(|c| engine.dry_run(c, a.limit))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        engine.shutdown();
        return Rendered::new(&reports, output::dry_runs(&reports));
    }
    if a.once {
        let drains_vector = consumers.is_empty() || consumers.iter().any(|c| c == "vector");
        let engine = open_engine_for(cli, a.workers, false, "worker", consumers)?;
        if !cli.json && drains_vector {
            warn_before_embedding(&engine)?;
        }
        let progress = Progress::new(cli.json, "worker");
        let (report, jobs_run) =
            engine.drain_jobs_and_deliveries(&|p: &DrainProgress| progress.update(p))?;
        progress.finish(&report.progress);
        engine.shutdown();
        // The ready consumers were drained; one that could not run fails the command.
        let blocked: Vec<String> = report
            .remaining
            .iter()
            .filter(|r| r.validation == ce_server::status::Validation::Blocked)
            .map(|r| format!("{} is blocked: {}", r.consumer, r.validation_reason))
            .collect();
        if !blocked.is_empty() {
            let code = if engine.readiness().ready {
                ce_core::ErrorCode::Unavailable
            } else {
                engine.not_ready_code()
            };
            return Err(ServerError::NotReady {
                reason: format!(
                    "drained {} events ({} deliveries); {}",
                    report.progress.events,
                    report.progress.succeeded,
                    blocked.join("; ")
                ),
                code,
            }
            .into());
        }
        let text = format!(
            "{}{}",
            output::drain(&report),
            output::kv(&[("jobs", jobs::run_text(&jobs_run))])
        );
        return Rendered::new(
            &OnceOutput {
                report: &report,
                jobs: &jobs_run,
            },
            text,
        );
    }
    let (data_dir, config) = resolve(cli)?;
    let engine = start_engine(&data_dir, config, a.workers, "worker", consumers)?;
    if engine.running_workers() == 0 {
        let r = engine.readiness();
        let reason = if r.ready {
            "index.worker.enabled is false".to_owned()
        } else {
            r.reasons.join("; ")
        };
        return Err(ServerError::NotReady {
            reason: format!("no worker started: {reason}"),
            code: ce_core::ErrorCode::Unavailable,
        }
        .into());
    }
    // What runs is known without the store (which may be gone for a moment already).
    let consumers = engine.worker_consumers();
    let served = consumers.join(", ");
    let jobs = engine.job_runner_running();
    let line = if cli.json {
        format!(
            "{}\n",
            serde_json::json!({"workers": engine.running_workers(), "consumers": consumers, "job_runner": jobs})
        )
    } else {
        format!(
            "{} workers running for {served}, {} (stop with Ctrl-C)\n",
            engine.running_workers(),
            if jobs {
                "and the job runner"
            } else {
                "no job runner (jobs.enabled is false)"
            }
        )
    };
    output::print_stdout(&line)?;
    ce_server::http::wait_for_shutdown_signal()?;
    engine.shutdown();
    Ok(Rendered {
        json: serde_json::json!({ "stopped": true }),
        human: "stopped\n".into(),
    })
}

/// Where in the data directory `ce import` keeps its stat caches (docs/store.md).
const IMPORT_STAT_DIR: &str = "import-stat";

fn import(cli: &Cli, a: &ImportArgs) -> Result<Rendered> {
    let into = parse_uri(&a.into)?;
    let (data_dir, config) = resolve(cli)?;
    let (store, locks) = open_locked_at(&data_dir, &config)?;
    let stat_cache = layout::stat_cache_file(
        &data_dir.join(IMPORT_STAT_DIR),
        &config.store.url,
        &a.dir,
        &into,
    );
    let options = layout::ImportOptions {
        prune: a.prune,
        allow_large_delete: a.allow_large_delete,
        stat_cache: Some(stat_cache),
        read_all: a.read_all,
    };
    let (report, hold) = guarded(&store, &locks).import(&a.dir, &into, options)?;
    let mut json = serde_json::to_value(&report).map_err(|e| CliError::Other(e.into()))?;
    json["hold"] = hold.clone().into();
    let held = match &hold {
        Some(id) => format!("{id} (locks {into} until indexed)"),
        None => "none (nothing changed: nothing to index)".into(),
    };
    let human = format!("{}hold                {held}\n", output::import(&report));
    Ok(Rendered { json, human })
}

fn export(open: Open<'_>, a: &ExportArgs) -> Result<Rendered> {
    let uri = parse_uri(&a.uri)?;
    let report = layout::export_tree(open()?.as_ref(), &uri, &a.dir)?;
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
