//! Test support shared by the workspace's test suites: replayable seeds, crash children and
//! throwaway PostgreSQL databases ([`pg`], [`pgvector`]) and a loopback HTTP server standing in
//! for paid remote APIs ([`http`]).
//!
//! A crash test re-runs its own test binary as a child that executes one `#[test]` function
//! (the "child"), lets it work for a while, kills it with SIGKILL and reads the lines it
//! printed before dying. Only complete lines count: a line cut by the kill was never
//! acknowledged.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub mod backends;
/// The loopback HTTP server for wire-protocol test doubles; it lives in `ce-http`, so that
/// `ce bench ingest` can serve its embedder without this crate at run time.
pub use ce_http::loopback as http;
pub mod extractor;
pub mod pg;
pub mod pgvector;

/// The seed of a randomized test: `CE_SEED` when set (replay), else a random one; printed
/// either way so that a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("CE_SEED") {
        Ok(v) => v
            .trim()
            .parse()
            .expect("CE_SEED must be an unsigned 64-bit integer"),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: seed {seed} (replay with CE_SEED={seed})");
    seed
}

/// A proptest runner whose cases follow from `seed` alone (so `CE_SEED` replays them), with
/// `cases` cases, at most `max_shrink_iters` shrinking steps and no failure file.
pub fn seeded_runner(
    seed: u64,
    cases: u32,
    max_shrink_iters: u32,
) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
        );
    }
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// The libtest name of test function `name` defined in module `module_path` (pass
/// `module_path!()`): the module path without the crate, then the function.
pub fn test_name(module_path: &str, name: &str) -> String {
    let path = module_path
        .split_once("::")
        .map_or(module_path, |(_, rest)| rest);
    format!("{path}::{name}")
}

/// Runs test `child` (a [`test_name`]) of the current test binary in a child process with
/// `env`, stderr to `log`; kills it with SIGKILL after `run_for` and returns the complete
/// lines it printed on stdout. Panics (with the log) if the child exits before the kill.
pub fn run_and_kill(
    child: &str,
    env: &[(&str, String)],
    run_for: Duration,
    log: &Path,
) -> Vec<String> {
    let stderr = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args(["--exact", child, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut proc = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("spawn the child");
    let stdout = proc.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut line = String::new();
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if line.ends_with('\n') {
                lines.push(line.trim_end().to_owned());
            }
            line.clear();
        }
        lines
    });
    std::thread::sleep(run_for);
    if let Some(status) = proc.try_wait().expect("try_wait") {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        panic!("the child exited by itself ({status}) before the kill:\n{log}");
    }
    proc.kill().expect("SIGKILL the child");
    proc.wait().expect("reap the child");
    reader.join().expect("reader thread")
}
