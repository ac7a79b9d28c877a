//! A `ce` runner bound to a temporary data directory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The built binary.
pub const CE: &str = env!("CARGO_BIN_EXE_ce");

/// The repository root (where `ce demo` finds `examples/demo-tree`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A data directory and the commands run against it.
pub struct Ce {
    /// The data directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// `--config FILE` passed to every command, if set.
    pub config: Option<PathBuf>,
}

/// What a failed command printed and returned.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub exit: i32,
    /// The JSON error document from stderr.
    pub error: Value,
}

impl Ce {
    /// A fresh, empty data directory.
    pub fn new() -> Self {
        Ce {
            dir: tempfile::tempdir().expect("tempdir"),
            config: None,
        }
    }

    /// The data directory's path.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A `ce` command with the data directory set and the environment cleared of `CE_*`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(CE);
        c.env_remove("CE_DATA_DIR")
            .env_remove("CE_CONFIG")
            .env_remove("CE_SERVER")
            .env_remove("CE_STORE")
            .env_remove("CE_API_KEY")
            .env_remove("CE_FAILPOINT_WORKER_EMBED_DELAY_MS")
            .env_remove("CE_FAILPOINT_JOB_PARK_MS")
            .arg("--data-dir")
            .arg(self.data_dir());
        if let Some(cfg) = &self.config {
            c.arg("--config").arg(cfg);
        }
        c.args(args).stdin(Stdio::null());
        c
    }

    /// Runs `ce ARGS`.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("ce runs")
    }

    /// Runs `ce ARGS` with `stdin` piped in.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ce starts");
        child
            .stdin
            .take()
            .expect("stdin piped")
            .write_all(stdin.as_bytes())
            .expect("stdin written");
        child.wait_with_output().expect("ce runs")
    }

    /// Runs `ce ARGS`, asserts success and returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        success(args, self.run(args))
    }

    /// Runs `ce --json ARGS`, asserts success and returns the parsed document.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = success(&all, self.run(&all));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("ce {all:?}: not JSON ({e}): {out}"))
    }

    /// Runs `ce --json ARGS`, asserts it fails with `exit` and returns the error document.
    pub fn fail(&self, args: &[&str], exit: i32) -> Failure {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        let f = failure(&all, &out);
        assert_eq!(f.exit, exit, "ce {all:?}: {:?}", f.error);
        f
    }

    /// The state a bad command must leave alone: `tree ROOT` and the whole outbox.
    pub fn snapshot(&self, root: &str) -> (Value, Value) {
        (
            self.json(&["tree", root]),
            self.json(&["outbox", "list", "--limit", "10000"]),
        )
    }

    /// Writes a node with some content (and its ancestors).
    pub fn put(&self, uri: &str, content: &str) -> Value {
        self.json(&["put", uri, "--content", content])
    }
}

/// The HTTP client of the tests: statuses are answers, not errors; one minute at most.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Asserts that `out` is a success and returns its stdout.
pub fn success(args: &[&str], out: Output) -> String {
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ce {args:?} failed ({:?}): {stderr}\n{stdout}",
        out.status.code()
    );
    stdout
}

/// The JSON error of a `--json` failure: stderr is JSON lines, drain progress objects
/// (`{"progress": ...}`) and then the error object, last.
pub fn json_error(stderr: &str) -> Result<Value, String> {
    let lines: Vec<&str> = stderr.trim().lines().collect();
    let Some((last, progress)) = lines.split_last() else {
        return Err("stderr is empty".into());
    };
    for l in progress {
        let v: Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l:?}"))?;
        if v.get("progress").is_none() {
            return Err(format!("not a progress line: {l}"));
        }
    }
    serde_json::from_str(last).map_err(|e| format!("{e}: {last:?}"))
}

/// Asserts that `out` is a failure with a JSON error on stderr and returns both.
pub fn failure(args: &[&str], out: &Output) -> Failure {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ce {args:?} succeeded");
    assert!(out.stdout.is_empty(), "ce {args:?} printed to stdout");
    let error: Value = json_error(&stderr)
        .unwrap_or_else(|e| panic!("ce {args:?}: stderr is not a JSON error ({e}): {stderr}"));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{error}"
    );
    assert!(error["retryable"].is_boolean(), "{error}");
    Failure {
        exit: out.status.code().expect("exit code"),
        error,
    }
}

