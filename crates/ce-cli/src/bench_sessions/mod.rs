//! `ce bench sessions`: what sessions and memory cost, and whether the merge keeps memories
//! free of duplicates (docs/sessions.md) — JSON out, progress on stderr.
//!
//! Everything runs through the engine's session API (what `ce session add|commit` and the
//! `session-commit` job call), on the embedded defaults (SQLite, the local embedding model,
//! every consumer) in temporary data directories. The LLM is a loopback chat-completions
//! server (real HTTP, the OpenAI wire format, `usage` in every answer) whose answers are
//! scripted: it reads the conversation it is sent and extracts the facts the benchmark
//! planted there, as a model following the prompt would.
//!
//! 0. `similarity`: the merge's "says the same" on measured pairs of facts with the local
//!    model — paraphrases of one planted fact, two facts of one template, hand-written
//!    real-world pairs ([`similarity`]; `--only-similarity` stops after it).
//! 1. `append`: `--sessions` sessions get `--messages` messages each, appended round-robin
//!    (user and assistant turns of varied text, 40–1500 characters): messages/s and latency.
//! 2. `phase1`: each of those sessions is committed (Phase 1 alone, timed): latency at
//!    `--messages` messages per session.
//! 3. `phase2`: each archive's `session-commit` job runs at once after its commit (timed):
//!    chat calls and tokens as the loopback server recorded them and as CE accounted them,
//!    the windows each archive was cut into (`derive.llm.max_input_chars` per call), and how
//!    many of the facts planted in the archive the model was shown.
//! 4. `dedup`: in a fresh directory per mode, `--facts` facts are planted across
//!    `--fact-sessions` sessions, each fact stated in `--mentions` of them (so extracted that
//!    many times), every session committed and its Phase 2 run in turn; then the indexes
//!    drain and every fact is searched for with a query naming it. `cooperative`: the model
//!    reuses the key of a matching memory when the prompt shows it one (as the prompt asks);
//!    `paraphrase`: it invents a fresh key and rewords the fact each time (another of its
//!    three wordings), so only CE's merge rule — term overlap, and the facts' embeddings
//!    gated on their distinctive terms — can catch the duplicate. Reported: memories stating a planted fact more than once
//!    (target 0), memories mixing two facts, and recall (the fact's memory in the top 5).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ce_core::{Config, CtxUri};
use ce_http::loopback::{LoopbackServer, Recorded, Reply};
use ce_server::sessions::AddMessage;
use ce_server::sessions::phase2::Phase2Report;
use ce_server::{Engine, EngineOptions};
use ce_session::layout::memory_meta;
use ce_session::{MemoryState, Role, SessionLayout};
use ce_store::JobState;
use serde_json::{Value, json};

use crate::bench::{BenchDir, latency_summary, load_average, machine, rate, round};

mod similarity;

/// Options of `ce bench sessions`.
#[derive(Debug, clap::Args)]
pub struct BenchSessionsArgs {
    /// Sessions of the append, Phase 1 and Phase 2 runs
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub sessions: usize,
    /// Messages per session (appended, then archived by one commit)
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub messages: usize,
    /// Facts planted in the dedup runs
    #[arg(long, value_name = "N", default_value_t = 24)]
    pub facts: usize,
    /// Sessions of the dedup runs
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub fact_sessions: usize,
    /// Sessions stating each planted fact (at most --fact-sessions)
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub mentions: usize,
    /// Directory in which fresh, uniquely named directories are created [default: the system
    /// temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Keep the data directories afterwards
    #[arg(long)]
    pub keep: bool,
    /// Print only the `similarity` section (the merge rule on measured pairs of facts, with
    /// the local model) and stop: seconds instead of minutes
    #[arg(long)]
    pub only_similarity: bool,
}

/// The most facts the generator can plant (distinct template and name pairs).
const MAX_FACTS: usize = 200;
/// A user message of the append run states a planted fact every this many messages.
const FACT_EVERY: usize = 50;
/// Search hits looked at for recall.
const RECALL_TOP: usize = 5;

/// One kind of fact: its category, key stem, three wordings and a query naming it
/// (`{n}` a name, `{t}` a thing).
struct Template {
    category: &'static str,
    stem: &'static str,
    wordings: [&'static str; 3],
    query: &'static str,
    things: &'static [&'static str],
}

const WEEKDAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

