//! The README's examples run as written, top to bottom, in one fresh data directory.
//!
//! The test parses README.md (never a copy of it): every line of every ```sh block whose first
//! word is `ce` (continuation lines joined) is run by `bash` in order, in one working
//! directory, with `ce` on `PATH` being the built binary and `CE_DATA_DIR` one fresh data
//! directory, with the default configuration — the local embedding model, which CI fetches
//! (`scripts/fetch-model.sh`): the README describes the defaults, so that is what runs.
//! Each command must exit 0, or the code its comment states (`# … exit 3`).
//!
//! Rules, stated once:
//! - **inputs are created**: a file named by `--content-file`, `--abstract-file`,
//!   `--overview-file` or `< FILE`, and the directory of `ce import DIR`, are created (a line
//!   of text; a directory with a `content.md`) when the working directory lacks them;
//! - **synopses are skipped**: a line with an unquoted `[`, `|`, `...` or `…` shows a syntax,
//!   not a command;
//! - **services are skipped**: a line naming a `postgres://` store, a `--server`, or running
//!   `ce serve` (which runs until stopped) needs something this test does not start.

use std::path::Path;
use std::process::Command;

use super::harness::{CE, repo_root};

/// One logical line of a ```sh block.
#[derive(Debug)]
struct Example {
    /// 1-based line of README.md where it starts.
    line: usize,
    /// The text as written (continuation lines joined by their `\` + newline).
    text: String,
}

/// A shell word with its quoting removed, and whether it had an unquoted part.
#[derive(Debug, Default, Clone)]
struct Word {
    text: String,
    /// The characters outside quotes (where `[`, `|` and `…` mean syntax).
    unquoted: String,
}

/// The logical lines of every ```sh block, in order.
fn examples(readme: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<Example> = None;
    for (i, line) in readme.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        if !in_sh {
            in_sh = fence && line.trim() == "```sh";
            continue;
        }
        if fence {
            in_sh = false;
            out.extend(pending.take());
            continue;
        }
        let example = pending.get_or_insert_with(|| Example {
            line: i + 1,
            text: String::new(),
        });
        if !example.text.is_empty() {
            example.text.push('\n');
        }
        example.text.push_str(line);
        if !line.trim_end().ends_with('\\') {
            out.extend(pending.take());
        }
    }
    out.retain(|e| !e.text.trim().is_empty() && !e.text.trim_start().starts_with('#'));
    out
}

/// Splits `text` into shell words (single and double quotes, backslash escapes) up to an
/// unquoted `#` that starts a word; returns the words and the comment.
fn words(text: &str) -> (Vec<Word>, String) {
    let mut words = Vec::new();
    let mut cur: Option<Word> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(n) => cur.get_or_insert_with(Word::default).text.push(n),
            },
            '\'' => {
                let w = cur.get_or_insert_with(Word::default);
                for n in chars.by_ref() {
                    if n == '\'' {
                        break;
                    }
                    w.text.push(n);
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(Word::default);
                while let Some(n) = chars.next() {
                    match n {
                        '"' => break,
                        '\\' => w.text.extend(chars.next()),
                        _ => w.text.push(n),
                    }
                }
            }
            '#' if cur.is_none() => {
                return (words, chars.collect());
            }
            c if c.is_whitespace() => words.extend(cur.take()),
            c => {
                let w = cur.get_or_insert_with(Word::default);
                w.text.push(c);
                w.unquoted.push(c);
            }
        }
    }
    words.extend(cur);
    (words, String::new())
}

/// Why `words` is not run, if it is not.
fn skip_reason(words: &[Word]) -> Option<&'static str> {
    let synopsis = words
        .iter()
        .any(|w| w.unquoted.contains(['[', '|', '…']) || w.unquoted.contains("..."));
    if synopsis {
        return Some("a synopsis ([…], a|b or … in it)");
    }
    let service = words.iter().any(|w| {
        w.text.starts_with("postgres://")
            || w.text.starts_with("postgresql://")
            || w.text == "--server"
            || w.text.starts_with("--server=")
    });
    if service || subcommand(words) == Some("serve") {
        return Some("needs a service (PostgreSQL, a running server)");
    }
    None
}

/// The first word after `ce` and its global options.
fn subcommand(words: &[Word]) -> Option<&str> {
    let mut rest = words.iter().skip(1);
    while let Some(w) = rest.next() {
        match w.text.as_str() {
            "--json" => {}
            "--data-dir" | "--store" | "--config" | "--server" | "--api-key" | "--log-format" => {
                rest.next();
            }
            t if t.starts_with("--") => {}
            t => return Some(t),
        }
    }
    None
}

