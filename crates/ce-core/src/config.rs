//! Configuration: one TOML file with the spec §12.1 keys, defaults and §12.4 ranges.
//!
//! Parsing and validation only; finding and reading the file is the binary's job.

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::node::ContextType;
use crate::projector::ProjectorConfig;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The index module (spec §12.1).
    pub index: IndexConfig,
    /// The source-of-truth store.
    pub store: StoreConfig,
    /// Projector fallbacks.
    pub projector: ProjectorConfig,
    /// `[retrieval]`: search modes and hybrid fusion.
    pub retrieval: RetrievalConfig,
    /// `[server]`: API keys and tenants of `ce serve`.
    pub server: ServerConfig,
    /// `[lock]`: path locks around multi-step writes (docs/locks.md).
    pub lock: LockConfig,
    /// `[jobs]`: durable workflow jobs (docs/jobs.md).
    pub jobs: JobsConfig,
    /// `[derive]`: derived L0 / L1 layers (docs/derive.md).
    pub derive: DeriveConfig,
    /// `[sessions]`: session commits and memory extraction (docs/sessions.md).
    pub sessions: SessionsConfig,
    /// `[ingest]`: knowledge bases and their inputs (docs/ingestion.md).
    pub ingest: IngestConfig,
}

/// `[sessions]`: the commit policy and memory extraction (docs/sessions.md). Extraction uses
/// the chat endpoint of `[derive.llm]` and runs only when it names a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// Messages a commit leaves live (the newest ones); the others are archived (0..=10000).
    pub keep_last: u32,
    /// `auto` (extract memories when `[derive.llm]` names a model) or `off`.
    pub extraction: String,
    /// Term overlap (0.3..=1) at or above which two memories say the same (the merge rule).
    pub similarity_threshold: f64,
    /// Cosine similarity of two facts' embeddings (0.5..=1) at or above which they say the
    /// same when their distinctive terms agree; 0 turns the embedding signal off (term
    /// overlap alone). Calibrated for the default local model (docs/sessions.md, "Merge").
    pub semantic_threshold: f64,
    /// Model answers asked for before an extraction whose answers fail the schema is failed
    /// (1..=5).
    pub extraction_attempts: u32,
    /// Timeout of one extraction call, in seconds (1..=600).
    pub timeout_seconds: u32,
    /// Windows (one chat call each, plus re-asks of invalid answers) one archive's
    /// extraction may use (1..=1000); the messages beyond are left out and the archive, the
    /// diff and the job's report say so.
    pub max_windows: u32,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            keep_last: 0,
            extraction: "auto".into(),
            similarity_threshold: 0.75,
            semantic_threshold: 0.7,
            extraction_attempts: 3,
            timeout_seconds: 120,
            max_windows: 64,
        }
    }
}

impl SessionsConfig {
    fn validate(&self) -> Result<(), CoreError> {
        range("sessions.keep_last", self.keep_last, 0, 10_000)?;
        if !matches!(self.extraction.as_str(), "auto" | "off") {
            return Err(CoreError::InvalidConfig {
                key: "sessions.extraction".into(),
                reason: format!("{:?} is not one of \"auto\", \"off\"", self.extraction),
            });
        }
        range(
            "sessions.similarity_threshold",
            self.similarity_threshold,
            0.3,
            1.0,
        )?;
        let semantic = self.semantic_threshold;
        // 0 is off; `contains` also rejects NaN.
        if semantic != 0.0 && !(0.5..=1.0).contains(&semantic) {
            return Err(CoreError::InvalidConfig {
                key: "sessions.semantic_threshold".into(),
                reason: format!("{semantic} is neither 0 (off) nor in 0.5..=1"),
            });
        }
        range(
            "sessions.extraction_attempts",
            self.extraction_attempts,
            1,
            5,
        )?;
        range("sessions.timeout_seconds", self.timeout_seconds, 1, 600)?;
        range("sessions.max_windows", self.max_windows, 1, 1000)?;
        Ok(())
    }
}

/// `[ingest]`: what the ingestion workflow may read (docs/ingestion.md, "Sources").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Absolute directories under which an HTTP request (`POST /v1/kb/{base}/items`) may add
    /// local paths of the server's machine; empty (the default): none, only URLs and notes.
    /// The local CLI (`ce kb add` without `--server`) reads any path its user can.
    pub allowed_paths: Vec<String>,
}

impl IngestConfig {
    fn validate(&self) -> Result<(), CoreError> {
        for (i, p) in self.allowed_paths.iter().enumerate() {
            if !std::path::Path::new(p).is_absolute() {
                return Err(CoreError::InvalidConfig {
                    key: format!("ingest.allowed_paths[{i}]"),
                    reason: format!("{p:?} is not an absolute path"),
                });
            }
        }
        Ok(())
    }
}

/// `[derive]`: which nodes get derived L0 / L1 layers and which generator writes them
/// (docs/derive.md). Derivation runs while `derive` is one of `index.outbox.consumers` (it
/// is by default; remove it to keep the projector's fallbacks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeriveConfig {
    /// `extractive` (offline, deterministic, the default) or `llm` (`[derive.llm]`).
    pub generator: String,
    /// The context types whose nodes get derived layers (default: resources and sessions;
    /// add `memory` or `skill` to derive those too).
    pub types: Vec<String>,
    /// Nodes per generator call (1..=256).
    pub batch_size: u32,
    /// Timeout of one generator call, in seconds (1..=600).
    pub timeout_seconds: u32,
    /// Model tokens (in + out) the `llm` generator may spend per UTC day; 0: unlimited. When
    /// the day's budget is spent, derivation continues with `extractive` until midnight.
    pub max_tokens_per_day: u64,
    /// With the `extractive` generator, a leaf whose content is at most this many characters
    /// is derived in its write transaction instead of by the consumer (0: never; at most
    /// 65536): its L0 / L1 are written and indexed with it, once, where a write-back would
    /// make a second node version and a second round of index writes (docs/derive.md).
    pub inline_max_chars: usize,
    /// `[derive.llm]`: the chat-completions endpoint of the `llm` generator.
    pub llm: DeriveLlmConfig,
}

impl Default for DeriveConfig {
    fn default() -> Self {
        DeriveConfig {
            generator: "extractive".into(),
            types: vec!["resource".into(), "session".into()],
            batch_size: 16,
            timeout_seconds: 120,
            max_tokens_per_day: 0,
            inline_max_chars: 4096,
            llm: DeriveLlmConfig::default(),
        }
    }
}

impl DeriveConfig {
    /// The context types that are derived.
    pub fn derived_types(&self) -> Vec<ContextType> {
        self.types.iter().filter_map(|t| t.parse().ok()).collect()
    }