const TEMPLATES: [Template; 8] = [
    Template {
        category: "profile",
        stem: "sister",
        wordings: [
            "The user's sister {n} lives in {t}.",
            "{n}, the user's sister, is based in {t}.",
            "The user has a sister named {n} who lives in {t}.",
        ],
        query: "where does the user's sister {n} live",
        things: &[
            "Porto",
            "Tromso",
            "Valparaiso",
            "Gdansk",
            "Hobart",
            "Kraków",
            "Accra",
        ],
    },
    Template {
        category: "entities",
        stem: "project",
        wordings: [
            "The user's project {n} is written in {t}.",
            "{n}, a project of the user, is built with {t}.",
            "The user writes the {n} project in {t}.",
        ],
        query: "which language is the user's project {n} written in",
        things: &[
            "Rust", "Haskell", "Elixir", "OCaml", "Kotlin", "Zig", "Clojure",
        ],
    },
    Template {
        category: "entities",
        stem: "dog",
        wordings: [
            "The user has a dog called {n} who loves {t}.",
            "{n} is the user's dog and adores {t}.",
            "The user's dog, {n}, is fond of {t}.",
        ],
        query: "what does the user's dog {n} love",
        things: &[
            "tennis balls",
            "carrots",
            "swimming",
            "snow",
            "squeaky toys",
            "long hikes",
            "cheese",
        ],
    },
    Template {
        category: "events",
        stem: "trip",
        wordings: [
            "The user is flying to {t} with {n} in June.",
            "In June the user travels to {t} together with {n}.",
            "{n} and the user have a June trip to {t} planned.",
        ],
        query: "the user's June trip with {n}",
        things: &[
            "Reykjavik",
            "Hanoi",
            "Marrakesh",
            "Lima",
            "Tbilisi",
            "Osaka",
            "Nairobi",
        ],
    },
    Template {
        category: "profile",
        stem: "manager",
        wordings: [
            "The user's manager is {n}, who works from {t}.",
            "{n} manages the user and is based in {t}.",
            "The user reports to {n}, working out of {t}.",
        ],
        query: "who is the user's manager {n}",
        things: &[
            "Berlin",
            "Toronto",
            "Singapore",
            "Madrid",
            "Austin",
            "Dublin",
            "Seoul",
        ],
    },
    Template {
        category: "patterns",
        stem: "review",
        wordings: [
            "The user reviews pull requests with {n} every {t}.",
            "Every {t} the user does code review with {n}.",
            "{n} and the user review pull requests each {t}.",
        ],
        query: "when does the user review pull requests with {n}",
        things: WEEKDAYS,
    },
    Template {
        category: "cases",
        stem: "outage",
        wordings: [
            "The user fixed the {t} outage by restarting the {n} service.",
            "Restarting the {n} service solved the user's {t} outage.",
            "The user ended an outage of {t} with a restart of the {n} service.",
        ],
        query: "how was the {n} service outage fixed",
        things: &[
            "billing", "login", "search", "checkout", "upload", "payments", "email",
        ],
    },
    Template {
        category: "preferences",
        stem: "deploy",
        wordings: [
            "The user deploys {n} to production on {t} mornings.",
            "On {t} mornings the user ships {n} to production.",
            "{n} goes to production on {t} mornings, deployed by the user.",
        ],
        query: "when does the user deploy {n} to production",
        things: WEEKDAYS,
    },
];

const NAMES: [&str; 31] = [
    "Maria", "Tomas", "Ingrid", "Kofi", "Aiko", "Rafael", "Yusuf", "Elena", "Dmitri", "Priya",
    "Lars", "Noor", "Mateo", "Sanna", "Chidi", "Ilse", "Haruto", "Zofia", "Amara", "Bastian",
    "Leilani", "Oskar", "Farah", "Emeka", "Greta", "Junho", "Rosa", "Viktor", "Nadia", "Paulo",
    "Selin",
];

/// Planted fact `i`: template `i % 8`, name `i % 31` (distinct pairs up to 248).
struct Fact {
    template: &'static Template,
    name: &'static str,
    thing: &'static str,
}

impl Fact {
    fn new(i: usize) -> Self {
        let template = &TEMPLATES[i % TEMPLATES.len()];
        Fact {
            template,
            name: NAMES[i % NAMES.len()],
            thing: template.things[(i / TEMPLATES.len()) % template.things.len()],
        }
    }

    fn fill(&self, s: &str) -> String {
        s.replace("{n}", self.name).replace("{t}", self.thing)
    }

