//! `ce kb` end to end through the real binary: a directory of real fixture files (Markdown,
//! HTML, PDF, code; a corrupt PDF and a PNG that fail alone) added, followed to the end and
//! searchable; `ce kb status`, `rm-items`, `reindex` and `rm`; a process killed -9 in the
//! middle of `kb-index-documents` (the job's lease expires, another process reruns it, and
//! the nodes are written once); and the same over `--server`, where local paths are refused
//! unless `[ingest].allowed_paths` allows them. Last, `ce bench ingest` (`--source kb`, and
//! the node layout through `ce import`) on small generated corpora, with the invariants of
//! their phases.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::harness::{Ce, eventually, hit_uris, repo_root};

const PARK: &str = "CE_FAILPOINT_JOB_PARK_MS";
const FAST_JOBS: &str =
    "[jobs]\nlease_seconds = 15\nheartbeat_seconds = 1\npoll_interval_ms = 50\n";

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fixtures() -> PathBuf {
    repo_root().join("crates/ce-ingest/tests/fixtures")
}

fn corpus(into: &Path) {
    let code = into.join("src");
    std::fs::create_dir_all(&code).expect("mkdir");
    for f in [
        "guide.md",
        "article.html",
        "handbook.pdf",
        "corrupt.pdf",
        "figure.png",
    ] {
        std::fs::copy(fixtures().join(f), into.join(f)).expect("copy");
    }
    std::fs::copy(fixtures().join("sentences.rs"), code.join("sentences.rs")).expect("copy");
}

fn items(status: &Value) -> Vec<Value> {
    status["items"].as_array().cloned().unwrap_or_default()
}

fn item<'a>(items: &'a [Value], suffix: &str) -> &'a Value {
    items
        .iter()
        .find(|i| i["source"].as_str().is_some_and(|s| s.ends_with(suffix)))
        .unwrap_or_else(|| panic!("no item for {suffix}: {items:#?}"))
}