/// The URIs of the hits of a `ce --json search` answer, best first.
pub fn hit_uris(search: &Value) -> Vec<String> {
    search["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| h["uri"].as_str().expect("uri").to_owned())
        .collect()
}

/// The rows of `outbox list --consumer vector` (one per event), in sequence order.
pub fn events(ce: &Ce) -> Vec<Value> {
    vector_rows(ce, None)
        .into_iter()
        .map(|r| r["event"].clone())
        .collect()
}

/// The rows of `outbox list --consumer vector` (`{event, delivery}`), only those with
/// `status` when given, in sequence order.
pub fn vector_rows(ce: &Ce, status: Option<&str>) -> Vec<Value> {
    let mut args = vec!["outbox", "list", "--consumer", "vector", "--limit", "10000"];
    if let Some(s) = status {
        args.extend(["--status", s]);
    }
    match ce.json(&args) {
        Value::Array(rows) => rows,
        other => panic!("outbox list: not an array: {other}"),
    }
}

/// The configuration line that selects the hashing embedder (no model needed; tests only).
pub const HASH_EMBEDDER: &str = "[index.embedding]\nprovider = \"hash\"\n";

impl Ce {
    /// A fresh data directory whose `ce.toml` selects the hashing embedder, plus `extra`.
    pub fn hash(extra: &str) -> Self {
        let ce = Ce::new();
        ce.write_config(&format!("{HASH_EMBEDDER}{extra}"));
        ce
    }

    /// Replaces `<data-dir>/ce.toml`.
    pub fn write_config(&self, toml: &str) {
        std::fs::write(self.data_dir().join("ce.toml"), toml).expect("write ce.toml");
    }

    /// Starts `ce serve --bind 127.0.0.1:0 ARGS` and waits for its address.
    pub fn serve(&self, args: &[&str]) -> Server {
        self.serve_with_env(args, &[])
    }

    /// [`Ce::serve`] with extra environment variables (e.g. the `key_env` of API keys).
    pub fn serve_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Server {
        let log_path = self.data_dir().join(format!(
            "serve-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut all = vec!["serve", "--bind", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut child = self
            .command(&all)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("ce serve starts");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout piped"));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).expect("first line");
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("ce serve did not start: {line:?}\n{log}");
        };
        Server {
            url: format!("http://{addr}"),
            child,
            stdout,
            log_path,
            agent: agent(),
        }
    }

    /// Runs `ce --server URL ARGS` (plain output).
    pub fn remote(&self, server: &Server, args: &[&str]) -> Output {
        let mut all = vec!["--server", server.url.as_str()];
        all.extend_from_slice(args);
        self.run(&all)
    }
}

/// A running `ce serve`.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    log_path: PathBuf,
    agent: ureq::Agent,
}

impl Server {
    /// `GET path` → (status, JSON body).
    pub fn get(&self, path: &str) -> (u16, Value) {
        let res = self.agent.get(format!("{}{path}", self.url)).call();
        self.answer(res)
    }

    /// `POST path` with a JSON body → (status, JSON body).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().into_bytes(), "application/json")
    }

    /// `POST path` with raw bytes → (status, JSON body).
    pub fn post_raw(&self, path: &str, body: Vec<u8>, content_type: &str) -> (u16, Value) {
        let res = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", content_type)
            .send(&body[..]);
        self.answer(res)
    }

    /// `GET path` as text.
    pub fn text(&self, path: &str) -> (u16, String) {
        let mut res = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .expect("request");
        let status = res.status().as_u16();
        (status, res.body_mut().read_to_string().expect("body"))
    }

    fn answer(&self, res: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
        let mut res = res.unwrap_or_else(|e| panic!("request failed: {e}\n{}", self.log()));
        let status = res.status().as_u16();
        let text = res.body_mut().read_to_string().expect("body");
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} (status {status})"));
        (status, v)
    }

    /// `POST path`, asserting 200.
    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "POST {path} {body}: {v}");
        v
    }

    /// Searches with a similarity floor of 0.3 (the hashing embedder scores texts without
    /// a shared word near 0; a hash collision of one word can reach 1/3 on short texts).
    pub fn search(&self, query: &str) -> Vec<Value> {
        self.search_min(query, 0.3)
    }

    /// Searches hits scoring at least `min`.
    pub fn search_min(&self, query: &str, min: f64) -> Vec<Value> {
        let v = self.ok(
            "/v1/search",
            &serde_json::json!({"query": query, "min_score": min}),
        );
        v["hits"].as_array().expect("hits").clone()
    }

    /// Polls `search(query)` until `check` holds (at most 20 s).
    pub fn search_until(&self, query: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.search_until_min(query, 0.3, check)
    }

    /// Polls `search_min(query, min)` until `check` holds (at most 20 s).
    pub fn search_until_min(
        &self,
        query: &str,
        min: f64,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        eventually(Duration::from_secs(20), || {
            let hits = self.search_min(query, min);
            check(&hits).then_some(hits)
        })
        .unwrap_or_else(|| {
            panic!(
                "search {query:?} never satisfied the check; last hits {:?}\n{}",
                self.search_min(query, min),
                self.log()
            )
        })
    }

    /// Waits (at most 20 s) until the vector consumer has no lag.
    pub fn wait_drained(&self) {
        let drained = eventually(Duration::from_secs(20), || {
            let (_, s) = self.get("/v1/status");
            let lag = s["consumers"]
                .as_array()?
                .iter()
                .find(|c| c["consumer"] == "vector")?["lag_events"]
                .as_u64()?;
            (lag == 0).then_some(())
        });
        assert!(
            drained.is_some(),
            "vector lag never reached 0\n{}",
            self.log()
        );
    }

    /// The value of the Prometheus sample whose line starts with `name` and contains every
    /// `labels` fragment (0 when absent).
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let (status, text) = self.text("/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter(|l| l.starts_with(name) && labels.iter().all(|f| l.contains(f)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Sends SIGTERM and waits; returns the exit code and the rest of stdout.
    pub fn stop(mut self) -> (Option<i32>, String) {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(killed.success());
        let status = self.child.wait().expect("ce serve exits");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).expect("stdout");
        (status.code(), rest)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls `f` until it returns `Some` or `timeout` passes.
pub fn eventually<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The Python interpreter of the external-client tests (`CE_TEST_PYTHON`, else `python3`);
/// `.ci/run` installs `tests/requirements.txt` into it.
pub fn python() -> String {
    std::env::var("CE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs an external client program (a Python or Node.js script of `tests/` or `clients/`)
/// from the repository root with `env`, asserts that it exits 0 and returns its stdout. Its
/// output is shown when it fails; a missing interpreter or package is a failure, not a skip.
pub fn external(program: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?} does not start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status.code()
    );
    stdout
}
