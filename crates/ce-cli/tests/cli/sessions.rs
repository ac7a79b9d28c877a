//! Sessions through the binary (docs/sessions.md): add messages, commit, run Phase 2 with a
//! loopback chat-completions server, search finds the memory and the archive summary; the
//! crash-recovery rows of the spec's table as kill -9 failpoints (before publish, inside
//! the Phase 1 transaction, mid-extraction); two concurrent commits serialized by the lock;
//! a commit racing an `rm` of the session; a contradicting commit's superseded memory ranked
//! after its successor by every search mode.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ce_testkit::extractor::{self, answer, editor_and_city};
use ce_testkit::http::{LoopbackServer, Recorded, Reply};
use serde_json::{Value, json};

use super::harness::{Ce, hit_uris};

const S: &str = "ctx://acme/users/alice/sessions/s1";
/// The shortest lease (a crashed runner's job is claimable again after it).
const FAST_JOBS: &str =
    "[jobs]\nlease_seconds = 15\nheartbeat_seconds = 1\npoll_interval_ms = 50\n";

fn llm_config(server: &LoopbackServer, extra: &str) -> String {
    format!(
        "[derive.llm]\nbase_url = \"{}\"\nmodel = \"scripted\"\napi_key_env = \"CE_TEST_NO_KEY\"\n{extra}",
        server.base_url()
    )
}

/// `ce session add S --role ROLE --id ID --content CONTENT`.
fn add(ce: &Ce, role: &str, id: &str, content: &str) {
    ce.ok(&[
        "session",
        "add",
        S,
        "--role",
        role,
        "--id",
        id,
        "--content",
        content,
    ]);
}

fn conversation(ce: &Ce) {
    ce.ok(&["session", "new", S, "--title", "trip planning"]);
    add(ce, "user", "q1", "I write all my code in Helix.");
    add(ce, "assistant", "a1", "Noted: Helix.");
    add(ce, "user", "q2", "I live in Lyon and plan a trip to Kyoto.");
}