#[test]
fn a_directory_of_real_files_is_added_followed_and_searchable() {
    let ce = Ce::hash("");
    let src = tempfile::tempdir().expect("src");
    corpus(src.path());
    let base = ce.json(&[
        "kb",
        "create",
        "docs",
        "--account",
        "acme",
        "--max-tokens",
        "128",
    ]);
    assert_eq!(base["root"], "ctx://acme/resources/docs");

    let out = ce.run(&[
        "--json",
        "kb",
        "add",
        "docs",
        src.path().to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let added: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(added["progress"]["finished"], true, "{added}");
    assert_eq!(added["progress"]["total"], 8, "{added}");
    assert_eq!(added["progress"]["failed"], 2, "{added}");
    // Progress lines on stderr, one JSON object each, ending at all done.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["progress"] == "kb add")
        .collect();
    assert!(lines.len() >= 2, "{stderr}");
    let last = lines.last().expect("last");
    assert_eq!(
        (last["done"].as_u64(), last["total"].as_u64()),
        (Some(8), Some(8)),
        "{stderr}"
    );

    let status = ce.json(&["kb", "status", "docs"]);
    let all = items(&status);
    assert_eq!(status["counts"]["completed"], 6, "{status}");
    assert_eq!(item(&all, "corrupt.pdf")["error"]["code"], "parse_error");
    assert_eq!(
        item(&all, "figure.png")["error"]["code"],
        "unsupported_format"
    );
    let human = ce.ok(&["kb", "status", "docs"]);
    assert!(
        human.contains("parse_error") && human.contains("6 completed"),
        "{human}"
    );
    // `ce status`: the base's items by status and its failures, newest first.
    let s = ce.json(&["status"]);
    let docs = &s["kb"]["bases"][0];
    assert_eq!(docs["name"], "docs", "{s}");
    assert_eq!(
        (
            docs["counts"]["completed"].as_u64(),
            docs["counts"]["failed"].as_u64()
        ),
        (Some(6), Some(2)),
        "{s}"
    );
    let codes: std::collections::BTreeSet<&str> = docs["recent_failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|f| f["error"]["code"].as_str().expect("code"))
        .collect();
    assert_eq!(
        codes,
        ["parse_error", "unsupported_format"].into_iter().collect(),
        "{s}"
    );
    assert_eq!(s["kb"]["active_jobs"]["kb-index-documents"], 0, "{s}");
    let human = ce.ok(&["status"]);
    assert!(
        human.contains("knowledge_bases  1 (0 items under way, 2 failed)")
            && human.contains("6 completed, 2 failed")
            && human.contains("parse_error"),
        "{human}"
    );

    // Searchable chunks, hydrated from the source.
    let k = ce.json(&[
        "search",
        "operations team daily checks",
        "--mode",
        "keyword",
    ]);
    let found = hit_uris(&k);
    assert!(
        found
            .iter()
            .any(|u| u.starts_with("ctx://acme/resources/docs/")),
        "{k}"
    );
    let guide = item(&all, "guide.md")["node_uri"]
        .as_str()
        .expect("uri")
        .to_owned();
    let tree = ce.json(&["tree", &guide]);
    let chunks = tree.as_array().expect("tree").len();
    assert!(chunks > 2, "the guide is split at 128 tokens: {tree}");

    // Reindex of the unchanged directory appends no event.
    let events_before = ce
        .json(&["outbox", "list", "--limit", "10000"])
        .as_array()
        .map(Vec::len);
    let root = all
        .iter()
        .find(|i| i["parent_id"].is_null())
        .and_then(|i| i["id"].as_str())
        .expect("root")
        .to_owned();
    let sub = ce.json(&["kb", "status", "docs", "--item", &root]);
    assert_eq!(sub["total"], 8, "the directory's subtree: {sub}");
    let f = ce.fail(&["kb", "status", "docs", "--item", "ffff"], 3);
    assert_eq!(f.error["code"], "not_found", "{:?}", f.error);
    let r = ce.json(&["kb", "reindex", "docs", &root]);
    assert_eq!(r["progress"]["finished"], true, "{r}");
    let events_after = ce
        .json(&["outbox", "list", "--limit", "10000"])
        .as_array()
        .map(Vec::len);
    assert_eq!(
        events_before, events_after,
        "an unchanged re-sync appends no event"
    );

    // Delete the code item: invisible at once, its nodes gone when the command returns.
    let status = ce.json(&["kb", "status", "docs"]);
    let code = item(&items(&status), "sentences.rs").clone();
    let code_uri = code["node_uri"].as_str().expect("uri");
    let rm = ce.json(&["kb", "rm-items", "docs", code["id"].as_str().expect("id")]);
    assert_eq!(rm["progress"]["finished"], true, "{rm}");
    let f = ce.fail(&["stat", code_uri], 3);
    assert_eq!(f.error["code"], "not_found", "{:?}", f.error);

    // Reindex refused while anything is active (an item added with --no-wait).
    let queued = ce.json(&[
        "kb",
        "add",
        "docs",
        "--note",
        "a note to index later",
        "--no-wait",
    ]);
    let note = queued["items"][0]["id"].as_str().expect("id").to_owned();
    let s = ce.json(&["status"]);
    assert_eq!(s["kb"]["active_jobs"]["kb-index-documents"], 1, "{s}");
    assert_eq!(s["kb"]["bases"][0]["counts"]["idle"], 1, "{s}");
    let f = ce.fail(&["kb", "reindex", "docs", &note], 4);
    assert_eq!(f.error["code"], "state_transition", "{:?}", f.error);

    // Remove the base: everything goes.
    let gone = ce.json(&["kb", "rm", "docs"]);
    assert_eq!(gone["progress"]["finished"], true, "{gone}");
    assert_eq!(ce.json(&["kb", "ls"]), Value::Array(Vec::new()));
    ce.fail(&["stat", "ctx://acme/resources/docs"], 3);
}

#[test]
fn a_process_killed_in_index_documents_is_rerun_after_its_lease_and_writes_once() {
    let ce = Ce::hash(FAST_JOBS);
    ce.json(&["kb", "create", "docs"]);
    let file = fixtures().join("guide.md");
    let mut parked = KillOnDrop(
        ce.command(&["kb", "add", "docs", file.to_str().expect("utf-8")])
            .env(PARK, "600000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ce kb add starts"),
    );
    let job = eventually(Duration::from_secs(30), || {
        ce.json(&[
            "jobs",
            "list",
            "--state",
            "running",
            "--type",
            "kb-index-documents",
        ])
        .as_array()
        .and_then(|a| a.first().cloned())
    })
    .expect("the index job never ran");
    parked.0.kill().expect("kill -9");
    parked.0.wait().expect("reaped");
    let id = job["id"].as_str().expect("id").to_owned();
    assert_eq!(ce.json(&["jobs", "show", &id])["state"], "running");
    let status = ce.json(&["kb", "status", "docs"]);
    assert_eq!(status["done"], 0, "{status}");

    // Another process waits for the lease, reruns the job, indexes the nodes once.
    let once = ce.json(&["worker", "--once"]);
    assert_eq!(once["jobs"]["completed"], 1, "{once}");
    let done = ce.json(&["jobs", "show", &id]);
    assert_eq!(
        (done["state"].as_str(), done["attempts"].as_u64()),
        (Some("completed"), Some(0)),
        "{done}"
    );
    let status = ce.json(&["kb", "status", "docs"]);
    assert_eq!(status["counts"]["completed"], 1, "{status}");
    let uri = items(&status)[0]["node_uri"]
        .as_str()
        .expect("uri")
        .to_owned();
    let upserts = ce
        .json(&[
            "outbox",
            "list",
            "--limit",
            "10000",
            "--consumer",
            "keyword",
        ])
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["event"]["uri"].as_str() == Some(uri.as_str()))
        // Not the derive consumer's write-back of its L0 / L1.
        .filter(|r| r["event"]["payload"]["reason"] != "derived")
        .count();
    assert_eq!(upserts, 1, "the document node was written once");
}

#[test]
fn while_ce_worker_holds_the_vector_index_status_and_kb_commands_work_beside_it() {
    let ce = Ce::hash(FAST_JOBS);
    ce.json(&["kb", "create", "docs"]);
    let _worker = KillOnDrop(
        ce.command(&["worker"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ce worker starts"),
    );
    // `ce status` reads the held index from its files and says who applies its events.
    let vector = |status: &Value| {
        status["consumers"]
            .as_array()
            .expect("consumers")
            .iter()
            .find(|c| c["consumer"] == "vector")
            .cloned()
            .expect("vector consumer")
    };
    let held = eventually(Duration::from_secs(30), || {
        let status = ce.json(&["status"]);
        vector(&status)["validation_reason"]
            .as_str()
            .is_some_and(|r| r.contains("holds its index"))
            .then_some(status)
    })
    .expect("ce status never saw the worker's index");
    assert_eq!(held["ready"], true, "{held}");
    assert_eq!(ce.json(&["kb", "ls"])[0]["name"], "docs");
    assert_eq!(ce.json(&["kb", "show", "docs"])["total"], 0);

    // A followed add: this process reads and writes the nodes, the worker embeds them.
    let file = fixtures().join("guide.md");
    let added = ce.json(&["kb", "add", "docs", file.to_str().expect("utf-8")]);
    assert_eq!(added["progress"]["finished"], true, "{added}");
    assert_eq!(added["progress"]["failed"], 0, "{added}");
    let status = ce.json(&["kb", "status", "docs"]);
    assert_eq!(status["counts"]["completed"], 1, "{status}");
    let status = ce.json(&["status"]);
    assert!(
        status["index_records"].as_u64().is_some_and(|n| n > 0),
        "the vectors the worker wrote are counted: {status}"
    );
    assert_eq!(vector(&status)["lag_events"], 0, "{status}");
}

#[test]
fn over_the_server_notes_are_indexed_and_local_paths_need_an_allowed_root() {
    let ce = Ce::hash("[jobs]\npoll_interval_ms = 50\n");
    let server = ce.serve(&[]);
    let run = |args: &[&str]| {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = ce.remote(&server, &all);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&["kb", "create", "notes"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run(&[
        "kb",
        "add",
        "notes",
        "--note",
        "The launch checklist lives in the ops runbook.",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let added: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(added["progress"]["finished"], true, "{added}");
    assert_eq!(added["progress"]["done"], 1, "{added}");
    let (code, out, _) = run(&["kb", "status", "notes"]);
    assert_eq!(code, Some(0));
    let status: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(status["counts"]["completed"], 1, "{status}");
    // A local path of the server's machine: refused by default, naming the setting.
    let dir = tempfile::tempdir().expect("dir");
    let (code, _, err) = run(&["kb", "add", "notes", dir.path().to_str().expect("utf-8")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("allowed_paths"), "{err}");
    // Removing the base is followed to its end, though the base is gone by then.
    let (code, out, err) = run(&["kb", "rm", "notes"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let gone: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(gone["progress"]["finished"], true, "{gone}");
    assert_eq!(gone["progress"]["jobs_open"], 0, "{gone}");
    let (code, _, err) = run(&["kb", "status", "notes"]);
    assert_eq!(code, Some(3), "{err}");
}

#[test]
fn a_crash_at_any_commit_of_a_delete_leaves_the_mark_and_its_job_together() {
    // Crash after the n-th committed source write of `ce kb rm-items` (n = 1: a write of
    // the engine's start; then the mark and its job; then the cleanup's first step): the
    // `deleting` mark is durable exactly when its cleanup job is — one transaction — and a
    // later process finishes a pending cleanup.
    let mut saw_intent = false;
    for n in 1..=3 {
        // The dead process's base lock goes stale after a second; the retry is quick.
        let ce = Ce::hash(
            "[lock]\nlock_expire_secs = 1.0\n[jobs]\nretry_base_seconds = 1\npoll_interval_ms = 50\n",
        );
        ce.json(&["kb", "create", "docs"]);
        let added = ce.json(&[
            "kb",
            "add",
            "docs",
            "--note",
            "The quarterly planning notes.",
        ]);
        let id = added["items"][0]["id"].as_str().expect("id").to_owned();
        let uri = added["items"][0]["node_uri"]
            .as_str()
            .expect("uri")
            .to_owned();
        let out = ce
            .command(&["kb", "rm-items", "docs", &id])
            .env("CE_FAILPOINT", format!("store.after_commit:{n}"))
            .output()
            .expect("ce runs");
        assert!(
            !out.status.success(),
            "n={n}: the failpoint aborts the process"
        );
        let status = ce.json(&["kb", "status", "docs"]);
        let deleting = status["counts"]["deleting"].as_u64().expect("count");
        let jobs = ce.json(&["jobs", "list", "--type", "kb-delete-subtree"]);
        let jobs = jobs.as_array().expect("jobs");
        assert_eq!(
            deleting == 1,
            jobs.len() == 1,
            "n={n}: mark and job together: {status} {jobs:?}"
        );
        if deleting == 1 {
            saw_intent = true;
            assert_eq!(
                items(&status),
                Vec::<Value>::new(),
                "n={n}: invisible at once"
            );
        }
        if jobs.first().is_some_and(|j| j["state"] == "pending") {
            std::thread::sleep(Duration::from_millis(1200));
            ce.json(&["worker", "--once"]);
            let status = ce.json(&["kb", "status", "docs"]);
            assert_eq!(status["counts"]["deleting"], 0, "n={n}: {status}");
            ce.fail(&["stat", &uri], 3);
        }
    }
    assert!(saw_intent, "some crash point fell after the mark's commit");
}

#[test]
fn without_the_model_the_command_stops_and_says_the_items_wait_for_the_indexes() {
    let ce = Ce::new();
    ce.write_config("[index.embedding]\nmodel_dir = \"/nonexistent/model\"\n");
    ce.json(&["kb", "create", "docs"]);
    let added = ce.json(&[
        "kb",
        "add",
        "docs",
        "--note",
        "Notes about the retrospective.",
    ]);
    assert_eq!(added["progress"]["finished"], false, "{added}");
    assert_eq!(added["progress"]["by_status"]["embedding"], 1, "{added}");
    let waiting = added["waiting"].as_str().expect("waiting");
    assert!(
        waiting.contains("not ready") || waiting.contains("cannot be updated"),
        "{waiting}"
    );
    // The item stays embedding, durable, for a process that can index it.
    let status = ce.json(&["kb", "status", "docs"]);
    assert_eq!(status["counts"]["embedding"], 1, "{status}");
    let human = ce.ok(&["kb", "add", "docs", "--note", "another one"]);
    assert!(human.contains("stopped before the end"), "{human}");
}

/// A phase's figure as a number.
fn figure(bench: &Value, phase: &str, key: &str) -> u64 {
    bench["phases"][phase][key]
        .as_u64()
        .unwrap_or_else(|| panic!("phases.{phase}.{key} is not a count: {bench:#}"))
}

#[test]
fn bench_ingest_import_measures_every_phase_with_its_invariants() {
    let ce = Ce::new();
    let work = ce.data_dir().display().to_string();
    let b = ce.json(&[
        "bench",
        "ingest",
        "--docs",
        "200",
        "--consumers",
        "all",
        "--work-dir",
        &work,
    ]);
    assert_eq!(
        (b["docs"].as_u64(), b["changed_per_phase"].as_u64()),
        (Some(200), Some(2))
    );
    // Every event reaches the three consumers, in every phase.
    for phase in [
        "cold",
        "noop",
        "text_1pct",
        "meta_1pct",
        "delete_1pct",
        "delete_rest",
    ] {
        assert_eq!(
            figure(&b, phase, "deliveries"),
            3 * figure(&b, phase, "events"),
            "{phase}: {b:#}"
        );
    }
    // CPU seconds beside the wall seconds (Linux): never negative, and the run used some.
    let cpu: Vec<f64> = ["cold", "noop", "text_1pct", "meta_1pct", "delete_1pct"]
        .iter()
        .flat_map(|p| ["import_cpu_s", "drain_cpu_s"].map(|k| b["phases"][p][k].as_f64()))
        .map(|s| s.expect("CPU seconds"))
        .collect();
    assert!(
        cpu.iter().all(|s| *s >= 0.0) && cpu.iter().sum::<f64>() > 0.0,
        "{b:#}"
    );
    assert!(figure(&b, "cold", "nodes_written") >= 200, "{b:#}");
    assert!(figure(&b, "cold", "texts_embedded") >= 200, "{b:#}");
    assert_eq!(figure(&b, "noop", "events"), 0, "{b:#}");
    // The stat cache vouches for what was written long enough before it was read (how much
    // of this quickly written folder that is depends on the clock), never for an edit.
    assert!(figure(&b, "noop", "nodes_not_read") <= 201, "{b:#}");
    assert!(figure(&b, "text_1pct", "nodes_not_read") <= 199, "{b:#}");
    assert_eq!(figure(&b, "text_1pct", "nodes_written"), 2, "{b:#}");
    assert!(figure(&b, "text_1pct", "texts_embedded") >= 2, "{b:#}");
    // A metadata-only edit re-embeds nothing; removals embed nothing.
    assert_eq!(figure(&b, "meta_1pct", "nodes_written"), 2, "{b:#}");
    assert_eq!(figure(&b, "meta_1pct", "texts_embedded"), 0, "{b:#}");
    assert_eq!(figure(&b, "delete_1pct", "nodes_removed"), 2, "{b:#}");
    // The bulk delete removes every document left, one event each.
    assert_eq!(figure(&b, "delete_rest", "nodes_removed"), 198, "{b:#}");
    assert_eq!(figure(&b, "delete_rest", "events"), 198, "{b:#}");
    assert_eq!(figure(&b, "delete_rest", "texts_embedded"), 0, "{b:#}");
    assert_eq!(figure(&b, "empty_drain", "deliveries"), 0, "{b:#}");
    // Every consumer applied everything: the prune leaves the newest event alone, and every
    // delivery of the run goes.
    let prune = &b["phases"]["journal_prune"];
    let before = prune["before"]["events"].as_u64().expect("events before");
    assert!(before > 200, "{prune}");
    assert_eq!(prune["events_pruned"].as_u64(), Some(before - 1), "{prune}");
    assert_eq!(prune["after"]["events"], 1, "{prune}");
    assert_eq!(prune["after"]["deliveries"], 0, "{prune}");
    assert_eq!(
        prune["deliveries_pruned"], prune["before"]["deliveries"],
        "{prune}"
    );
    assert!(
        b["phases"]["graph_settle"]["graph_vectors"]
            .as_u64()
            .is_some(),
        "{b:#}"
    );
}

#[test]
fn bench_ingest_kb_measures_every_phase_with_its_invariants() {
    let ce = Ce::new();
    let work = ce.data_dir().display().to_string();
    let b = ce.json(&[
        "bench",
        "ingest",
        "--source",
        "kb",
        "--docs",
        "40",
        "--embedder",
        "hash",
        "--work-dir",
        &work,
        "--raw-texts",
        "200",
    ]);
    assert_eq!(
        (b["source"].as_str(), b["docs"].as_u64()),
        (Some("kb"), Some(40))
    );
    let files: u64 = ["md", "html", "pdf", "rs", "py"]
        .iter()
        .map(|k| b["corpus"][*k]["files"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(files, 40, "{b:#}");

    // Cold: every item completed, every file embedded through the model's calls.
    let cold = &b["phases"]["cold"];
    assert_eq!(cold["items"]["failed"], 0, "{cold}");
    assert_eq!(cold["items"]["completed"], cold["items_total"], "{cold}");
    // 40 files and their directories (corpus, g00, s00).
    assert_eq!(cold["items_total"], 43, "{cold}");
    assert!(figure(&b, "cold", "texts_embedded") >= 40, "{cold}");
    assert!(figure(&b, "cold", "embedder_calls") >= 1, "{cold}");
    assert!(figure(&b, "cold", "events") >= 40, "{cold}");
    assert_eq!(figure(&b, "cold", "files_read"), 40, "{cold}");
    assert_eq!(figure(&b, "cold", "lag_events"), 0, "{cold}");

    // No-op re-add: nothing embedded, nothing appended, the same nodes.
    assert_eq!(figure(&b, "noop", "texts_embedded"), 0, "{b:#}");
    assert_eq!(figure(&b, "noop", "embedder_calls"), 0, "{b:#}");
    assert_eq!(figure(&b, "noop", "events"), 0, "{b:#}");
    assert_eq!(figure(&b, "noop", "nodes"), figure(&b, "cold", "nodes"));
    // Not a file read: their stats vouch for them (docs/ingestion.md "Re-sync").
    assert_eq!(figure(&b, "noop", "files_read"), 0, "{b:#}");
    // Only the edited file is read.
    assert_eq!(figure(&b, "edit_1pct", "files_read"), 1, "{b:#}");
    // After the delete at most that file again: edited just before it was read, its stat
    // could not vouch for it (a racy stat, no fingerprint).
    assert!(figure(&b, "delete_1pct", "files_read") <= 1, "{b:#}");

    // 1 % edited (one file, one section): only its changed texts are embedded again.
    let edit = &b["phases"]["edit_1pct"];
    assert_eq!(edit["edited_files"], 1, "{edit}");
    let embedded = figure(&b, "edit_1pct", "texts_embedded");
    assert!(embedded > 0, "{edit}");
    assert!(
        embedded <= figure(&b, "edit_1pct", "edited_files_texts"),
        "{edit}"
    );
    assert!(figure(&b, "edit_1pct", "events") > 0, "{edit}");

    // 1 % deleted: exactly the deleted file's nodes are gone, nothing embedded.
    let deleted = figure(&b, "delete_1pct", "deleted_files_nodes");
    assert!(deleted >= 1, "{b:#}");
    assert_eq!(
        figure(&b, "edit_1pct", "nodes") - figure(&b, "delete_1pct", "nodes"),
        deleted,
        "{b:#}"
    );
    assert_eq!(figure(&b, "delete_1pct", "texts_embedded"), 0, "{b:#}");
    assert_eq!(b["phases"]["delete_1pct"]["items"]["failed"], 0, "{b:#}");

    // Parser throughput of every format, and the chunker's.
    for k in ["md", "html", "pdf", "rs", "py", "chunk"] {
        let mbs = b["parsers"][k]["mb_per_s"].as_f64().unwrap_or(0.0);
        assert!(mbs > 0.0, "parsers.{k}: {}", b["parsers"]);
    }
    assert!(
        b["parsers"]["chunk"]["chunks"].as_u64().unwrap_or(0) > 0,
        "{}",
        b["parsers"]
    );

    // The raw provider on the cold phase's texts, and the ratio (no target for hash).
    assert!(
        b["raw_model"]["texts"].as_u64().unwrap_or(0) > 0,
        "{}",
        b["raw_model"]
    );
    assert!(b["ratio"].as_f64().unwrap_or(0.0) > 0.0, "{b:#}");
    assert!(
        b["targets"]["model_ratio_met"].is_null(),
        "{}",
        b["targets"]
    );
    // The work directory is removed.
    let left: Vec<_> = std::fs::read_dir(ce.data_dir())
        .expect("read")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("ce-bench-ingest-")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