    fn validate(&self) -> Result<(), CoreError> {
        if !matches!(self.generator.as_str(), "extractive" | "llm") {
            return Err(CoreError::InvalidConfig {
                key: "derive.generator".into(),
                reason: format!("{:?} is not one of \"extractive\", \"llm\"", self.generator),
            });
        }
        for (i, t) in self.types.iter().enumerate() {
            if let Err(e) = t.parse::<ContextType>() {
                return Err(CoreError::InvalidConfig {
                    key: format!("derive.types[{i}]"),
                    reason: e.to_string(),
                });
            }
        }
        range("derive.batch_size", self.batch_size, 1, 256)?;
        range("derive.timeout_seconds", self.timeout_seconds, 1, 600)?;
        range("derive.inline_max_chars", self.inline_max_chars, 0, 65_536)?;
        let l = &self.llm;
        range("derive.llm.temperature", l.temperature, 0.0, 2.0)?;
        range("derive.llm.max_tokens", l.max_tokens, 16, 32_768)?;
        range(
            "derive.llm.max_input_chars",
            l.max_input_chars,
            1_000,
            1_000_000,
        )?;
        if self.generator == "llm" && l.model.trim().is_empty() {
            return Err(CoreError::InvalidConfig {
                key: "derive.llm.model".into(),
                reason: "the llm generator needs a model name".into(),
            });
        }
        Ok(())
    }
}

/// `[derive.llm]`: any OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI, vLLM,
/// llama.cpp server, Ollama's OpenAI endpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeriveLlmConfig {
    /// The server root (a trailing `/v1` is accepted).
    pub base_url: String,
    /// The model sent in requests (required with `generator = "llm"`).
    pub model: String,
    /// The environment variable holding the API key (unset: no key is sent).
    pub api_key_env: String,
    /// Sampling temperature (0..=2; 0 is as deterministic as the endpoint allows).
    pub temperature: f64,
    /// The longest answer, in tokens (16..=32768).
    pub max_tokens: u32,
    /// The longest input sent for one node, in characters (1000..=1000000); longer content
    /// is cut at a block boundary and the prompt says so.
    pub max_input_chars: usize,
    /// A directory of prompt files (`leaf.md`, `container.md`) replacing the built-in
    /// prompts; each starts with a `version: N` line, and a change of version re-derives
    /// on `ce reindex --consumer derive`.
    pub prompts_dir: Option<String>,
}

impl Default for DeriveLlmConfig {
    fn default() -> Self {
        DeriveLlmConfig {
            base_url: "https://api.openai.com".into(),
            model: String::new(),
            api_key_env: "OPENAI_API_KEY".into(),
            temperature: 0.0,
            max_tokens: 512,
            max_input_chars: 24_000,
            prompts_dir: None,
        }
    }
}

/// `[jobs]`: the durable job queue and its runner (docs/jobs.md). Every job type runs with
/// these values unless `[jobs.types.<type>]` overrides them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobsConfig {
    /// Whether the engine runs due jobs (`ce serve`, `ce worker`).
    pub enabled: bool,
    /// Fallback polling interval when no wake-up hint arrives (10..=60000).
    pub poll_interval_ms: u64,
    /// A running job's lease: a runner that stops renewing it for this long is presumed
    /// dead and the job becomes runnable again (15..=3600).
    pub lease_seconds: u32,
    /// Lease renewal (and cancellation check) period while a job runs (1..=lease/2).
    pub heartbeat_seconds: u32,
    /// Running jobs of one type at once, across every runner (1..=64).
    pub concurrency: u32,
    /// Failures after which a job goes dead (0..=20; 0: the first failure is final).
    pub max_retries: u32,
    /// First backoff (1..=600).
    pub retry_base_seconds: u32,
    /// Backoff cap (1..=86400, at least the base).
    pub retry_max_seconds: u32,
    /// Jitter as a fraction of the backoff (0..=1).
    pub retry_jitter_ratio: f64,
    /// Per-type overrides, by job type.
    pub types: std::collections::BTreeMap<String, JobTypeConfig>,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            enabled: true,
            poll_interval_ms: 500,
            lease_seconds: 60,
            heartbeat_seconds: 10,
            concurrency: 2,
            max_retries: 5,
            retry_base_seconds: 2,
            retry_max_seconds: 600,
            retry_jitter_ratio: 0.2,
            types: std::collections::BTreeMap::new(),
        }
    }
}

/// `[jobs.types.<type>]`: one job type's overrides of `[jobs]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobTypeConfig {
    /// Running jobs of this type at once (1..=64).
    pub concurrency: Option<u32>,
    /// Failures after which a job of this type goes dead (0..=20).
    pub max_retries: Option<u32>,
    /// First backoff (1..=600).
    pub retry_base_seconds: Option<u32>,
    /// Backoff cap (1..=86400).
    pub retry_max_seconds: Option<u32>,
}

/// The effective settings of one job type: `[jobs]` with its `[jobs.types.<type>]` applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobTypeSettings {
    /// Running jobs of this type at once.
    pub concurrency: u32,
    /// Failures after which a job goes dead.
    pub max_retries: u32,
    /// First backoff.
    pub retry_base_seconds: u32,
    /// Backoff cap.
    pub retry_max_seconds: u32,
    /// Jitter as a fraction of the backoff.
    pub retry_jitter_ratio: f64,
}

impl JobsConfig {
    /// The settings of `job_type`.
    pub fn settings(&self, job_type: &str) -> JobTypeSettings {
        let t = self.types.get(job_type).cloned().unwrap_or_default();
        JobTypeSettings {
            concurrency: t.concurrency.unwrap_or(self.concurrency),
            max_retries: t.max_retries.unwrap_or(self.max_retries),
            retry_base_seconds: t.retry_base_seconds.unwrap_or(self.retry_base_seconds),
            retry_max_seconds: t.retry_max_seconds.unwrap_or(self.retry_max_seconds),
            retry_jitter_ratio: self.retry_jitter_ratio,
        }
    }

    /// Checks every value's range and every type name.
    fn validate(&self) -> Result<(), CoreError> {
        range("jobs.poll_interval_ms", self.poll_interval_ms, 10, 60_000)?;
        range("jobs.lease_seconds", self.lease_seconds, 15, 3600)?;
        range(
            "jobs.heartbeat_seconds",
            self.heartbeat_seconds,
            1,
            self.lease_seconds / 2,
        )?;
        range("jobs.retry_jitter_ratio", self.retry_jitter_ratio, 0.0, 1.0)?;
        let mut checked = vec![(String::from("jobs"), self.settings(""))];
        for name in self.types.keys() {
            if !valid_job_type(name) {
                return Err(CoreError::InvalidConfig {
                    key: format!("jobs.types.{name}"),
                    reason: format!(
                        "{name:?} is not a job type name (1 to 64 of [a-z0-9_-], starting with a letter)"
                    ),
                });
            }
            checked.push((format!("jobs.types.{name}"), self.settings(name)));
        }
        for (at, s) in checked {
            range(&format!("{at}.concurrency"), s.concurrency, 1, 64)?;
            range(&format!("{at}.max_retries"), s.max_retries, 0, 20)?;
            range(
                &format!("{at}.retry_base_seconds"),
                s.retry_base_seconds,
                1,
                600,
            )?;
            range(
                &format!("{at}.retry_max_seconds"),
                s.retry_max_seconds,
                s.retry_base_seconds,
                86_400,
            )?;
        }
        Ok(())
    }
}

