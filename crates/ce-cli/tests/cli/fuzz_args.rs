//! Argument fuzz (issue 5, bad input): seeded random argument vectors — known subcommands
//! with random, malformed or misplaced flags and values (URIs, levels, numbers out of range,
//! empty and huge strings, control characters, unicode), unknown subcommands — run through
//! the real binary against a data directory holding a few nodes. Every run ends with a
//! documented exit code (0 … 7; 2 also for clap's usage errors) and never a panic; a typed
//! failure prints `error: <message> [<code>]` (with `--json`: `{code, message, retryable}`
//! and nothing on stdout) whose code maps to that exit code; and the stored nodes are unharmed.
//!
//! `CE_FUZZ_CASES` sets the number of runs (default 400); `CE_SEED` replays a run.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ce_core::{CtxUri, ErrorCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::harness::Ce;

const KEEP: &str = "ctx://keep";
const KEEP_A: &str = "ctx://keep/docs/a";
const KEEP_B: &str = "ctx://keep/docs/b";
/// Longest a run may take (the machine may be loaded; a hang is a failure).
const TIMEOUT: Duration = Duration::from_secs(120);

fn pick<'a>(rng: &mut StdRng, v: &[&'a str]) -> &'a str {
    v[rng.random_range(0..v.len())]
}

/// Pieces of malformed text.
const JUNK: &[&str] = &[
    "ctx://",
    "CTX://",
    "ctx:/",
    "http://",
    "/",
    "//",
    ".",
    "..",
    "%2F",
    "%",
    "?",
    "#",
    "\\",
    " ",
    "\t",
    "\n",
    "\u{7}",
    "\u{1b}",
    "\u{7f}",
    "\u{a0}",
    "\u{202e}",
    "\u{301}",
    "中文",
    "שלום",
    "😀",
    "content.md",
    ".meta.json",
    "fz",
    "keep",
    "docs",
    "a",
    "=",
    "-",
    "--",
    "'",
    "\"",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "null",
];

fn junk(rng: &mut StdRng, max: usize) -> String {
    (0..rng.random_range(0..=max))
        .map(|_| pick(rng, JUNK))
        .collect()
}

/// A URI argument: valid (in the scratch subtree or the kept one), respelled, or malformed.
fn uri(rng: &mut StdRng) -> String {
    match rng.random_range(0..10) {
        0..=2 => format!(
            "ctx://fz/{}{}",
            pick(rng, &["a", "b", "c", "d/e", "x/y/z"]),
            pick(rng, &["", "/", "/n"])
        ),
        3 | 4 => pick(
            rng,
            &[KEEP, KEEP_A, KEEP_B, "CTX://keep/docs/a/", " ctx://keep "],
        )
        .into(),
        5 => format!("ctx://{}", junk(rng, 6)),
        6 => junk(rng, 8),
        7 => pick(
            rng,
            &["", "ctx://", "ctx:///", "ctx://fz//a", "ctx://fz/../keep"],
        )
        .into(),
        8 => format!("ctx://fz/{}", "y".repeat(rng.random_range(4000..4200))),
        _ => format!("ctx://fz/{}", "z".repeat(rng.random_range(1..100_000))),
    }
}

fn number(rng: &mut StdRng) -> String {
    pick(
        rng,
        &[
            "0",
            "1",
            "2",
            "3",
            "-1",
            "7",
            "100",
            "101",
            "1000",
            "1001",
            "65536",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775809",
            "1e3",
            "0.5",
            "-0.0",
            "NaN",
            "inf",
            "0x10",
            "",
            " 1",
            "٣",
            "1_000",
            "+5",
        ],
    )
    .into()
}

