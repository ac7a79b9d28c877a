//! A `ce` runner bound to a temporary data directory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

/// Asserts that `out` is a failure with a JSON error on stderr and returns both.
pub fn failure(args: &[&str], out: &Output) -> Failure {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ce {args:?} succeeded");
    assert!(out.stdout.is_empty(), "ce {args:?} printed to stdout");
    let error: Value = serde_json::from_str(stderr.trim())
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

/// The rows of `outbox list --consumer vector` (one per event), in sequence order.
pub fn events(ce: &Ce) -> Vec<Value> {
    let rows = ce.json(&["outbox", "list", "--consumer", "vector", "--limit", "10000"]);
    rows.as_array()
        .expect("array")
        .iter()
        .map(|r| r["event"].clone())
        .collect()
}