/// Whether `name` is a valid job type: 1 to 64 of `[a-z0-9_-]`, starting with a letter.
pub fn valid_job_type(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The path-lock providers.
pub const LOCK_PROVIDERS: [&str; 3] = ["filesystem", "memory", "redis"];

/// `[lock]`: path locks (spec path-locks-crash-recovery; docs/locks.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockConfig {
    /// `filesystem` (lock files under the data directory: every process on this host),
    /// `memory` (this process only) or `redis` (every host that reaches the server).
    pub provider: String,
    /// Seconds after which a lease that was not renewed is stale (renewal: every third).
    pub lock_expire_secs: f64,
    /// Milliseconds an acquire waits (jittered backoff) before the busy error; 0: no wait.
    pub wait_ms: u64,
    /// Directory of the lock files; empty: `<data_dir>/locks`.
    pub dir: String,
    /// Redis URL of the `redis` provider.
    pub redis_url: String,
    /// Namespace of the `redis` provider's keys (the spec's `service_name`).
    pub service_name: String,
}

impl Default for LockConfig {
    fn default() -> Self {
        LockConfig {
            provider: "filesystem".into(),
            lock_expire_secs: 30.0,
            wait_ms: 3_000,
            dir: String::new(),
            redis_url: "redis://127.0.0.1:6379".into(),
            service_name: "contextengine".into(),
        }
    }
}

/// `[index]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    /// `[index.worker]`.
    pub worker: WorkerConfig,
    /// `[index.outbox]`.
    pub outbox: OutboxConfig,
    /// `[index.embedding]`.
    pub embedding: EmbeddingConfig,
    /// `[index.vector]`.
    pub vector: VectorConfig,
    /// `[index.repair]`.
    pub repair: RepairConfig,
}

/// `[index.worker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Whether workers run.
    pub enabled: bool,
    /// Fallback polling interval when no wake-up hint arrives.
    pub poll_interval_ms: u64,
    /// Events claimed per `run_once` (10..=500).
    pub claim_limit: u32,
    /// Claim lease (15..=300).
    pub lease_seconds: u32,
    /// Lease renewal period while a batch runs.
    pub heartbeat_seconds: u32,
    /// Events in flight per worker (50..=2000).
    pub max_inflight_events: u32,
    /// Consumers in dry-run mode: no worker applies their events (their queue does not
    /// advance); `ce worker --dry-run` reports the delta they would apply, and status shows
    /// `dry_run_valid` once that report covers every open event. Each must be a configured
    /// consumer.
    pub dry_run_consumers: Vec<String>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            enabled: true,
            poll_interval_ms: 500,
            claim_limit: 100,
            lease_seconds: 60,
            heartbeat_seconds: 20,
            max_inflight_events: 200,
            dry_run_consumers: Vec::new(),
        }
    }
}

/// `[index.outbox]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// Retries before a delivery goes dead (3..=20).
    pub max_retries: u32,
    /// First backoff (1..=10).
    pub retry_base_seconds: u32,
    /// Backoff cap (30..=1800).
    pub retry_max_seconds: u32,
    /// Jitter as a fraction of the backoff (0..=1).
    pub retry_jitter_ratio: f64,
    /// Whether exhausted deliveries go dead (if false they keep retrying at the cap).
    pub dead_letter_enabled: bool,
    /// The consumers that get a delivery for every event.
    pub consumers: Vec<String>,
    /// How long a done delivery, and an event all of whose deliveries are done, stays in the
    /// journal (`ce outbox list|show`) before it is pruned; 0 keeps everything (0 or
    /// 60..=31,536,000; docs/store.md "Journal retention").
    pub journal_retention_seconds: u32,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            max_retries: 8,
            retry_base_seconds: 2,
            retry_max_seconds: 300,
            retry_jitter_ratio: 0.2,
            dead_letter_enabled: true,
            consumers: vec![
                VECTOR_CONSUMER.into(),
                KEYWORD_CONSUMER.into(),
                RELATION_CONSUMER.into(),
                DERIVE_CONSUMER.into(),
            ],
            journal_retention_seconds: 86_400,
        }
    }
}

/// `[index.embedding]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// Which embedder: `local` (a BERT-family model on the CPU, the default), `openai` (any
    /// OpenAI-compatible `/v1/embeddings` endpoint) or `hash` (feature hashing: tests and
    /// benchmarks only, never semantic search).
    pub provider: String,
    /// Model name: for `local`, the model directory's name under the model cache (ignored
    /// when `model_dir` or `CE_MODEL_DIR` is set); for `openai`, the model sent in requests.
    pub model: String,
    /// `local`: the model directory (default: `$CE_MODEL_DIR`, else
    /// `~/.cache/contextengine/models/{model}`, where `scripts/fetch-model.sh` installs it).
    pub model_dir: Option<String>,
    /// `openai`: the server root (a trailing `/v1` is accepted).
    pub base_url: String,
    /// `openai`: the environment variable holding the API key (unset: no key is sent).
    pub api_key_env: String,
    /// `openai`: requested vector dimension (sent as `dimensions`; needed for models whose
    /// dimension is not known in advance). `hash`: the vector dimension (default 384).
    pub dimensions: Option<u32>,
    /// Texts per embedding call (8..=128).
    pub batch_size: u32,
    /// Per-call timeout (5..=120).
    pub timeout_seconds: u32,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig {
            provider: "local".into(),
            model: "all-MiniLM-L6-v2".into(),
            model_dir: None,
            base_url: "https://api.openai.com".into(),
            api_key_env: "OPENAI_API_KEY".into(),
            dimensions: None,
            batch_size: 32,
            timeout_seconds: 30,
        }
    }
}

/// The values of `index.vector.destination`.
pub const VECTOR_DESTINATIONS: [&str; 2] = ["embedded", "pgvector"];