/// A value for a flag: mostly a plausible one for `flag`, sometimes anything.
fn value(rng: &mut StdRng, flag: &str) -> String {
    if rng.random_bool(0.25) {
        return match rng.random_range(0..5) {
            0 => String::new(),
            1 => number(rng),
            2 => uri(rng),
            3 => "x".repeat(rng.random_range(1..100_000)),
            _ => junk(rng, 10),
        };
    }
    match flag {
        "--level" | "--top-k" | "--depth" | "--limit" | "--after" | "--expect-version"
        | "--workers" | "--weight" | "--min-score" | "--alpha" | "--max-body-bytes" => {
            number(rng)
        }
        "--mode" => pick(
            rng,
            &["replace", "merge", "append", "vector", "keyword", "hybrid", "hierarchical", "auto", "Upsert", ""],
        )
        .into(),
        "--type" => pick(
            rng,
            &["memory", "resource", "refs", "UPSERT_CONTEXT", "DELETE_CONTEXT", "FROB", "", "session"],
        )
        .into(),
        "--status" => pick(rng, &["pending", "claimed", "done", "dead", "stuck", ""]).into(),
        "--state" => pick(rng, &["pending", "running", "dead", "finished", ""]).into(),
        "--consumer" | "--after-consumer" => {
            pick(rng, &["vector", "keyword", "relation", "nope", "", "VECTOR"]).into()
        }
        "--direction" => pick(rng, &["out", "in", "both", "sideways", ""]).into(),
        "--owner-space" => pick(rng, &["shared", "user:u1", "agent:", "user:", "x:y", ""]).into(),
        "--meta" | "--filter" => pick(
            rng,
            &["k=v", "k=", "=v", "novalue", "level=9", "subtree=ctx://fz", "subtree=bad", "context_type=memory"],
        )
        .into(),
        "--subtree" | "--into" => uri(rng),
        "--payload" => pick(
            rng,
            &[
                r#"{"event_version":1,"uri":"ctx://fz/a","expected_node_version":1,"reason":"repair","trace_id":""}"#,
                r#"{"event_version":1,"uri":"ctx://keep/docs/a","expected_node_version":1,"reason":"repair","trace_id":"t"}"#,
                r#"{"event_version":1}"#,
                "{not json",
                "[]",
                "",
            ],
        )
        .into(),
        "--content-file" | "--abstract-file" | "--overview-file" | "--corpus" | "--queries"
        | "--qrels" | "--tree" => pick(rng, &["missing.txt", "", ".", "/nonexistent/x", "/dev/null"]).into(),
        "--log-format" => pick(rng, &["human", "json", "xml", ""]).into(),
        "--server" => pick(rng, &["http://127.0.0.1:1", "not a url", "ftp://x", ""]).into(),
        "--config" => pick(rng, &["missing.toml", "", "/dev/null"]).into(),
        _ => junk(rng, 6),
    }
}

/// Flags of each command (the ones it has, plus a few it does not).
fn flags(command: &str) -> &'static [&'static str] {
    match command {
        "put" => &[
            "--abstract",
            "--overview",
            "--content",
            "--content-file",
            "--abstract-file",
            "--type",
            "--category",
            "--owner-space",
            "--meta",
            "--mode",
            "--expect-version",
            "--trace-id",
        ],
        "cat" => &["--level"],
        "tree" => &["--depth"],
        "rm" => &["-r", "--recursive", "--expect-version"],
        "link" => &["--type", "--weight", "--reason"],
        "unlink" => &["--type"],
        "related" => &["--type", "--direction", "--limit"],
        "search" => &[
            "--level",
            "--filter",
            "--top-k",
            "--subtree",
            "--min-score",
            "--mode",
            "--alpha",
        ],
        "outbox list" => &[
            "--status",
            "--consumer",
            "--type",
            "--after",
            "--after-consumer",
            "--limit",
        ],
        "outbox append" => &["--type", "--payload"],
        "reindex" => &["--consumer", "--no-wait"],
        "jobs list" => &["--state", "--type", "--limit"],
        "worker" => &["--consumer", "--workers", "--limit"],
        "import" => &["--into"],
        "eval" => &["--corpus", "--queries", "--qrels", "--modes", "--k"],
        "session new" => &["--title"],
        "session add" => &["--role", "--content", "--id", "--time-ms", "--parts"],
        "session commit" => &["--wait"],
        _ => &[],
    }
}

/// Positional arguments each command takes (URIs unless `dir`).
fn positionals(command: &str) -> &'static [&'static str] {
    match command {
        "put" | "cat" | "stat" | "ls" | "tree" | "rm" | "relations" | "related" => &["uri"],
        "mv" | "link" | "unlink" => &["uri", "uri"],
        "search" => &["query"],
        "outbox show" | "jobs show" | "jobs cancel" | "jobs retry" => &["id"],
        "import" => &["dir"],
        "export" => &["uri", "dir"],
        "session new" | "session add" | "session show" | "session commit" => &["uri"],
        _ => &[],
    }
}