/// Creates, under `cwd`, the input files and directories `words` names that are missing.
fn create_inputs(cwd: &Path, words: &[Word]) {
    let missing = |name: &str| !name.is_empty() && name != "-" && !cwd.join(name).exists();
    for pair in words.windows(2) {
        let (flag, arg) = (pair[0].text.as_str(), pair[1].text.as_str());
        let is_file = matches!(
            flag,
            "--content-file" | "--abstract-file" | "--overview-file" | "<"
        );
        if is_file && missing(arg) {
            let path = cwd.join(arg);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("input's directory");
            }
            std::fs::write(&path, format!("A line of text for {arg}.\n")).expect("input file");
        }
    }
    // A missing directory of `ce kb add BASE PATH…` or `ce import DIR` gets one file.
    let dir_with = |dir: &str, file: &str, text: &str| {
        let path = cwd.join(dir);
        std::fs::create_dir_all(&path).expect("input directory");
        std::fs::write(path.join(file), text).expect("input file");
    };
    let after = |word: &'static str, skip: usize| {
        words
            .iter()
            .skip_while(move |w| w.text != word)
            .skip(skip)
            .filter(|w| !w.text.starts_with('-') && !w.text.contains("://"))
    };
    match subcommand(words) {
        Some("kb") if words.iter().any(|w| w.text == "add") => {
            for p in after("add", 2).filter(|p| missing(&p.text)) {
                dir_with(
                    &p.text,
                    "welcome.md",
                    "# Welcome\n\nA page added by the README test.\n",
                );
            }
        }
        Some("import") => {
            if let Some(d) = after("import", 1).next().filter(|d| missing(&d.text)) {
                dir_with(
                    &d.text,
                    "content.md",
                    "Notes imported by the README test.\n",
                );
            }
        }
        _ => {}
    }
}

/// The exit code a comment states (`… exit 3 …`), else 0.
fn expected_exit(comment: &str) -> i32 {
    let mut it = comment.split_whitespace();
    while let Some(w) = it.next() {
        if w.trim_matches(|c: char| !c.is_ascii_alphanumeric()) == "exit"
            && let Some(code) = it
                .next()
                .and_then(|c| c.trim_matches(|ch: char| !ch.is_ascii_digit()).parse().ok())
        {
            return code;
        }
    }
    0
}

#[test]
fn the_parser_reads_blocks_words_and_rules() {
    let md = "text\n```sh\nce put ctx://a/b \\\n    --content \"x # y\"   # make it\n\n\
              # a comment line\nce ls [URI]\n```\n```\nce not-sh\n```\n```sh\nscripts/x.sh\n```\n";
    let ex = examples(md);
    let lines: Vec<_> = ex.iter().map(|e| e.line).collect();
    assert_eq!(lines, [3, 7, 13], "{ex:?}");
    let (w, comment) = words(&ex[0].text);
    let texts: Vec<_> = w.iter().map(|w| w.text.as_str()).collect();
    assert_eq!(texts, ["ce", "put", "ctx://a/b", "--content", "x # y"]);
    assert_eq!(comment.trim(), "make it");
    assert_eq!(skip_reason(&w), None);
    assert!(skip_reason(&words(&ex[1].text).0).is_some());
    // Quoted brackets and pipes are text, not syntax.
    assert_eq!(skip_reason(&words("ce search 'a [b] | c'").0), None);
    assert!(skip_reason(&words("ce outbox show evt-01...").0).is_some());
    assert!(skip_reason(&words("ce --store postgres://h/db migrate").0).is_some());
    assert!(skip_reason(&words("ce --server http://x:1 search q").0).is_some());
    assert!(skip_reason(&words("ce serve").0).is_some());
    assert_eq!(
        subcommand(&words("ce --data-dir d --json import ./x").0),
        Some("import")
    );
    assert_eq!(expected_exit(" not there (exit 3)"), 3);
    assert_eq!(expected_exit(" exits quickly"), 0);
}

#[test]
fn the_readme_examples_run_top_to_bottom() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let root = tempfile::tempdir().expect("tempdir");
    let (bin, cwd, data) = (
        root.path().join("bin"),
        root.path().join("work"),
        root.path().join("data"),
    );
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(&cwd).expect("work");
    std::os::unix::fs::symlink(CE, bin.join("ce")).expect("ce on PATH");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let (mut ran, mut skipped) = (Vec::new(), Vec::new());
    for ex in examples(&readme) {
        let (w, comment) = words(&ex.text);
        if w.first().map(|w| w.text.as_str()) != Some("ce") {
            continue;
        }
        if let Some(why) = skip_reason(&w) {
            skipped.push(format!("README.md:{}: {} — {why}", ex.line, ex.text));
            continue;
        }
        create_inputs(&cwd, &w);
        let out = Command::new("bash")
            .arg("-c")
            .arg(&ex.text)
            .current_dir(&cwd)
            .env("PATH", &path)
            .env("CE_DATA_DIR", &data)
            .env_remove("CE_CONFIG")
            .env_remove("CE_SERVER")
            .env_remove("CE_STORE")
            .env_remove("CE_API_KEY")
            .env_remove("CE_FAILPOINT_WORKER_EMBED_DELAY_MS")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("bash runs");
        let expected = expected_exit(&comment);
        assert_eq!(
            out.status.code(),
            Some(expected),
            "README.md:{}: `{}` exited {:?}, expected {expected}\nstdout: {}\nstderr: {}",
            ex.line,
            ex.text,
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran.push(ex.line);
    }
    eprintln!(
        "ran {} README examples; skipped {}:\n{}",
        ran.len(),
        skipped.len(),
        skipped.join("\n")
    );
    // The rules skip syntax and services, not the bulk of the examples.
    assert!(
        ran.len() > skipped.len() && ran.len() >= 20,
        "ran {ran:?}, skipped {skipped:#?}"
    );
}