/// `[index.vector]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VectorConfig {
    /// Where vectors live: `embedded` (an ANN index in the data directory, held by one
    /// process at a time) or `pgvector` (a table in PostgreSQL, shared by every process).
    pub destination: String,
    /// PostgreSQL URL of the `pgvector` destination; empty: `store.url` (which must then be
    /// a PostgreSQL URL).
    pub pgvector_url: String,
    /// Records per index write (16..=512).
    pub upsert_batch_size: u32,
    /// Whether the relation index is maintained.
    pub relation_index_enabled: bool,
    /// How often a running engine snapshots the embedded ANN graph when it changed
    /// (10..=86400): bounds the catch-up work after a crash.
    pub snapshot_interval_seconds: u32,
    /// Share of removed graph slots (tombstones) above which a running engine rebuilds the
    /// ANN graph from the stored vectors (0.05..=0.95; only from 1,000 tombstones on).
    pub rebuild_tombstone_ratio: f64,
}

impl Default for VectorConfig {
    fn default() -> Self {
        VectorConfig {
            destination: "embedded".into(),
            pgvector_url: String::new(),
            upsert_batch_size: 128,
            relation_index_enabled: false,
            snapshot_interval_seconds: 300,
            rebuild_tombstone_ratio: 0.3,
        }
    }
}

/// `[index.repair]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairConfig {
    /// Whether long-running processes (`ce serve`, `ce worker`) run the two repair jobs on
    /// their periods (docs/repair.md); off by default.
    pub enabled: bool,
    /// Period of the dead-event scan.
    pub dead_event_scan_interval_minutes: u32,
    /// Period of the index reconcile.
    pub reconcile_interval_minutes: u32,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            enabled: false,
            dead_event_scan_interval_minutes: 10,
            reconcile_interval_minutes: 60,
        }
    }
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Where the source of truth lives: empty for the embedded SQLite file in the data
    /// directory (`ce.db`), or a `postgres://` / `postgresql://` URL (docs/postgres.md).
    pub url: String,
    /// Largest accepted layer text, in bytes (after an append too).
    pub max_layer_bytes: usize,
    /// Milliseconds a writer waits for another process's write lock before giving up
    /// (SQLite only).
    pub busy_timeout_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: String::new(),
            max_layer_bytes: 4 << 20,
            busy_timeout_ms: 10_000,
        }
    }
}

/// `[retrieval]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrievalConfig {
    /// Mode of a search that names none: `auto` (hybrid when both the vector and the keyword
    /// index are configured, else the one that is), `vector`, `keyword` or `hybrid`.
    pub default_mode: String,
    /// Reciprocal rank fusion constant `k` of hybrid search: a node ranked `r` (from 1) by a
    /// mode adds `weight / (k + r)` (1..=1000).
    pub rrf_k: u32,
    /// Weight of the vector ranking in hybrid search (0..=100).
    pub vector_weight: f64,
    /// Weight of the keyword ranking in hybrid search (0..=100).
    pub keyword_weight: f64,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        RetrievalConfig {
            default_mode: "auto".into(),
            rrf_k: 60,
            vector_weight: 1.0,
            keyword_weight: 1.0,
        }
    }
}

/// The consumer (and index) name of the vector index.
pub const VECTOR_CONSUMER: &str = "vector";
/// The consumer (and index) name of the keyword index.
pub const KEYWORD_CONSUMER: &str = "keyword";
/// The consumer (and index) name of the relation index.
pub const RELATION_CONSUMER: &str = "relation";
/// The consumer that derives L0 / L1 layers (docs/derive.md).
pub const DERIVE_CONSUMER: &str = "derive";

/// The values of `retrieval.default_mode`.
pub const RETRIEVAL_MODES: [&str; 4] = ["auto", "vector", "keyword", "hybrid"];

/// `[server]`: who may call `ce serve` (docs/http-api.md, "Authentication and tenants").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Lets `ce serve` listen on a non-loopback address without API keys (default false:
    /// it refuses to start, since every caller would see every account).
    pub allow_unauthenticated: bool,
    /// `[[server.api_keys]]`. None: the server is single-user (no key asked, everything
    /// visible). Any: every route but `/healthz` and `/readyz` needs one of them.
    pub api_keys: Vec<ApiKeyConfig>,
    /// Extra `Host` header values (host names or `host:port`) the MCP endpoint `/mcp`
    /// accepts besides the loopback names (its DNS-rebinding protection); `["*"]` accepts
    /// any. Needed when clients reach `ce serve --bind 0.0.0.0:...` by a host name or IP.
    pub allowed_hosts: Vec<String>,
}

/// One `[[server.api_keys]]` entry: a secret and what it may see.
#[derive(Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key itself (at least 16 characters). Prefer `key_env`, which keeps the secret
    /// out of the file.
    pub key: Option<String>,
    /// The environment variable holding the key, read when the server starts.
    pub key_env: Option<String>,
    /// The account (first URI segment) the key works in; required unless `admin`.
    pub account_id: Option<String>,
    /// The owner spaces (`user:ID`, `agent:ID`, `shared`) the key sees within its account;
    /// empty: all of them.
    pub owner_spaces: Vec<String>,
    /// An admin key sees every account and may call the operations routes (outbox,
    /// status, reindex, metrics); it has no `account_id` or `owner_spaces`.
    pub admin: bool,
}

/// Shortest accepted API key, in characters.
pub const MIN_API_KEY_CHARS: usize = 16;

impl std::fmt::Debug for ApiKeyConfig {
    // The key is a secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("key_env", &self.key_env)
            .field("account_id", &self.account_id)
            .field("owner_spaces", &self.owner_spaces)
            .field("admin", &self.admin)
            .finish()
    }
}

impl ApiKeyConfig {
    /// The owner spaces, parsed (empty: all spaces of the account).
    pub fn owner_spaces(&self) -> Result<Vec<crate::OwnerSpace>, CoreError> {
        self.owner_spaces.iter().map(|o| o.parse()).collect()
    }
}