    fn wording(&self, k: usize) -> String {
        self.fill(self.template.wordings[k % 3])
    }

    fn query(&self) -> String {
        self.fill(self.template.query)
    }
}

/// How the scripted model picks keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reuses the key of a memory stating the fact when the prompt shows one.
    Cooperative,
    /// A fresh key and another wording every time.
    Paraphrase,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Cooperative => "cooperative",
            Mode::Paraphrase => "paraphrase",
        }
    }
}

/// What the scripted model saw and answered, as the server side counts it.
#[derive(Debug, Default)]
struct ModelLog {
    requests: u64,
    tokens_in: u64,
    tokens_out: u64,
    /// Planted statements in the conversations sent.
    statements_seen: u64,
    /// Candidates answered.
    candidates: u64,
    /// Candidates that reused the key of a shown memory stating their fact.
    keys_reused: u64,
    /// Candidates for a fact some memory held already, when the prompt showed none of them.
    held_not_shown: u64,
    /// Existing memories listed in prompts.
    memories_shown: u64,
}

/// The scripted extractor behind the loopback server.
struct Script {
    mode: Mode,
    /// Every wording of every planted fact → (fact, wording index).
    wordings: BTreeMap<String, (usize, usize)>,
    facts: Vec<Fact>,
    log: Mutex<ModelLog>,
    /// Facts a memory holds, as far as the answers went (to count `held_not_shown`).
    answered: Mutex<BTreeSet<usize>>,
}

/// A loopback server's token estimate for `text`: a quarter of its characters (it has no
/// tokenizer; what matters is that CE adds up what the endpoint reports).
fn tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

impl Script {
    fn new(mode: Mode, facts: usize) -> Arc<Self> {
        let facts: Vec<Fact> = (0..facts).map(Fact::new).collect();
        let mut wordings = BTreeMap::new();
        for (i, f) in facts.iter().enumerate() {
            for k in 0..3 {
                wordings.insert(f.wording(k), (i, k));
            }
        }
        Arc::new(Script {
            mode,
            wordings,
            facts,
            log: Mutex::new(ModelLog::default()),
            answered: Mutex::new(BTreeSet::new()),
        })
    }

    /// The planted fact a text states, with its wording index.
    fn stated(&self, text: &str) -> Option<(usize, usize)> {
        self.wordings
            .iter()
            .find(|(w, _)| text.contains(w.as_str()))
            .map(|(_, v)| *v)
    }