/// Commands that write nodes: their URIs never address the kept subtree.
const WRITES: &[&str] = &[
    "put",
    "rm",
    "mv",
    "link",
    "unlink",
    "import",
    "session new",
    "session add",
    "session commit",
];

const COMMANDS: &[&str] = &[
    "put",
    "put",
    "put",
    "cat",
    "cat",
    "stat",
    "ls",
    "tree",
    "rm",
    "rm",
    "mv",
    "mv",
    "link",
    "unlink",
    "relations",
    "related",
    "search",
    "search",
    "outbox list",
    "outbox show",
    "outbox stats",
    "outbox append",
    "status",
    "reindex",
    "jobs list",
    "jobs show",
    "jobs cancel",
    "jobs retry",
    "worker",
    "import",
    "export",
    "eval",
    "session new",
    "session add",
    "session show",
    "session ls",
    "session commit",
];

/// One random argument vector (without the harness's `--data-dir`).
fn args(rng: &mut StdRng) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let globals = |rng: &mut StdRng, out: &mut Vec<String>| {
        if rng.random_bool(0.5) {
            out.push("--json".into());
        }
        if rng.random_bool(0.04) {
            out.push("--log-format".into());
            out.push(value(rng, "--log-format"));
        }
        if rng.random_bool(0.03) {
            out.push("--server".into());
            out.push(value(rng, "--server"));
        }
        if rng.random_bool(0.02) {
            out.push("--config".into());
            out.push(value(rng, "--config"));
        }
    };
    globals(rng, &mut out);
    if rng.random_bool(0.08) {
        // Not a subcommand (or none at all).
        let w = pick(
            rng,
            &[
                "frob",
                "PUT",
                "Cat",
                "put2",
                "",
                " ",
                "-",
                "ctx://keep/docs/a",
                "outbox-list",
                "help",
                "--help",
                "-V",
            ],
        );
        if !w.is_empty() || rng.random_bool(0.5) {
            out.push(w.into());
        }
        if rng.random_bool(0.5) {
            out.push(uri(rng));
        }
        return out;
    }
    let command = pick(rng, COMMANDS);
    out.extend(command.split(' ').map(String::from));
    if command == "worker" {
        // Never the continuous worker: it runs until stopped.
        out.push(pick(rng, &["--once", "--dry-run"]).into());
    }
    let mut pos: Vec<String> = positionals(command)
        .iter()
        .map(|kind| match *kind {
            "uri" => uri(rng),
            "dir" => pick(rng, &["missing-dir", ".", "", "out", "/nonexistent"]).into(),
            "id" => pick(rng, &["1", "0", "-1", "evt-nope", "", "999999999999"]).into(),
            _ => match rng.random_range(0..4) {
                0 => String::new(),
                1 => "x".repeat(rng.random_range(1..100_000)),
                _ => junk(rng, 8),
            },
        })
        .collect();
    // Too few or too many positionals now and then.
    if rng.random_bool(0.1) {
        pos.pop();
    }
    if rng.random_bool(0.1) {
        pos.push(uri(rng));
    }
    let mut opts: Vec<String> = Vec::new();
    for _ in 0..rng.random_range(0..4) {
        let known = flags(command);
        let flag = if !known.is_empty() && rng.random_bool(0.8) {
            pick(rng, known)
        } else {
            pick(
                rng,
                &[
                    "--bogus", "-x", "--level=", "--", "---", "--json", "-r", "--help", "--type",
                ],
            )
        };
        opts.push(flag.into());
        let boolean = matches!(
            flag,
            "-r" | "--recursive" | "--no-wait" | "--wait" | "--json" | "--help" | "--" | "-x"
        );
        if !boolean && rng.random_bool(0.9) {
            opts.push(value(rng, flag));
        }
    }
    // Options before, between or after the positionals.
    let at = rng.random_range(0..=pos.len());
    out.extend(pos[..at].iter().cloned());
    out.extend(opts);
    out.extend(pos[at..].iter().cloned());
    if WRITES.contains(&command) {
        protect(&mut out);
    }
    out
}