/// Checks that `key` is usable as an API key: long enough, printable, no whitespace.
pub fn check_api_key(key: &str) -> Result<(), String> {
    if key.chars().count() < MIN_API_KEY_CHARS {
        return Err(format!("is shorter than {MIN_API_KEY_CHARS} characters"));
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    Ok(())
}

impl ServerConfig {
    /// Checks every `[[server.api_keys]]` entry; errors name it (`server.api_keys[1].key`).
    /// Keys read from the environment are checked when the server starts.
    pub fn validate(&self) -> Result<(), CoreError> {
        for (i, k) in self.api_keys.iter().enumerate() {
            let bad = |field: &str, reason: String| CoreError::InvalidConfig {
                key: format!("server.api_keys[{i}]{field}"),
                reason,
            };
            match (&k.key, &k.key_env) {
                (Some(key), None) => {
                    check_api_key(key).map_err(|r| bad(".key", r))?;
                    if self.api_keys[..i]
                        .iter()
                        .any(|o| o.key.as_ref() == Some(key))
                    {
                        return Err(bad(".key", "is the same key as an earlier entry".into()));
                    }
                }
                (None, Some(var)) => {
                    let ok = !var.is_empty()
                        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !ok {
                        return Err(bad(
                            ".key_env",
                            format!("{var:?} is not an environment variable name ([A-Za-z0-9_]+)"),
                        ));
                    }
                    if self.api_keys[..i]
                        .iter()
                        .any(|o| o.key_env.as_ref() == Some(var))
                    {
                        return Err(bad(
                            ".key_env",
                            format!("{var:?} is already the key of an earlier entry"),
                        ));
                    }
                }
                _ => return Err(bad("", "set exactly one of key and key_env".into())),
            }
            if k.admin {
                if k.account_id.is_some() || !k.owner_spaces.is_empty() {
                    return Err(bad(
                        "",
                        "an admin key sees every account: remove account_id and owner_spaces"
                            .into(),
                    ));
                }
                continue;
            }
            let Some(account) = &k.account_id else {
                return Err(bad(
                    ".account_id",
                    "is required (or set admin = true for a key that sees every account)".into(),
                ));
            };
            let canonical = crate::CtxUri::parse(&format!("{}{account}", crate::uri::SCHEME));
            if !canonical.is_ok_and(|u| u.depth() == 1 && u.account_id() == account) {
                return Err(bad(
                    ".account_id",
                    format!("{account:?} is not a single ctx:// URI segment"),
                ));
            }
            let spaces = k
                .owner_spaces()
                .map_err(|e| bad(".owner_spaces", e.to_string()))?;
            for (j, o) in spaces.iter().enumerate() {
                if spaces[..j].contains(o) {
                    return Err(bad(".owner_spaces", format!("{o} is listed twice")));
                }
            }
        }
        Ok(())
    }
}

/// Whether `url` names PostgreSQL (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Checks that `url` (the value of `key`) is a PostgreSQL URL. The message shows the scheme
/// only: the rest may hold a password.
fn postgres_url(key: &str, url: &str, empty_means: &str) -> Result<(), CoreError> {
    if url.is_empty() || is_postgres_url(url) {
        return Ok(());
    }
    let got = match url.split_once("://") {
        Some((scheme, _)) => format!("a {scheme}:// URL"),
        None => format!("{url:?}"),
    };
    Err(CoreError::InvalidConfig {
        key: key.to_owned(),
        reason: format!(
            "{got} is not supported: use a postgres:// or postgresql:// URL, or leave it empty for {empty_means}"
        ),
    })
}

/// The 1-based line and column (in characters) of byte `at` of `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let at = (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// The full dotted key (`index.worker.lease_seconds`, `server.api_keys[1].admin`) whose key
/// or value spans byte `at` of `text`; `None` when the text does not parse as TOML (a syntax
/// error) or `at` is in no key.
fn key_at(text: &str, at: usize) -> Option<String> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    key_in_table(doc.as_table(), "", at)
}

fn covers(span: Option<std::ops::Range<usize>>, at: usize) -> bool {
    span.is_some_and(|s| s.start <= at && at < s.end.max(s.start + 1))
}

fn join_key(prefix: &str, key: &str) -> String {
    let simple = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if simple {
        key.to_owned()
    } else {
        format!("{key:?}")
    };
    if prefix.is_empty() {
        key
    } else {
        format!("{prefix}.{key}")
    }
}

fn key_in_table(t: &dyn toml_edit::TableLike, prefix: &str, at: usize) -> Option<String> {
    for (k, item) in t.iter() {
        let path = join_key(prefix, k);
        if let Some(found) = key_in_item(item, &path, at) {
            return Some(found);
        }
        if covers(t.key(k).and_then(toml_edit::Key::span), at) {
            return Some(path);
        }
    }
    None
}

fn key_in_item(item: &toml_edit::Item, path: &str, at: usize) -> Option<String> {
    match item {
        toml_edit::Item::Table(t) => key_in_table(t, path, at),
        toml_edit::Item::ArrayOfTables(a) => a.iter().enumerate().find_map(|(i, t)| {
            key_in_table(t, &format!("{path}[{i}]"), at)
                .or_else(|| covers(t.span(), at).then(|| format!("{path}[{i}]")))
        }),
        toml_edit::Item::Value(v) => key_in_value(v, path, at),
        toml_edit::Item::None => None,
    }
}

fn key_in_value(v: &toml_edit::Value, path: &str, at: usize) -> Option<String> {
    let inner = match v {
        toml_edit::Value::InlineTable(t) => key_in_table(t, path, at),
        toml_edit::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| key_in_value(v, &format!("{path}[{i}]"), at)),
        _ => None,
    };
    inner.or_else(|| covers(v.span(), at).then(|| path.to_owned()))
}

fn range<T: PartialOrd + Copy + std::fmt::Display>(
    key: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), CoreError> {
    // `contains` also rejects NaN.
    if !(lo..=hi).contains(&v) {
        return Err(CoreError::InvalidConfig {
            key: key.to_owned(),
            reason: format!("{v} is outside {lo}..={hi}"),
        });
    }
    Ok(())
}

impl Config {
    /// The context types whose nodes get derived layers: `[derive] types`, or none when the
    /// `derive` consumer is not one of `index.outbox.consumers`.
    pub fn derived_types(&self) -> Vec<ContextType> {
        if self
            .index
            .outbox
            .consumers
            .iter()
            .any(|c| c == DERIVE_CONSUMER)
        {
            self.derive.derived_types()
        } else {
            Vec::new()
        }
    }

    /// Why memory extraction is off, or `None` when it runs: `sessions.extraction = "off"`,
    /// or no model named in `[derive.llm]`.
    pub fn extraction_off(&self) -> Option<String> {
        if self.sessions.extraction == "off" {
            Some("sessions.extraction is \"off\"".into())
        } else if self.derive.llm.model.trim().is_empty() {
            Some("no LLM is configured: [derive.llm] names no model".into())
        } else {
            None
        }
    }

    /// Whether the source of truth is PostgreSQL (`store.url`).
    pub fn store_is_postgres(&self) -> bool {
        is_postgres_url(&self.store.url)
    }

    /// The PostgreSQL URL of the vector index when `index.vector.destination` is
    /// `pgvector`: `index.vector.pgvector_url`, else `store.url`. `None` for the embedded
    /// destination.
    pub fn pgvector_url(&self) -> Option<&str> {
        let v = &self.index.vector;
        if v.destination != "pgvector" {
            return None;
        }
        Some(if v.pgvector_url.is_empty() {
            &self.store.url
        } else {
            &v.pgvector_url
        })
    }