    fn answer(&self, r: &Recorded) -> Reply {
        if r.method != "POST" || !r.path.ends_with("/chat/completions") {
            return Reply::error(404, &format!("no route {} {}", r.method, r.path));
        }
        let Some(messages) = r.body["messages"].as_array() else {
            return Reply::error(400, "messages must be an array");
        };
        let prompt: String = messages
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let input = messages
            .get(1)
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        let (shown, conversation) = input.split_once("Conversation:\n").unwrap_or(("", input));
        // "- {category}/{key}: {fact}" lines of the existing memories shown.
        let shown: Vec<(String, String, Option<usize>)> = shown
            .lines()
            .filter_map(|l| l.strip_prefix("- "))
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(slot, fact)| {
                let (category, key) = slot.split_once('/')?;
                Some((
                    category.to_owned(),
                    key.to_owned(),
                    self.stated(fact).map(|(f, _)| f),
                ))
            })
            .collect();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        log.requests += 1;
        log.memories_shown += shown.len() as u64;
        let mut memories = Vec::new();
        for block in conversation.split("\n\n") {
            let Some((id, text)) = block.strip_prefix('[').and_then(|b| b.split_once("] ")) else {
                continue;
            };
            if !text.starts_with("user: ") {
                continue;
            }
            let Some((f, k)) = self.stated(text) else {
                continue;
            };
            log.statements_seen += 1;
            let fact = &self.facts[f];
            let session = id.split_once('-').map_or("0", |(s, _)| s);
            let reuse = shown
                .iter()
                .find(|(_, _, sf)| *sf == Some(f))
                .filter(|_| self.mode == Mode::Cooperative);
            let (category, key, change, wording) = match reuse {
                Some((category, key, _)) => {
                    log.keys_reused += 1;
                    (category.clone(), key.clone(), Some("same"), k)
                }
                None => {
                    if answered.contains(&f) && !shown.iter().any(|(_, _, sf)| *sf == Some(f)) {
                        log.held_not_shown += 1;
                    }
                    let key =
                        format!("{}-{}-{session}", fact.template.stem, fact.name).to_lowercase();
                    let wording = match self.mode {
                        Mode::Cooperative => k,
                        Mode::Paraphrase => k + 1,
                    };
                    (fact.template.category.to_owned(), key, None, wording)
                }
            };
            answered.insert(f);
            let mut m = json!({
                "category": category, "key": key, "fact": fact.wording(wording),
                "context": "", "evidence": [id], "confidence": 0.9,
            });
            if let Some(c) = change {
                m["change"] = json!(c);
            }
            memories.push(m);
        }
        log.candidates += memories.len() as u64;
        let content = json!({ "memories": memories }).to_string();
        let (tin, tout) = (tokens(&prompt), tokens(&content));
        log.tokens_in += tin;
        log.tokens_out += tout;
        Reply::chat_completion("bench-scripted", &content, tin, tout)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, ModelLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

const WORDS: [&str; 64] = [
    "the", "a", "we", "could", "maybe", "try", "with", "plan", "before", "after", "meeting",
    "schedule", "draft", "email", "report", "numbers", "quarter", "budget", "slides", "review",
    "customer", "ticket", "bug", "release", "branch", "test", "failing", "logs", "server",
    "database", "query", "slow", "index", "cache", "deploy", "rollback", "tomorrow", "today",
    "week", "again", "please", "thanks", "sure", "idea", "question", "answer", "explain",
    "summary", "list", "steps", "first", "then", "finally", "because", "so", "but", "also",
    "check", "update", "write", "read", "send", "call", "fix",
];

/// The append of message `n` of session `s` (client id `s{s}-m{n}`).
fn message(uri: &CtxUri, s: usize, n: usize, role: Role, content: String) -> AddMessage {
    AddMessage {
        uri: uri.clone(),
        role,
        content,
        id: Some(format!("s{s}-m{n}")),
        time_ms: None,
        parts: None,
    }
}

/// Message `n` of session `s`: user turns of 40–400 characters, assistant turns of
/// 200–1500, varied words; every [`FACT_EVERY`]th user turn states a planted fact.
fn message_text(s: usize, n: usize, facts: &[Fact]) -> (Role, String) {
    let user = n.is_multiple_of(2);
    let mut x = ((s as u64) << 32 | n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let target = if user {
        40 + (next() % 360) as usize
    } else {
        200 + (next() % 1300) as usize
    };
    let mut out = String::new();
    if user && n.is_multiple_of(FACT_EVERY) && !facts.is_empty() {
        let f = &facts[(s * 7 + n / FACT_EVERY) % facts.len()];
        out.push_str("By the way, ");
        out.push_str(&f.wording(n / FACT_EVERY));
    }
    while out.len() < target {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
    }
    out.push('.');
    (if user { Role::User } else { Role::Assistant }, out)
}

/// A fresh engine on the embedded defaults with the scripted model as `[derive.llm]`.
fn open_engine(dir: &BenchDir, llm: &LoopbackServer) -> anyhow::Result<Engine> {
    let mut config = Config::default();
    config.derive.llm.base_url = llm.base_url();
    config.derive.llm.model = "bench-scripted".into();
    config.derive.llm.api_key_env = "CE_BENCH_NO_KEY".into();
    let options = EngineOptions {
        workers: 1,
        run_workers: false,
        role: "bench-sessions".into(),
        consumers: Vec::new(),
    };
    Engine::open_with(&dir.path, config, options)
        .with_context(|| format!("opening an engine in {}", dir.path.display()))
}

fn session_uri(s: usize) -> anyhow::Result<CtxUri> {
    Ok(CtxUri::parse(&format!(
        "ctx://bench/users/u1/sessions/s{s}"
    ))?)
}

/// What one commit and its Phase 2 took and did.
struct Committed {
    phase1: Duration,
    phase2: Duration,
    archived: u64,
    report: Phase2Report,
}

/// Runs Phase 1 of `uri`'s commit, then its job.
fn commit_and_run(engine: &Engine, uri: &CtxUri) -> anyhow::Result<Committed> {
    let t = Instant::now();
    let c = engine.sessions().commit(uri)?;
    let phase1 = t.elapsed();
    let job_id = c
        .job_id
        .with_context(|| format!("the commit of {uri} archived nothing"))?;
    let t = Instant::now();
    engine.run_due_jobs()?;
    let phase2 = t.elapsed();
    let job = engine.job(&job_id)?;
    if job.state != JobState::Completed {
        anyhow::bail!(
            "phase 2 of {uri} ended {}: {}",
            job.state.as_str(),
            job.last_error.unwrap_or_default()
        );
    }
    let report: Phase2Report = serde_json::from_value(job.progress.unwrap_or_default())
        .context("reading the phase 2 report")?;
    Ok(Committed {
        phase1,
        phase2,
        archived: c.archived,
        report,
    })
}

/// Runs the benchmark.
pub fn run_sessions(args: &BenchSessionsArgs) -> anyhow::Result<Value> {
    if args.sessions == 0 || args.messages == 0 || args.fact_sessions == 0 {
        anyhow::bail!("--sessions, --messages and --fact-sessions must be at least 1");
    }
    if args.facts == 0 || args.facts > MAX_FACTS {
        anyhow::bail!("--facts must be in 1..={MAX_FACTS}, not {}", args.facts);
    }
    if args.mentions == 0 || args.mentions > args.fact_sessions {
        anyhow::bail!(
            "--mentions must be in 1..=--fact-sessions ({}), not {}",
            args.fact_sessions,
            args.mentions
        );
    }
    let started = Instant::now();
    let load_at_start = load_average();
    let work_dir = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let similarity = run_similarity(args, &work_dir)?;
    if args.only_similarity {
        return Ok(json!({
            "benchmark": "sessions",
            "machine": machine(),
            "load_average": { "start": load_at_start, "end": load_average() },
            "similarity": similarity,
            "total_seconds": round(started.elapsed().as_secs_f64(), 3),
        }));
    }
    let (append, phase1, phase2) = run_load(args, &work_dir)?;
    let cooperative = run_dedup(args, &work_dir, Mode::Cooperative)?;
    let paraphrase = run_dedup(args, &work_dir, Mode::Paraphrase)?;
    let met = |v: &Value| {
        json!({
            "duplicates_zero": v["duplicates"] == 0,
            "recall_all": v["recall"]["in_top_5"] == v["recall"]["facts"],
        })
    };
    let targets = json!({
        "duplicates_max": 0,
        "recall_top": RECALL_TOP,
        "cooperative": met(&cooperative),
        "paraphrase": met(&paraphrase),
    });
    Ok(json!({
        "benchmark": "sessions",
        "machine": machine(),
        "load_average": { "start": load_at_start, "end": load_average() },
        "parameters": {
            "sessions": args.sessions,
            "messages": args.messages,
            "facts": args.facts,
            "fact_sessions": args.fact_sessions,
            "mentions": args.mentions,
            "store": "sqlite",
            "embedder": "local (default model)",
            "llm": "loopback chat-completions server, scripted answers",
        },
        "similarity": similarity,
        "append": append,
        "phase1": phase1,
        "phase2": phase2,
        "dedup": { "cooperative": cooperative, "paraphrase": paraphrase },
        "targets": targets,
        "total_seconds": round(started.elapsed().as_secs_f64(), 3),
    }))
}

/// Step 0: the merge rule on measured pairs of facts ([`similarity`]).
fn run_similarity(args: &BenchSessionsArgs, work_dir: &std::path::Path) -> anyhow::Result<Value> {
    eprintln!("bench sessions: the merge rule on measured pairs of facts");
    let config = Config::default();
    let dir = BenchDir::create(work_dir, args.keep)?;
    let embedder = ce_embed::build_cached(&config.index.embedding, &dir.path)?;
    similarity::calibrate(
        embedder.as_ref(),
        args.facts,
        config.sessions.similarity_threshold,
        config.sessions.semantic_threshold,
    )
}

/// Steps 1–3: appends, then a commit and its Phase 2 per session.
fn run_load(
    args: &BenchSessionsArgs,
    work_dir: &std::path::Path,
) -> anyhow::Result<(Value, Value, Value)> {
    let script = Script::new(Mode::Cooperative, args.facts);
    let s2 = script.clone();
    let llm = LoopbackServer::start(move |r| s2.answer(r));
    let dir = BenchDir::create(work_dir, args.keep)?;
    let engine = open_engine(&dir, &llm)?;
    let sessions = engine.sessions();
    let uris: Vec<CtxUri> = (0..args.sessions)
        .map(session_uri)
        .collect::<anyhow::Result<_>>()?;
    for u in &uris {
        sessions.create(u, Some("bench conversation".into()))?;
    }
    let total = args.sessions * args.messages;
    eprintln!(
        "bench sessions: appending {total} messages to {} sessions",
        args.sessions
    );
    let mut lat = Vec::with_capacity(total);
    let mut bytes: u64 = 0;
    let mut planted = vec![0u64; args.sessions];
    let t0 = Instant::now();
    for n in 0..args.messages {
        for (s, uri) in uris.iter().enumerate() {
            let (role, content) = message_text(s, n, &script.facts);
            if script.stated(&content).is_some() {
                planted[s] += 1;
            }
            bytes += content.len() as u64;
            let t = Instant::now();
            let a = sessions.add(message(uri, s, n, role, content))?;
            lat.push(t.elapsed());
            anyhow::ensure!(a.created, "message {n} of {uri} was not created");
        }
        let done = (n + 1) * args.sessions;
        if (n + 1) % (args.messages / 10).max(1) == 0 {
            eprintln!(
                "bench sessions:   {done}/{total} appended ({:.0} messages/s)",
                rate(done as u64, t0.elapsed())
            );
        }
    }
    let wall = t0.elapsed();
    let append_before = json!({
        "sessions": args.sessions,
        "messages": total,
        "mean_message_bytes": round(bytes as f64 / total as f64, 1),
        "seconds": round(wall.as_secs_f64(), 3),
        "messages_per_s": round(rate(total as u64, wall), 1),
        "latency": latency_summary(&mut lat),
        "threads": 1,
    });

    eprintln!(
        "bench sessions: committing {} sessions of {} messages (phase 1, then its phase 2)",
        args.sessions, args.messages
    );
    let mut p1 = Vec::new();
    let mut p2 = Vec::new();
    let mut reports = Vec::new();
    let mut archived = 0;
    for (s, uri) in uris.iter().enumerate() {
        let before = script.log().statements_seen;
        let c = commit_and_run(&engine, uri)?;
        p1.push(c.phase1);
        p2.push(c.phase2);
        archived += c.archived;
        reports.push((c.report, script.log().statements_seen - before));
        eprintln!("bench sessions:   {}/{} committed", s + 1, args.sessions);
    }
    // Appends to sessions that hold an archive now (a new client id is looked for in the
    // newest archives first), and retries of archived messages (recognised, not appended).
    let extra = (args.messages / 10).max(1);
    eprintln!(
        "bench sessions: {} appends after the commits, {} retries of archived messages",
        extra * args.sessions,
        extra * args.sessions
    );
    let add = |s: usize, n: usize, uri: &CtxUri| -> anyhow::Result<(Duration, bool)> {
        let (role, content) = message_text(s, n, &script.facts);
        let t = Instant::now();
        let a = sessions.add(message(uri, s, n, role, content))?;
        Ok((t.elapsed(), a.created))
    };
    let mut after = Vec::new();
    let mut retried = Vec::new();
    let mut recognised = 0u64;
    for k in 0..extra {
        for (s, uri) in uris.iter().enumerate() {
            let (d, created) = add(s, args.messages + k, uri)?;
            anyhow::ensure!(
                created,
                "a new message after the commit of {uri} was not created"
            );
            after.push(d);
            let (d, created) = add(s, k * (args.messages / extra).max(1), uri)?;
            recognised += u64::from(!created);
            retried.push(d);
        }
    }
    let after_commit = json!({
        "messages": after.len(),
        "latency": latency_summary(&mut after),
        "archived_retries": retried.len(),
        "archived_retries_recognised": recognised,
        "archived_retry_latency": latency_summary(&mut retried),
    });
    let mut append = append_before;
    append["after_commit"] = after_commit;
    let phase1 = json!({
        "sessions": args.sessions,
        "messages_per_session": args.messages,
        "messages_archived": archived,
        "latency": latency_summary(&mut p1),
    });
    let log = script.log();
    let ce_calls: u64 = reports.iter().map(|(r, _)| u64::from(r.calls)).sum();
    let ce_in: u64 = reports.iter().map(|(r, _)| r.tokens_in).sum();
    let ce_out: u64 = reports.iter().map(|(r, _)| r.tokens_out).sum();
    let archives = reports.len() as u64;
    let seen: u64 = reports.iter().map(|(_, s)| s).sum();
    let phase2 = json!({
        "archives": archives,
        "messages_per_archive": args.messages,
        "wall_latency": latency_summary(&mut p2),
        "server": {
            "requests": log.requests,
            "tokens_in": log.tokens_in,
            "tokens_out": log.tokens_out,
            "token_estimate": "characters / 4 (the loopback server has no tokenizer)",
        },
        "ce_accounting": { "calls": ce_calls, "tokens_in": ce_in, "tokens_out": ce_out },
        "accounting_matches_server": ce_calls == log.requests
            && ce_in == log.tokens_in && ce_out == log.tokens_out,
        "per_archive": {
            "calls": round(ce_calls as f64 / archives as f64, 2),
            "tokens_in": round(ce_in as f64 / archives as f64, 1),
            "tokens_out": round(ce_out as f64 / archives as f64, 1),
        },
        "windows": {
            "per_archive": round(
                reports.iter().map(|(r, _)| f64::from(r.windows.total)).sum::<f64>()
                    / archives as f64,
                2,
            ),
            "extracted": reports.iter().map(|(r, _)| u64::from(r.windows.extracted)).sum::<u64>(),
            "left_out": reports.iter().map(|(r, _)| u64::from(r.windows.left_out)).sum::<u64>(),
            "max_windows": engine.config().sessions.max_windows,
        },
        "planted_statements": planted.iter().sum::<u64>(),
        "statements_sent_to_model": seen,
        "input_limit_chars": engine.config().derive.llm.max_input_chars,
        "memories": counts_of(reports.iter().map(|(r, _)| r)),
    });
    drop(log);
    engine.shutdown();
    Ok((append, phase1, phase2))
}

fn counts_of<'a>(reports: impl Iterator<Item = &'a Phase2Report>) -> Value {
    let (mut a, mut u, mut s, mut n) = (0, 0, 0, 0);
    for r in reports {
        a += r.counts.added;
        u += r.counts.updated;
        s += r.counts.superseded;
        n += r.counts.unchanged;
    }
    json!({"added": a, "updated": u, "superseded": s, "unchanged": n})
}

/// Step 4 in one mode.
fn run_dedup(
    args: &BenchSessionsArgs,
    work_dir: &std::path::Path,
    mode: Mode,
) -> anyhow::Result<Value> {
    let script = Script::new(mode, args.facts);
    let s2 = script.clone();
    let llm = LoopbackServer::start(move |r| s2.answer(r));
    let dir = BenchDir::create(work_dir, args.keep)?;
    let engine = open_engine(&dir, &llm)?;
    let m = args.fact_sessions;
    eprintln!(
        "bench sessions: dedup ({}): {} facts across {m} sessions, {} mentions each",
        mode.as_str(),
        args.facts,
        args.mentions
    );
    // Session j states fact i (wording k) when j = (i + k) mod M.
    let mut statements: Vec<Vec<(usize, usize)>> = vec![Vec::new(); m];
    for i in 0..args.facts {
        for k in 0..args.mentions {
            statements[(i + k) % m].push((i, k));
        }
    }
    let t0 = Instant::now();
    let mut reports = Vec::new();
    let mut phase2 = Vec::new();
    for (j, planted) in statements.iter().enumerate() {
        let uri = session_uri(j)?;
        let s = engine.sessions();
        s.create(&uri, Some(format!("conversation {j}")))?;
        let mut n = 0;
        let mut add = |role: Role, content: String| -> anyhow::Result<()> {
            s.add(AddMessage {
                uri: uri.clone(),
                role,
                content,
                id: Some(format!("s{j}-m{n}")),
                time_ms: None,
                parts: None,
            })?;
            n += 1;
            Ok(())
        };
        add(
            Role::User,
            "Hi again, I have a few things to sort out today.".into(),
        )?;
        for (p, &(i, k)) in planted.iter().enumerate() {
            add(
                Role::User,
                format!("Some context first: {}", script.facts[i].wording(k)),
            )?;
            add(Role::Assistant, "Thanks, I will keep that in mind.".into())?;
            let (_, filler) = message_text(j, 2 * p + 1, &[]);
            add(Role::Assistant, filler)?;
        }
        let c = commit_and_run(&engine, &uri)?;
        phase2.push(c.phase2);
        reports.push(c.report);
        eprintln!("bench sessions:   {}/{m} sessions committed", j + 1);
    }
    let commits = t0.elapsed();
    eprintln!("bench sessions: draining the indexes");
    let t = Instant::now();
    engine.drain(&|_: &ce_server::status::DrainProgress| {})?;
    let drain = t.elapsed();

    // Which planted fact each current memory states.
    let layout = SessionLayout::of(&session_uri(0)?)?;
    let root = layout.memories();
    let nodes = engine.store().read_subtree(&root)?;
    let mut by_fact: BTreeMap<usize, Vec<CtxUri>> = BTreeMap::new();
    let (mut current, mut superseded, mut unrecognised, mut mixed) = (0u64, 0u64, 0u64, 0u64);
    for node in nodes
        .iter()
        .filter(|n| n.meta.contains_key(memory_meta::KEY))
    {
        let Some(mem) = MemoryState::from_node(&root, node) else {
            continue;
        };
        if !mem.is_current() {
            superseded += 1;
            continue;
        }
        current += 1;
        let Some((f, _)) = script.stated(&mem.fact) else {
            unrecognised += 1;
            continue;
        };
        // Its evidence must be statements of that fact only.
        let other = mem
            .source_messages
            .iter()
            .any(|sm| evidence_fact(&statements, sm).is_some_and(|g| g != f));
        if other {
            mixed += 1;
        }
        by_fact.entry(f).or_default().push(mem.uri.clone());
    }
    let duplicates: u64 = by_fact
        .values()
        .map(|v| v.len().saturating_sub(1) as u64)
        .sum();
    let missing = (0..args.facts).filter(|f| !by_fact.contains_key(f)).count();

    eprintln!("bench sessions: searching for {} facts", args.facts);
    let mut in_top = 0;
    let mut ranks = Vec::new();
    let mut misses = Vec::new();
    let mut search_lat = Vec::new();
    for (f, fact) in script.facts.iter().enumerate() {
        let mut req = ce_retrieval::SearchRequest::new(fact.query());
        req.top_k = 10;
        let t = Instant::now();
        let hits = engine.search(&req)?.hits;
        search_lat.push(t.elapsed());
        let mine = by_fact.get(&f).cloned().unwrap_or_default();
        let rank = hits.iter().position(|h| mine.contains(&h.uri));
        match rank {
            Some(r) if r < RECALL_TOP => in_top += 1,
            _ => misses.push(json!({
                "query": fact.query(),
                "rank": rank.map(|r| r + 1),
                "top": hits.iter().take(RECALL_TOP).map(|h| h.uri.as_str()).collect::<Vec<_>>(),
            })),
        }
        if let Some(r) = rank {
            ranks.push(r + 1);
        }
    }
    let log = script.log();
    let mean_rank =
        (!ranks.is_empty()).then(|| ranks.iter().sum::<usize>() as f64 / ranks.len() as f64);
    let v = json!({
        "mode": mode.as_str(),
        "facts": args.facts,
        "sessions": m,
        "mentions": args.mentions,
        "statements": args.facts * args.mentions,
        "model": {
            "requests": log.requests,
            "candidates": log.candidates,
            "keys_reused": log.keys_reused,
            "held_not_shown": log.held_not_shown,
            "memories_shown": log.memories_shown,
        },
        "merge": counts_of(reports.iter()),
        "memories": { "current": current, "superseded": superseded, "unrecognised": unrecognised },
        "duplicates": duplicates,
        "facts_with_duplicates": by_fact.values().filter(|v| v.len() > 1).count(),
        "mixed_memories": mixed,
        "missing_facts": missing,
        "recall": {
            "facts": args.facts,
            "in_top_5": in_top,
            "mean_rank_found": mean_rank.map(|r| round(r, 2)),
            "misses": misses.into_iter().take(5).collect::<Vec<_>>(),
            "search_latency": latency_summary(&mut search_lat),
        },
        "commit_seconds": round(commits.as_secs_f64(), 3),
        "phase2_wall_latency": latency_summary(&mut phase2),
        "drain_seconds": round(drain.as_secs_f64(), 3),
    });
    drop(log);
    engine.shutdown();
    Ok(v)
}

/// The planted fact a `{archive}#{message id}` evidence reference states, from the plan of
/// statements (`s{j}-m{n}`: the session's `n`th message; statements are messages
/// 1, 4, 7, … of session `j`, in plan order).
fn evidence_fact(statements: &[Vec<(usize, usize)>], reference: &str) -> Option<usize> {
    let id = reference.rsplit_once('#')?.1;
    let (s, n) = id.split_once("-m")?;
    let j: usize = s.strip_prefix('s')?.parse().ok()?;
    let n: usize = n.parse().ok()?;
    (n % 3 == 1)
        .then(|| statements.get(j)?.get(n / 3).map(|(i, _)| *i))
        .flatten()
}