/// Rewrites every argument that canonicalizes into the kept subtree.
fn protect(args: &mut [String]) {
    let keep = CtxUri::parse(KEEP).expect("uri");
    for a in args.iter_mut() {
        let inside = |s: &str| CtxUri::parse(s).is_ok_and(|u| u.is_within(&keep));
        if inside(a) {
            *a = "ctx://fz/protected".into();
        } else if let Some((k, v)) = a.split_once('=')
            && inside(v)
        {
            *a = format!("{k}=ctx://fz/protected");
        }
    }
}

/// What a run printed and returned.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(ce: &Ce, cwd: &std::path::Path, args: &[String]) -> Run {
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ce
        .command(&argv)
        .current_dir(cwd)
        .env_remove("CE_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ce starts");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        out.read_to_end(&mut s).expect("read stdout");
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        err.read_to_end(&mut s).expect("read stderr");
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ce {} did not finish in {TIMEOUT:?}", show(args));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&reader.join().expect("stdout reader")).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().expect("stderr reader")).into_owned(),
    }
}

/// The arguments, long ones shortened.
fn show(args: &[String]) -> String {
    let short: Vec<String> = args
        .iter()
        .map(|a| {
            if a.len() > 80 {
                let cut = (0..=60).rev().find(|&i| a.is_char_boundary(i)).unwrap_or(0);
                format!("{}…[{} bytes]", &a[..cut], a.len())
            } else {
                a.clone()
            }
        })
        .collect();
    format!("{short:?}")
}
/// Whether `arg` is a cluster of short flags that clap reads as `-h` or `-V` (help or
/// version, printed as text even with `--json`): `-h`, `-V`, and clusters such as `-vh` or
/// `-http://…` (clap stops at the `h`).
fn short_help(arg: &str) -> bool {
    let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.starts_with('-')) else {
        return false;
    };
    // Flags before it that take no value (`-v`, `-r`), then `h` or `V`.
    matches!(
        cluster.chars().find(|c| !matches!(c, 'v' | 'r')),
        Some('h' | 'V')
    )
}

/// Why `r` breaks the documented contract, if it does.
fn violation(args: &[String], r: &Run) -> Option<String> {
    let Some(code) = r.code else {
        return Some("killed by a signal".into());
    };
    if r.stderr.contains("panicked") || code == 101 {
        return Some(format!("panicked (exit {code})"));
    }
    if !(0..=7).contains(&code) {
        return Some(format!("exit {code} is not documented"));
    }
    let before_dashes = args.iter().take_while(|a| *a != "--");
    let json = before_dashes.clone().any(|a| a == "--json");
    let helpish = args
        .iter()
        .any(|a| matches!(a.as_str(), "--help" | "help" | "--version") || short_help(a));
    if code == 0 {
        if json && !helpish && serde_json::from_str::<Value>(&r.stdout).is_err() {
            return Some("--json succeeded without a JSON document on stdout".into());
        }
        return None;
    }
    // clap's usage errors: plain text even with --json (README: exit 2, "also clap usage
    // errors"), ending with its pointer to --help.
    let usage = code == 2
        && r.stderr.starts_with("error:")
        && r.stderr.contains("'--help'")
        && serde_json::from_str::<Value>(r.stderr.trim()).is_err();
    if usage {
        return None; // clap's usage error (never JSON)
    }
    let printed = if json {
        let Ok(e) = super::harness::json_error(&r.stderr) else {
            return Some("--json failure without a JSON error on stderr".into());
        };
        if !r.stdout.is_empty() {
            return Some("--json failure printed to stdout".into());
        }
        if e["message"].as_str().is_none_or(str::is_empty) || !e["retryable"].is_boolean() {
            return Some(format!("error document without message / retryable: {e}"));
        }
        e["code"].as_str().map(String::from)
    } else {
        r.stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("error: "))
            .and_then(|l| l.strip_suffix(']'))
            .and_then(|l| l.rsplit_once(" ["))
            .map(|(_, c)| c.to_owned())
    };
    let Some(text) = printed else {
        return Some("failure without `error: <message> [<code>]`".into());
    };
    match text.parse::<ErrorCode>() {
        Ok(c) if c.exit_code() == code => None,
        Ok(c) => Some(format!(
            "code {text} exits {} but the process exited {code}",
            c.exit_code()
        )),
        Err(_) => Some(format!("unknown error code {text:?}")),
    }
}