    /// Parses TOML text and validates it; errors name the key.
    pub fn from_toml(text: &str) -> Result<Config, CoreError> {
        let cfg = Config::parse_toml(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text without checking values, for callers that apply overrides first
    /// (e.g. the CLI's `--store`); they must call [`Config::validate`] afterwards.
    pub fn parse_toml(text: &str) -> Result<Config, CoreError> {
        toml::from_str(text).map_err(|e| {
            let Some(at) = e.span().map(|s| s.start) else {
                return CoreError::InvalidConfig {
                    key: "(the file)".into(),
                    reason: e.message().to_owned(),
                };
            };
            let (line, column) = line_column(text, at);
            match key_at(text, at) {
                Some(key) => CoreError::InvalidConfig {
                    key,
                    reason: format!("{} (line {line}, column {column})", e.message()),
                },
                None => CoreError::InvalidConfig {
                    key: format!("at line {line}, column {column}"),
                    reason: e.message().to_owned(),
                },
            }
        })
    }

    /// Checks every value against spec §12.4 (and our own keys' ranges).
    pub fn validate(&self) -> Result<(), CoreError> {
        let w = &self.index.worker;
        range(
            "index.worker.poll_interval_ms",
            w.poll_interval_ms,
            10,
            60_000,
        )?;
        range("index.worker.claim_limit", w.claim_limit, 10, 500)?;
        range("index.worker.lease_seconds", w.lease_seconds, 15, 300)?;
        range(
            "index.worker.heartbeat_seconds",
            w.heartbeat_seconds,
            1,
            w.lease_seconds / 2,
        )?;
        range(
            "index.worker.max_inflight_events",
            w.max_inflight_events,
            50,
            2000,
        )?;
        let o = &self.index.outbox;
        range("index.outbox.max_retries", o.max_retries, 3, 20)?;
        range(
            "index.outbox.retry_base_seconds",
            o.retry_base_seconds,
            1,
            10,
        )?;
        range(
            "index.outbox.retry_max_seconds",
            o.retry_max_seconds,
            30,
            1800,
        )?;
        range(
            "index.outbox.retry_jitter_ratio",
            o.retry_jitter_ratio,
            0.0,
            1.0,
        )?;
        if o.journal_retention_seconds != 0 {
            range(
                "index.outbox.journal_retention_seconds",
                o.journal_retention_seconds,
                60,
                31_536_000,
            )?;
        }
        if o.consumers.is_empty() {
            return Err(CoreError::InvalidConfig {
                key: "index.outbox.consumers".into(),
                reason: "at least one consumer is required".into(),
            });
        }
        for (i, c) in o.consumers.iter().enumerate() {
            let ok = !c.is_empty()
                && c.len() <= 64
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-');
            if !ok || o.consumers[..i].contains(c) {
                return Err(CoreError::InvalidConfig {
                    key: "index.outbox.consumers".into(),
                    reason: format!("{c:?} is not a unique name of [A-Za-z0-9_-]{{1,64}}"),
                });
            }
        }
        if let Some(c) = w
            .dry_run_consumers
            .iter()
            .find(|c| !o.consumers.contains(c))
        {
            return Err(CoreError::InvalidConfig {
                key: "index.worker.dry_run_consumers".into(),
                reason: format!(
                    "{c:?} is not one of index.outbox.consumers {:?}",
                    o.consumers
                ),
            });
        }
        let e = &self.index.embedding;
        if !matches!(e.provider.as_str(), "local" | "openai" | "hash") {
            return Err(CoreError::InvalidConfig {
                key: "index.embedding.provider".into(),
                reason: format!(
                    "{:?} is not one of \"local\", \"openai\", \"hash\"",
                    e.provider
                ),
            });
        }
        if e.model.trim().is_empty() {
            return Err(CoreError::InvalidConfig {
                key: "index.embedding.model".into(),
                reason: "must not be empty".into(),
            });
        }
        if let Some(d) = e.dimensions {
            range("index.embedding.dimensions", d, 1, 65_536)?;
        }
        range("index.embedding.batch_size", e.batch_size, 8, 128)?;
        range("index.embedding.timeout_seconds", e.timeout_seconds, 5, 120)?;
        let l = &self.lock;
        if !LOCK_PROVIDERS.contains(&l.provider.as_str()) {
            return Err(CoreError::InvalidConfig {
                key: "lock.provider".into(),
                reason: format!("{:?} is not one of {LOCK_PROVIDERS:?}", l.provider),
            });
        }
        range("lock.lock_expire_secs", l.lock_expire_secs, 1.0, 3600.0)?;
        range("lock.wait_ms", l.wait_ms, 0, 600_000)?;
        if l.service_name.is_empty()
            || !l
                .service_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(CoreError::InvalidConfig {
                key: "lock.service_name".into(),
                reason: format!("{:?} is not a name of [A-Za-z0-9_.-]+", l.service_name),
            });
        }
        let r = &self.retrieval;
        if !RETRIEVAL_MODES.contains(&r.default_mode.as_str()) {
            return Err(CoreError::InvalidConfig {
                key: "retrieval.default_mode".into(),
                reason: format!("{:?} is not one of {RETRIEVAL_MODES:?}", r.default_mode),
            });
        }
        range("retrieval.rrf_k", r.rrf_k, 1, 1000)?;
        range("retrieval.vector_weight", r.vector_weight, 0.0, 100.0)?;
        range("retrieval.keyword_weight", r.keyword_weight, 0.0, 100.0)?;
        if r.vector_weight + r.keyword_weight <= 0.0 {
            return Err(CoreError::InvalidConfig {
                key: "retrieval.vector_weight".into(),
                reason: "the vector and keyword weights must not both be 0".into(),
            });
        }
        let v = &self.index.vector;
        if !VECTOR_DESTINATIONS.contains(&v.destination.as_str()) {
            return Err(CoreError::InvalidConfig {
                key: "index.vector.destination".into(),
                reason: format!("{:?} is not one of {VECTOR_DESTINATIONS:?}", v.destination),
            });
        }
        postgres_url("index.vector.pgvector_url", &v.pgvector_url, "store.url")?;
        if self.pgvector_url().is_some_and(str::is_empty) {
            return Err(CoreError::InvalidConfig {
                key: "index.vector.pgvector_url".into(),
                reason: "destination \"pgvector\" needs a PostgreSQL URL: set it, or set store.url to one".into(),
            });
        }
        range(
            "index.vector.upsert_batch_size",
            self.index.vector.upsert_batch_size,
            16,
            512,
        )?;
        range(
            "index.vector.snapshot_interval_seconds",
            self.index.vector.snapshot_interval_seconds,
            10,
            86_400,
        )?;
        range(
            "index.vector.rebuild_tombstone_ratio",
            self.index.vector.rebuild_tombstone_ratio,
            0.05,
            0.95,
        )?;
        let r = &self.index.repair;
        range(
            "index.repair.dead_event_scan_interval_minutes",
            r.dead_event_scan_interval_minutes,
            1,
            10_080,
        )?;
        range(
            "index.repair.reconcile_interval_minutes",
            r.reconcile_interval_minutes,
            1,
            10_080,
        )?;
        postgres_url(
            "store.url",
            &self.store.url,
            "the embedded SQLite file in the data directory",
        )?;
        range(
            "store.max_layer_bytes",
            self.store.max_layer_bytes,
            1024,
            256 << 20,
        )?;
        range(
            "store.busy_timeout_ms",
            self.store.busy_timeout_ms,
            0,
            600_000,
        )?;
        range(
            "projector.l0_fallback_chars",
            self.projector.l0_fallback_chars,
            1,
            100_000,
        )?;
        range(
            "projector.l1_fallback_chars",
            self.projector.l1_fallback_chars,
            1,
            1_000_000,
        )?;
        self.server.validate()?;
        self.jobs.validate()?;
        self.derive.validate()?;
        self.sessions.validate()?;
        self.ingest.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let c = Config::default();
        c.validate().expect("defaults valid");
        assert_eq!(c.index.outbox.max_retries, 8);
        assert_eq!(c.index.worker.lease_seconds, 60);
        assert_eq!(Config::from_toml("").expect("empty file"), c);
    }

    #[test]
    fn out_of_range_names_the_key() {
        let err = Config::from_toml("[index.worker]\nlease_seconds = 5\n").expect_err("range");
        assert!(
            err.to_string().contains("index.worker.lease_seconds"),
            "{err}"
        );
        let err =
            Config::from_toml("[index.outbox]\nretry_jitter_ratio = 1.5\n").expect_err("range");
        assert!(
            err.to_string().contains("index.outbox.retry_jitter_ratio"),
            "{err}"
        );
    }

    #[test]
    fn job_settings_apply_type_overrides_and_are_checked() {
        let c = Config::from_toml(
            "[jobs]\nconcurrency = 3\n[jobs.types.reindex]\nconcurrency = 1\nmax_retries = 0\n",
        )
        .expect("valid");
        let r = c.jobs.settings("reindex");
        assert_eq!((r.concurrency, r.max_retries), (1, 0));
        let other = c.jobs.settings("import");
        assert_eq!((other.concurrency, other.max_retries), (3, 5));
        for (toml, key) in [
            ("[jobs]\nlease_seconds = 5\n", "jobs.lease_seconds"),
            ("[jobs]\nheartbeat_seconds = 40\n", "jobs.heartbeat_seconds"),
            ("[jobs]\nconcurrency = 0\n", "jobs.concurrency"),
            (
                "[jobs.types.reindex]\nconcurrency = 65\n",
                "jobs.types.reindex.concurrency",
            ),
            (
                "[jobs.types.reindex]\nretry_base_seconds = 60\nretry_max_seconds = 30\n",
                "jobs.types.reindex.retry_max_seconds",
            ),
            (
                "[jobs.types.Re-Index]\nconcurrency = 1\n",
                "jobs.types.Re-Index",
            ),
        ] {
            let err = Config::from_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
        assert!(valid_job_type("session-commit") && valid_job_type("kb_index2"));
        assert!(!valid_job_type("") && !valid_job_type("2x") && !valid_job_type("a b"));
    }

    #[test]
    fn sessions_keys_are_checked() {
        for (toml, key) in [
            (
                "[sessions]\nsimilarity_threshold = 0.2\n",
                "sessions.similarity_threshold",
            ),
            (
                "[sessions]\nsemantic_threshold = 0.4\n",
                "sessions.semantic_threshold",
            ),
            (
                "[sessions]\nsemantic_threshold = 1.5\n",
                "sessions.semantic_threshold",
            ),
            (
                "[sessions]\nsemantic_threshold = nan\n",
                "sessions.semantic_threshold",
            ),
            ("[sessions]\nmax_windows = 0\n", "sessions.max_windows"),
            ("[sessions]\nmax_windows = 1001\n", "sessions.max_windows"),
        ] {
            let err = Config::from_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
        let off = Config::from_toml("[sessions]\nsemantic_threshold = 0\nmax_windows = 1\n")
            .expect("0 turns the embedding signal off");
        assert_eq!(off.sessions.semantic_threshold, 0.0);
        assert_eq!(off.sessions.max_windows, 1);
    }

    #[test]
    fn derive_keys_are_checked_and_derivation_needs_its_consumer() {
        for (toml, key) in [
            ("[derive]\ngenerator = \"gpt\"\n", "derive.generator"),
            (
                "[derive]\ntypes = [\"resource\", \"note\"]\n",
                "derive.types[1]",
            ),
            ("[derive]\nbatch_size = 0\n", "derive.batch_size"),
            ("[derive]\ngenerator = \"llm\"\n", "derive.llm.model"),
            (
                "[derive.llm]\ntemperature = 3.0\n",
                "derive.llm.temperature",
            ),
        ] {
            let err = Config::from_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
        assert_eq!(
            Config::default().derived_types(),
            [ContextType::Resource, ContextType::Session],
            "derive is a default consumer, for resources and sessions"
        );
        let off = Config::from_toml("[index.outbox]\nconsumers = [\"vector\", \"keyword\"]\n")
            .expect("valid");
        assert!(off.derived_types().is_empty(), "off without its consumer");
        let on = Config::from_toml(
            "[index.outbox]\nconsumers = [\"vector\", \"derive\"]\n[derive]\ntypes = [\"memory\"]\n",
        )
        .expect("valid");
        assert_eq!(on.derived_types(), [ContextType::Memory]);
    }

    #[test]
    fn retrieval_keys_are_checked() {
        for (toml, key) in [
            (
                "[retrieval]\ndefault_mode = \"fuzzy\"\n",
                "retrieval.default_mode",
            ),
            ("[retrieval]\nrrf_k = 0\n", "retrieval.rrf_k"),
            (
                "[index.worker]\ndry_run_consumers = [\"graph\"]\n",
                "index.worker.dry_run_consumers",
            ),
            (
                "[retrieval]\nkeyword_weight = -1.0\n",
                "retrieval.keyword_weight",
            ),
            (
                "[retrieval]\nkeyword_weight = 0.0\nvector_weight = 0.0\n",
                "retrieval.vector_weight",
            ),
        ] {
            let err = Config::from_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
        let c = Config::from_toml("[retrieval]\ndefault_mode = \"keyword\"\nrrf_k = 10\n")
            .expect("valid");
        assert_eq!(
            (c.retrieval.default_mode.as_str(), c.retrieval.rrf_k),
            ("keyword", 10)
        );
    }

    #[test]
    fn api_keys_are_checked_and_errors_name_the_entry() {
        let ok = Config::from_toml(
            "[[server.api_keys]]\nkey_env = \"CE_KEY_A\"\naccount_id = \"acc1\"\n\
             owner_spaces = [\"user:u1\", \"shared\"]\n\
             [[server.api_keys]]\nkey = \"0123456789abcdef-admin\"\nadmin = true\n",
        )
        .expect("valid keys");
        assert_eq!(ok.server.api_keys.len(), 2);
        assert!(
            !format!("{ok:?}").contains("0123456789abcdef"),
            "key printed"
        );
        let err = |toml: &str| Config::from_toml(toml).expect_err("refused").to_string();
        let cases = [
            (
                "key = \"short\"\naccount_id = \"a\"",
                "server.api_keys[0].key",
            ),
            ("account_id = \"a\"", "server.api_keys[0]: set exactly one"),
            (
                "key_env = \"K\"\nkey = \"0123456789abcdef\"\naccount_id = \"a\"",
                "server.api_keys[0]: set exactly one",
            ),
            (
                "key_env = \"K-1\"\naccount_id = \"a\"",
                "server.api_keys[0].key_env",
            ),
            ("key_env = \"K\"", "server.api_keys[0].account_id"),
            (
                "key_env = \"K\"\naccount_id = \"a/b\"",
                "server.api_keys[0].account_id",
            ),
            (
                "key_env = \"K\"\naccount_id = \"..\"",
                "server.api_keys[0].account_id",
            ),
            (
                "key_env = \"K\"\naccount_id = \"a\"\nowner_spaces = [\"user:\"]",
                "server.api_keys[0].owner_spaces",
            ),
            (
                "key_env = \"K\"\naccount_id = \"a\"\nowner_spaces = [\"shared\", \"shared\"]",
                "server.api_keys[0].owner_spaces",
            ),
            (
                "key_env = \"K\"\nadmin = true\naccount_id = \"a\"",
                "server.api_keys[0]: an admin key",
            ),
        ];
        for (entry, want) in cases {
            let e = err(&format!("[[server.api_keys]]\n{entry}\n"));
            assert!(e.contains(want), "{entry}: {e}");
        }
        let twice = "[[server.api_keys]]\nkey_env = \"K\"\nadmin = true\n\
                     [[server.api_keys]]\nkey_env = \"K\"\naccount_id = \"a\"\n";
        assert!(
            err(twice).contains("server.api_keys[1].key_env"),
            "{}",
            err(twice)
        );
        let same = "[[server.api_keys]]\nkey = \"0123456789abcdef\"\nadmin = true\n\
                    [[server.api_keys]]\nkey = \"0123456789abcdef\"\naccount_id = \"a\"\n";
        assert!(
            err(same).contains("server.api_keys[1].key"),
            "{}",
            err(same)
        );
    }

    #[test]
    fn store_and_vector_destinations_are_checked() {
        let c = Config::default();
        assert_eq!((c.store.url.as_str(), c.pgvector_url()), ("", None));
        assert!(!c.store_is_postgres());
        let pg = Config::from_toml(
            "[store]\nurl = \"postgresql://u@db/ce\"\n[index.vector]\ndestination = \"pgvector\"\n",
        )
        .expect("valid");
        assert!(pg.store_is_postgres());
        assert_eq!(pg.pgvector_url(), Some("postgresql://u@db/ce"));
        let own = Config::from_toml(
            "[index.vector]\ndestination = \"pgvector\"\npgvector_url = \"postgres://v@vec/x\"\n",
        )
        .expect("sqlite source, pgvector vectors");
        assert_eq!(own.pgvector_url(), Some("postgres://v@vec/x"));
        for (toml, key, shown) in [
            (
                "[store]\nurl = \"mysql://root:secret@h/db\"\n",
                "store.url",
                "mysql://",
            ),
            ("[store]\nurl = \"ce.db\"\n", "store.url", "\"ce.db\""),
            (
                "[index.vector]\ndestination = \"qdrant\"\n",
                "index.vector.destination",
                "qdrant",
            ),
            (
                "[index.vector]\ndestination = \"pgvector\"\n",
                "index.vector.pgvector_url",
                "store.url",
            ),
            (
                "[index.vector]\npgvector_url = \"redis://h\"\n",
                "index.vector.pgvector_url",
                "redis://",
            ),
        ] {
            let err = Config::from_toml(toml).expect_err(toml).to_string();
            assert!(err.contains(key) && err.contains(shown), "{toml}: {err}");
            assert!(!err.contains("secret"), "password shown: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::from_toml("[index.worker]\nleese_seconds = 60\n").expect_err("typo");
        assert!(err.to_string().contains("leese_seconds"), "{err}");
    }

    /// Parse errors name the full dotted key and its line and column, not a byte offset.
    #[test]
    fn parse_errors_give_the_full_key_line_and_column() {
        let err = |text: &str| match Config::parse_toml(text) {
            Err(CoreError::InvalidConfig { key, reason }) => (key, reason),
            other => panic!("{text:?}: {other:?}"),
        };
        for (text, want_key, want_at) in [
            (
                "[index.worker]\nleese_seconds = 60\n",
                "index.worker.leese_seconds",
                "(line 2, column 1)",
            ),
            (
                "# comment\n[index.worker]\nlease_seconds = \"60\"\n",
                "index.worker.lease_seconds",
                "(line 3, column 17)",
            ),
            (
                "index.outbox.max_retries = true\n",
                "index.outbox.max_retries",
                "(line 1, column 28)",
            ),
            (
                "[[server.api_keys]]\nkey_env = \"A\"\nadmin = true\n\n\
                 [[server.api_keys]]\nkey_env = \"B\"\nadmn = true\n",
                "server.api_keys[1].admn",
                "(line 7, column 1)",
            ),
            (
                "[index.outbox]\nconsumers = [\"vector\", 7]\n",
                "index.outbox.consumers[1]",
                "(line 2, column 24)",
            ),
            (
                "[store]\nurl = \"x\"\n[lock]\nprovider = { a = 1 }\n",
                "lock.provider",
                "(line 4, column 12)",
            ),
        ] {
            let (key, reason) = err(text);
            assert_eq!(key, want_key, "{text:?}: {reason}");
            assert!(reason.ends_with(want_at), "{text:?}: {reason}");
            assert!(!reason.contains("byte"), "{reason}");
        }
        // A syntax error has no key: the position stands in for it.
        let (key, _) = err("[index.worker]\nlease_seconds = = 3\n");
        assert!(key.starts_with("at line 2, column "), "{key}");
        assert_eq!(line_column("ab\ncé\nx", 6), (2, 3));
        assert_eq!(line_column("", 0), (1, 1));
    }
}