fn memories(ce: &Ce) -> Vec<String> {
    let out = ce.run(&["--json", "tree", "ctx://acme/users/alice/memories"]);
    if !out.status.success() {
        return Vec::new();
    }
    let tree: Value = serde_json::from_slice(&out.stdout).expect("json");
    tree.as_array()
        .map(|a| {
            a.iter()
                .filter(|n| n["meta"]["memory_key"].is_string())
                .filter_map(|n| n["uri"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn jobs(ce: &Ce) -> Vec<Value> {
    ce.json(&["jobs", "list", "--type", "session-commit"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_commit_extracts_memories_that_search_finds_with_the_archive_summary() {
    let llm = LoopbackServer::start(editor_and_city);
    let ce = Ce::hash(&llm_config(&llm, ""));
    conversation(&ce);
    // Retried append: not duplicated.
    let again = ce.json(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--id",
        "q1",
        "--content",
        "I write all my code in Helix.",
    ]);
    assert_eq!(again["created"], false);
    let c = ce.json(&["session", "commit", S]);
    assert_eq!(c["status"], "committed", "{c}");
    assert_eq!(c["archived"], 3);
    assert_eq!(c["extraction"], "on");
    let status = ce.json(&["status"]);
    assert_eq!(status["sessions"]["extraction"], true, "{status}");
    assert_eq!(status["sessions"]["model"], "scripted");
    let job = c["job_id"].as_str().expect("job id").to_owned();
    ce.ok(&["worker", "--once"]);
    let j = ce.json(&["jobs", "show", &job]);
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(j["progress"]["counts"]["added"], 2, "{j}");
    assert_eq!(
        memories(&ce),
        [
            "ctx://acme/users/alice/memories/preferences/editor",
            "ctx://acme/users/alice/memories/profile/home_city"
        ]
    );
    let show = ce.json(&["session", "show", S]);
    assert_eq!(show["messages"].as_array().map(Vec::len), Some(0));
    assert_eq!(show["archives"][0]["state"], "completed");
    assert!(
        !show["archives"][0]["summary"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "{show}"
    );
    let uris = hit_uris(&ce.json(&["search", "Helix editor", "--mode", "keyword"]));
    assert!(
        uris.iter()
            .any(|u| u == "ctx://acme/users/alice/memories/preferences/editor"),
        "{uris:?}"
    );
    let hits = ce.json(&["search", "trip Kyoto", "--mode", "keyword"]);
    assert!(
        hits["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .any(|h| h["uri"] == format!("{S}/archives/000001")),
        "the archive is found: {hits}"
    );
    // The human output names the job.
    ce.ok(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--content",
        "one more",
    ]);
    let text = ce.ok(&["session", "commit", S]);
    assert!(text.contains("job"), "{text}");
    let ls = ce.json(&["session", "ls", "ctx://acme/users/alice"]);
    assert_eq!(ls[0]["archives"], 2, "{ls}");
}

#[test]
fn a_crash_before_publish_or_inside_phase_1_leaves_no_archive_and_no_job() {
    // A killed holder's lock goes stale after 1 s; the next commit waits for that.
    let ce = Ce::hash("[lock]\nlock_expire_secs = 1.0\nwait_ms = 5000\n");
    conversation(&ce);
    for point in ["session.phase1.after_lock", "store.before_commit"] {
        let out = ce
            .command(&["session", "commit", S])
            .env("CE_FAILPOINT", point)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{point}: the process was killed");
        let show = ce.json(&["session", "show", S]);
        assert_eq!(
            show["messages"].as_array().map(Vec::len),
            Some(3),
            "{point}: {show}"
        );
        assert_eq!(
            show["archives"].as_array().map(Vec::len),
            Some(0),
            "{point}"
        );
        assert_eq!(show["phase1_ready"], 0, "{point}");
        assert!(jobs(&ce).is_empty(), "{point}");
    }
    // The stale lock of the killed process is taken over; the commit then succeeds, and
    // says (as status does) that without an LLM nothing will be extracted.
    let c = ce.json(&["session", "commit", S]);
    assert_eq!(c["status"], "committed", "{c}");
    assert!(
        c["extraction"]
            .as_str()
            .unwrap_or("")
            .contains("no LLM is configured"),
        "{c}"
    );
    let status = ce.json(&["status"]);
    assert_eq!(status["sessions"]["extraction"], false, "{status}");
    let text = ce.ok(&["status"]);
    assert!(text.contains("memory extraction off"), "{text}");
    assert_eq!(c["number"], 1);
}

/// A loopback model answering with `script`, and the count of its calls.
fn counted(script: fn(&Recorded) -> Reply) -> (LoopbackServer, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let llm = LoopbackServer::start(move |r| {
        seen.fetch_add(1, Ordering::SeqCst);
        script(r)
    });
    (llm, calls)
}

/// Runs `ce worker --once`, killed at crash point `point`.
fn worker_killed_at(ce: &Ce, point: &str) {
    let out = ce
        .command(&["worker", "--once"])
        .env("CE_FAILPOINT", point)
        .output()
        .expect("runs");
    assert!(!out.status.success(), "{point}: killed");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(point),
        "{point}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `ce worker --once` once the lease of a killed runner's job has ended.
fn worker_after_the_lease(ce: &Ce) {
    std::thread::sleep(Duration::from_secs(16));
    ce.ok(&["worker", "--once"]);
}

/// Kills `ce worker --once` at `point` of Phase 2, then resumes it after the lease: the
/// merge happens once, from the candidates saved before the crash.
fn phase2_crash_resumes(point: &str) {
    let (llm, calls) = counted(editor_and_city);
    let ce = Ce::hash(&llm_config(
        &llm,
        &format!("{FAST_JOBS}[lock]\nlock_expire_secs = 1.0\nwait_ms = 5000\n"),
    ));
    conversation(&ce);
    let c = ce.json(&["session", "commit", S]);
    let job = c["job_id"].as_str().expect("job").to_owned();
    worker_killed_at(&ce, point);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        memories(&ce).is_empty(),
        "{point}: nothing merged before the crash"
    );
    let archive = ce.json(&["stat", &format!("{S}/archives/000001")]);
    assert_eq!(archive["meta"]["archive_extraction"], "extracted");
    assert_eq!(archive["meta"]["archive_state"], "ready");
    // The killed runner's lease ends; the next runner resumes Phase 2 from the archive.
    worker_after_the_lease(&ce);
    let j = ce.json(&["jobs", "show", &job]);
    assert_eq!(j["state"], "completed", "{j}");
    assert_eq!(
        j["progress"]["calls"], 0,
        "the saved candidates were merged: {j}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second model call");
    assert_eq!(memories(&ce).len(), 2);
    let diff = ce.json(&["stat", &format!("{S}/memory_diffs/000001")]);
    assert_eq!(diff["meta"]["memory_diff_extraction"], "merged");
}

#[test]
fn a_crash_mid_extraction_resumes_from_the_saved_archive_without_duplicates() {
    phase2_crash_resumes("session.phase2.after_extract");
}

#[test]
fn a_crash_before_the_merge_transaction_merges_once_on_resume() {
    phase2_crash_resumes("session.phase2.before_commit");
}

/// The facts of a three-window conversation: (message id, what the user says, key).
const WINDOW_FACTS: [(&str, &str, &str); 3] = [
    ("w1", "I write all my code in Helix.", "editor"),
    ("w2", "I live in Lyon.", "home_city"),
    ("w3", "My dog Rex loves tennis balls.", "dog"),
];

/// Extracts the facts of [`WINDOW_FACTS`] its window states (each under its key).
fn per_window(r: &Recorded) -> Reply {
    let conv = extractor::conversation(r);
    let memories: Vec<Value> = WINDOW_FACTS
        .iter()
        .filter(|(id, says, _)| conv.contains(&format!("[{id}] user: {says}")))
        .map(|(id, says, key)| {
            json!({"category": "profile", "key": key, "fact": format!("The user said: {says}"),
                   "evidence": [id], "confidence": 0.9})
        })
        .collect();
    answer(&json!({ "memories": memories }).to_string())
}

#[test]
fn a_crash_between_windows_resumes_at_the_next_window_without_asking_again() {
    let (llm, calls) = counted(per_window);
    // 1000 characters of input: each message of ~420 is a window of its own.
    let ce = Ce::hash(&llm_config(
        &llm,
        &format!("max_input_chars = 1000\n{FAST_JOBS}[lock]\nlock_expire_secs = 1.0\n"),
    ));
    ce.ok(&["session", "new", S]);
    let filler = " We went over the release plan and the budget again.".repeat(7);
    for (id, says, _) in WINDOW_FACTS {
        add(&ce, "user", id, &format!("{says}{filler}"));
    }
    let c = ce.json(&["session", "commit", S]);
    let job = c["job_id"].as_str().expect("job").to_owned();
    worker_killed_at(&ce, "session.phase2.between_windows");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "killed after the first window"
    );
    let archive = ce.json(&["stat", &format!("{S}/archives/000001")]);
    let meta = &archive["meta"];
    assert_eq!(meta["archive_extraction"], "pending", "{meta}");
    assert_eq!(meta["archive_extraction_progress"]["windows"], 1, "{meta}");
    assert_eq!(meta["archive_extraction_progress"]["messages"], 1, "{meta}");
    assert_eq!(meta["archive_candidates"].as_array().map(Vec::len), Some(1));
    assert!(
        memories(&ce).is_empty(),
        "nothing merged before the last window"
    );
    // After the lease, the next runner asks for windows 2 and 3 only.
    worker_after_the_lease(&ce);
    let j = ce.json(&["jobs", "show", &job]);
    assert_eq!(j["state"], "completed", "{j}");
    let windows = &j["progress"]["windows"];
    assert_eq!(
        (
            &windows["total"],
            &windows["extracted"],
            &windows["this_run"]
        ),
        (&json!(3), &json!(3), &json!(2)),
        "{j}"
    );
    assert_eq!(j["progress"]["calls"], 2, "{j}");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "no window asked twice");
    let mut got = memories(&ce);
    got.sort();
    assert_eq!(
        got,
        ["dog", "editor", "home_city"]
            .map(|k| format!("ctx://acme/users/alice/memories/profile/{k}"))
    );
}

#[test]
fn concurrent_commits_are_serialized_and_a_commit_racing_rm_leaves_no_half_state() {
    let ce = Ce::hash("");
    conversation(&ce);
    let children: Vec<_> = (0..2)
        .map(|_| {
            ce.command(&["--json", "session", "commit", S])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outs: Vec<Value> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().expect("wait");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            serde_json::from_slice(&o.stdout).expect("json")
        })
        .collect();
    let mut statuses: Vec<&str> = outs.iter().filter_map(|o| o["status"].as_str()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, ["committed", "skipped"], "{outs:?}");
    assert_eq!(jobs(&ce).len(), 1);
    let show = ce.json(&["session", "show", S]);
    assert_eq!(show["archives"].as_array().map(Vec::len), Some(1));

    // A commit racing an rm of the session: whichever wins, nothing is left half-done.
    ce.ok(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--content",
        "late message",
    ]);
    let commit = ce
        .command(&["--json", "session", "commit", S])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let rm = ce.run(&["rm", "-r", S]);
    let commit = commit.wait_with_output().expect("wait");
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    ce.ok(&["worker", "--once"]);
    for j in jobs(&ce) {
        assert_eq!(j["state"], "completed", "{j}");
        let outcome = j["progress"]["outcome"].as_str().unwrap_or("");
        assert!(matches!(outcome, "completed" | "gone"), "{j}");
    }
    let gone = ce.run(&["stat", S]);
    assert!(!gone.status.success(), "the session was removed");
    // The commit either won (its job then found the archive or its absence, above) or met
    // the session gone: a typed refusal, never a half-written archive.
    if commit.status.success() {
        let c: Value = serde_json::from_slice(&commit.stdout).expect("json");
        assert!(
            matches!(c["status"].as_str(), Some("committed" | "skipped")),
            "{c}"
        );
    } else {
        let f = super::harness::failure(&["session", "commit", S], &commit);
        assert!(
            matches!(f.error["code"].as_str(), Some("not_found" | "busy")),
            "{}",
            f.error
        );
    }
}

/// A second commit contradicting the first: the new memory supersedes the old one, both stay
/// searchable through the binary, and search never ranks the superseded one first.
#[test]
fn search_through_the_binary_ranks_a_superseded_memory_after_its_successor() {
    let llm = LoopbackServer::start(editor_and_city);
    let ce = Ce::hash(&llm_config(&llm, ""));
    conversation(&ce);
    let first = ce.json(&["session", "commit", S, "--wait"]);
    assert_eq!(first["phase2"]["counts"]["added"], 2, "{first}");
    add(&ce, "user", "q4", "I switched to Zed last week.");
    let second = ce.json(&["session", "commit", S, "--wait"]);
    assert_eq!(second["phase2"]["counts"]["superseded"], 1, "{second}");
    ce.ok(&["worker", "--once"]);
    let old = "ctx://acme/users/alice/memories/preferences/editor";
    let new = "ctx://acme/users/alice/memories/preferences/editor-2";
    let stat = ce.json(&["stat", old]);
    assert_eq!(stat["meta"]["memory_status"], "superseded", "{stat}");
    assert_eq!(stat["meta"]["memory_superseded_by"], new, "{stat}");
    for mode in ["keyword", "vector", "hybrid"] {
        let uris = hit_uris(&ce.json(&["search", "user writes code editor", "--mode", mode]));
        let pos = |u: &str| uris.iter().position(|h| h == u);
        let (Some(n), Some(o)) = (pos(new), pos(old)) else {
            panic!("{mode}: both memories are found: {uris:?}");
        };
        assert!(n < o, "{mode}: the superseded memory ranks first: {uris:?}");
    }
    // Filtering on the status leaves the current memory only.
    let uris = hit_uris(&ce.json(&[
        "search",
        "user writes code editor",
        "--filter",
        "memory_status=current",
    ]));
    assert!(
        uris.iter().any(|u| u == new) && !uris.iter().any(|u| u == old),
        "{uris:?}"
    );
}

#[test]
fn the_session_commands_work_with_server_and_the_server_runs_phase_2() {
    let llm = LoopbackServer::start(editor_and_city);
    let ce = Ce::hash(&llm_config(&llm, FAST_JOBS));
    let server = ce.serve(&[]);
    let remote = |args: &[&str]| -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = ce.remote(&server, &all);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    remote(&["session", "new", S]);
    let a = remote(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--id",
        "q1",
        "--content",
        "I use Helix.",
    ]);
    assert_eq!(a["created"], true);
    let again = remote(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--id",
        "q1",
        "--content",
        "I use Helix.",
    ]);
    assert_eq!(again["created"], false);
    remote(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--id",
        "q2",
        "--content",
        "I live in Lyon.",
    ]);
    let c = remote(&["session", "commit", S]);
    let job = c["job_id"].as_str().expect("job").to_owned();
    // Generous: the server's runner shares two cores with the rest of the suite in CI.
    let last = std::cell::RefCell::new(Value::Null);
    let done = super::harness::eventually(Duration::from_secs(90), || {
        let j = remote(&["jobs", "show", &job]);
        *last.borrow_mut() = j.clone();
        (j["state"] == "completed").then_some(j)
    })
    .unwrap_or_else(|| {
        panic!(
            "the server did not run phase 2: {}\n{}",
            last.borrow(),
            server.log()
        )
    });
    assert_eq!(done["progress"]["counts"]["added"], 2, "{done}");
    let show = remote(&["session", "show", S]);
    assert_eq!(show["archives"][0]["state"], "completed", "{show}");
    let ls = remote(&["session", "ls"]);
    assert_eq!(ls[0]["uri"], S);
    let wait = ce.remote(&server, &["session", "commit", S, "--wait"]);
    assert_eq!(wait.status.code(), Some(2), "--wait is local only");
    let bad = ce.remote(
        &server,
        &["session", "add", S, "--role", "bot", "--content", "x"],
    );
    assert!(!bad.status.success());
    let _ = server.stop();
}

#[test]
fn commit_wait_runs_phase_2_in_the_command_and_prints_its_report() {
    let ce = Ce::hash("");
    ce.ok(&["session", "new", S]);
    ce.ok(&[
        "session",
        "add",
        S,
        "--role",
        "user",
        "--content",
        "Deploys run on Fridays.",
    ]);
    let out = ce
        .command(&["--json", "session", "commit", S, "--wait"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["commit"]["status"], "committed", "{v}");
    assert_eq!(v["phase2"]["outcome"], "completed", "{v}");
    assert_eq!(v["phase2"]["extraction"], "off", "{v}");
    assert!(
        v["phase2"]["note"]
            .as_str()
            .unwrap_or("")
            .contains("no LLM"),
        "{v}"
    );
    let text = ce.ok(&["session", "commit", S, "--wait"]);
    assert!(text.contains("skipped"), "nothing left to archive: {text}");
}