/// The kept nodes as the store holds them: the subtree's stats, every layer, the relations
/// among them. A relation into the subtree from outside is not harm: a fuzzed write may make
/// one (e.g. an import, under `ctx://fz/protected`, of an export of the kept subtree, whose
/// relations name the kept nodes).
fn kept(ce: &Ce) -> Vec<Value> {
    let keep = CtxUri::parse(KEEP).expect("uri");
    let mut out = vec![ce.json(&["tree", KEEP])];
    for u in [KEEP_A, KEEP_B] {
        for level in ["0", "1", "2"] {
            out.push(ce.json(&["cat", u, "--level", level]));
        }
        let mut relations = ce.json(&["relations", u]);
        if let Some(incoming) = relations["incoming"].as_array_mut() {
            incoming.retain(|r| {
                r["from_uri"]
                    .as_str()
                    .and_then(|f| CtxUri::parse(f).ok())
                    .is_some_and(|f| f.is_within(&keep))
            });
        }
        out.push(relations);
    }
    out
}

#[test]
fn random_arguments_get_documented_answers_and_harm_nothing() {
    let seed = ce_testkit::seed("random_arguments_get_documented_answers_and_harm_nothing");
    let cases: usize = std::env::var("CE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut rng = StdRng::seed_from_u64(seed);
    let ce = Ce::hash("");
    ce.json(&[
        "put",
        KEEP_A,
        "--abstract",
        "Kept A",
        "--overview",
        "over a",
        "--content",
        "alpha beta",
    ]);
    ce.json(&["put", KEEP_B, "--content", "gamma delta", "--meta", "k=v"]);
    ce.json(&["link", KEEP_A, KEEP_B, "--type", "refs", "--reason", "kept"]);
    ce.put("ctx://fz/a", "scratch a");
    ce.put("ctx://fz/b", "scratch b");
    // The derived layers settle first: a fuzzed `ce worker` writing them is not harm.
    ce.ok(&["worker", "--once"]);
    let before = kept(&ce);
    let scratch = tempfile::tempdir().expect("scratch dir");

    let started = Instant::now();
    let mut exits = [0usize; 8];
    let mut bad: Vec<String> = Vec::new();
    for i in 0..cases {
        let a = args(&mut rng);
        let r = run(&ce, scratch.path(), &a);
        if let Some(code) = r
            .code
            .and_then(|c| usize::try_from(c).ok())
            .filter(|c| *c < 8)
        {
            exits[code] += 1;
        }
        if let Some(why) = violation(&a, &r) {
            let stderr: String = r.stderr.chars().take(600).collect();
            bad.push(format!(
                "case {i}: ce {}: {why}\n    stderr: {stderr}",
                show(&a)
            ));
        }
    }
    eprintln!(
        "{cases} runs in {:.1?}; exits 0..=7: {exits:?}",
        started.elapsed()
    );
    assert!(
        bad.is_empty(),
        "CE_SEED={seed}: {} of {cases} runs broke the contract:\n  {}",
        bad.len(),
        bad.join("\n  ")
    );
    assert_eq!(kept(&ce), before, "CE_SEED={seed}: the kept nodes changed");
    // Some runs must have got through, and some must have been refused.
    assert!(exits[0] > 0 && exits[2] > 0, "exits {exits:?}");
}

/// Found by the fuzz: `ce worker --dry-run` without `--consumer` asks for a dry run of every
/// configured consumer with an index, the relation one included, which the engine refuses
/// (`invalid_field`, exit 2); and with `--json` its info logs precede the JSON error on stderr.
#[test]
fn worker_dry_run_of_every_consumer_succeeds_and_json_stderr_is_one_document() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/docs/a", "alpha");
    let out = ce.run(&["--json", "worker", "--dry-run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert!(
            serde_json::from_str::<Value>(stderr.trim()).is_ok(),
            "--json: stderr is not one JSON error: {stderr}"
        );
    }
    assert!(
        out.status.success(),
        "ce --json worker --dry-run failed: {stderr}"
    );
}
