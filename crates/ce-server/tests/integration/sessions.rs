//! Sessions end to end in the engine, on both store backends (docs/sessions.md): appends
//! idempotent per message id; Phase 1 archives under the keep-last policy and enqueues its
//! job in the same transaction; Phase 2 against a loopback chat-completions server with
//! scripted answers (the real wire protocol) writes the expected memories and diff; a
//! restated fact updates, a contradicted one supersedes (kept, linked, ranked after); a
//! rerun after completion or after a crash that saved the candidates adds nothing; an
//! answer that fails the schema is retried, then the job dies with the reason, storing
//! nothing; without an LLM nothing is extracted and the diff says so.

use std::collections::BTreeMap;
use std::sync::Arc;

use ce_core::{Classify as _, Config, ErrorCode};
use ce_server::sessions::AddMessage;
use ce_server::sessions::phase2::{Phase2Outcome, Phase2Report, SessionCommitPayload};
use ce_server::{Engine, EngineOptions};
use ce_session::layout::{archive_meta, memory_meta};
use ce_session::{Role, SessionLayout};
use ce_store::JobState;
use ce_testkit::backend_tests;
use ce_testkit::backends::{Backend, Place};
use ce_testkit::extractor::{answer, editor_and_city, request_text};
use ce_testkit::http::{LoopbackServer, Recorded, Reply};
use serde_json::{Value, json};

use super::common::u;

const SESSION: &str = "ctx://acme/users/alice/sessions/s1";
const MEMORIES: &str = "ctx://acme/users/alice/memories";

fn config(place: &Place, llm: Option<&LoopbackServer>, extra: &str) -> Config {
    let mut toml = String::from("[index.embedding]\nprovider = \"hash\"\n");
    toml.push_str(extra);
    if let Some(s) = llm {
        toml.push_str(&format!(
            "[derive.llm]\nbase_url = \"{}\"\nmodel = \"scripted\"\napi_key_env = \"CE_TEST_NO_KEY\"\n",
            s.base_url()
        ));
    }
    let mut c = Config::from_toml(&toml).expect("config");
    if let Place::Db(db) = place {
        c.store.url = db.url().to_owned();
    }
    c
}

struct T {
    _dir: tempfile::TempDir,
    _place: Place,
    engine: Arc<Engine>,
}

fn open(backend: Backend, llm: Option<&LoopbackServer>, extra: &str) -> T {
    open_tuned(backend, llm, extra, |_| {})
}

/// [`open`] with the configuration adjusted by `tune` (keys of `[derive.llm]`, which
/// [`config`] writes itself).
fn open_tuned(
    backend: Backend,
    llm: Option<&LoopbackServer>,
    extra: &str,
    tune: impl FnOnce(&mut Config),
) -> T {
    let place = backend.place();
    let dir = tempfile::tempdir().expect("tmp");
    let data = match &place {
        Place::Dir(d) => d.path().to_owned(),
        Place::Db(_) => dir.path().to_owned(),
    };
    let options = EngineOptions {
        workers: 1,
        run_workers: false,
        role: "test".into(),
        consumers: Vec::new(),
    };
    let mut config = config(&place, llm, extra);
    tune(&mut config);
    let engine = Arc::new(Engine::open_with(&data, config, options).expect("engine"));
    T {
        _dir: dir,
        _place: place,
        engine,
    }
}

impl T {
    fn add(&self, id: &str, role: Role, content: &str) {
        self.engine
            .sessions()
            .add(AddMessage {
                uri: u(SESSION),
                role,
                content: content.into(),
                id: Some(id.into()),
                time_ms: None,
                parts: None,
            })
            .expect("add");
    }

    /// Commits and runs the job; its report.
    fn commit(&self) -> Phase2Report {
        let c = self.engine.sessions().commit(&u(SESSION)).expect("commit");
        let job_id = c.job_id.expect("a job");
        self.engine.run_due_jobs().expect("jobs");
        let job = self.engine.job(&job_id).expect("job");
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        serde_json::from_value(job.progress.expect("result")).expect("report")
    }

    fn memories(&self) -> BTreeMap<String, ce_core::ContextNode> {
        self.engine
            .store()
            .read_subtree(&u(MEMORIES))
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.meta.contains_key(memory_meta::KEY))
            .map(|n| (n.uri.to_string(), n))
            .collect()
    }

    fn node(&self, uri: &str) -> ce_core::ContextNode {
        self.engine
            .store()
            .read_node(&u(uri))
            .expect("read")
            .unwrap_or_else(|| panic!("{uri} missing"))
    }
}

fn status(n: &ce_core::ContextNode) -> &str {
    n.meta[memory_meta::STATUS].as_str().unwrap_or("")
}

fn conversation_one(t: &T) {
    t.engine
        .sessions()
        .create(&u(SESSION), Some("planning".into()))
        .expect("new");
    t.add("q1", Role::User, "I write all my code in Helix.");
    t.add("a1", Role::Assistant, "Noted, Helix it is.");
    t.add("q2", Role::User, "I live in Lyon, by the way.");
}

fn a_scripted_conversation_yields_its_memories_and_diff(backend: Backend) {
    let llm = LoopbackServer::start(editor_and_city);
    let t = open(backend, Some(&llm), "");
    conversation_one(&t);
    let r = t.commit();
    assert_eq!(r.outcome, Phase2Outcome::Completed);
    assert_eq!(
        (r.counts.added, r.counts.updated, r.counts.superseded),
        (2, 0, 0)
    );
    assert_eq!(r.calls, 1);
    let m = t.memories();
    let editor = &m[&format!("{MEMORIES}/preferences/editor")];
    assert_eq!(
        editor.layers.abstract_text,
        "The user writes code in the Helix editor"
    );
    assert_eq!(
        editor.layers.content,
        "[q1] user: I write all my code in Helix."
    );
    assert_eq!(status(editor), "current");
    assert_eq!(
        editor.meta[memory_meta::SOURCE_ARCHIVE],
        json!(format!("{SESSION}/archives/000001"))
    );
    let city = &m[&format!("{MEMORIES}/profile/home_city")];
    assert_eq!(city.layers.overview, "mentioned while planning a trip");
    assert_eq!(m.len(), 2);
    // The diff is a node, with every change and where it came from.
    let diff = t.node(&format!("{SESSION}/memory_diffs/000001"));
    assert!(
        diff.layers.abstract_text.contains("2 added"),
        "{}",
        diff.layers.abstract_text
    );
    let d: Value = serde_json::from_str(&diff.layers.content).expect("diff json");
    assert_eq!(d["archive"], json!(format!("{SESSION}/archives/000001")));
    assert_eq!(d["entries"][0]["op"], "add");
    assert!(d["entries"][0]["after"]["fact"].is_string());
    // The archive is completed; the session has no live message left.
    let archive = t.node(&format!("{SESSION}/archives/000001"));
    assert_eq!(archive.meta[archive_meta::STATE], "completed");
    assert_eq!(archive.meta[archive_meta::EXTRACTION], "merged");
    assert!(archive.layers.content.contains("[q2] user: I live in Lyon"));
    // (With the derive consumer on, it writes the summary: drain it first.)
    t.engine
        .drain(&|_: &ce_server::status::DrainProgress| {})
        .expect("drain");
    let view = t.engine.sessions().show(&u(SESSION)).expect("show");
    assert!(view.messages.is_empty());
    assert_eq!(view.archives.len(), 1);
    assert!(
        !view.archives[0].summary.is_empty(),
        "the archive is summarised"
    );
    assert_eq!(view.phase1_ready, 1);
}

fn a_restated_fact_updates_and_a_contradiction_supersedes(backend: Backend) {
    let llm = LoopbackServer::start(editor_and_city);
    let t = open(backend, Some(&llm), "");
    conversation_one(&t);
    t.commit();
    // Restated in a second commit: an update (a second source), not a second memory.
    t.add("q3", Role::User, "Helix is still my editor.");
    let r = t.commit();
    assert_eq!((r.counts.added, r.counts.updated), (0, 1), "{r:?}");
    let m = t.memories();
    assert_eq!(m.len(), 2);
    let editor = &m[&format!("{MEMORIES}/preferences/editor")];
    assert_eq!(
        editor.meta[memory_meta::SOURCES].as_array().map(Vec::len),
        Some(2)
    );
    // Contradicted: the new memory supersedes the old one, which is kept and linked.
    t.add("q4", Role::User, "I switched to Zed last week.");
    let r = t.commit();
    assert_eq!(r.counts.superseded, 1, "{r:?}");
    let m = t.memories();
    assert_eq!(m.len(), 3);
    let old = &m[&format!("{MEMORIES}/preferences/editor")];
    let new = &m[&format!("{MEMORIES}/preferences/editor-2")];
    assert_eq!(status(old), "superseded");
    assert_eq!(status(new), "current");
    assert_eq!(
        old.meta[memory_meta::SUPERSEDED_BY],
        json!(new.uri.as_str())
    );
    let edges = t.engine.store().get_edges(&new.uri).expect("edges");
    assert!(
        edges
            .iter()
            .any(|e| e.to_uri == old.uri && e.relation_type == "supersedes"),
        "{edges:?}"
    );
}

fn a_rerun_adds_nothing(backend: Backend) {
    let llm = LoopbackServer::start(editor_and_city);
    let t = open(backend, Some(&llm), "");
    conversation_one(&t);
    t.commit();
    let before = t.memories();
    // After completion: the same job again (its key is free once completed) is a no-op.
    let layout = SessionLayout::of(&u(SESSION)).expect("layout");
    let spec = SessionCommitPayload {
        session: u(SESSION),
        archive: 1,
    }
    .spec(&layout);
    let q = t.engine.enqueue_job(spec).expect("enqueue");
    t.engine.run_due_jobs().expect("jobs");
    let job = t.engine.job(&q.job.id).expect("job");
    let r: Phase2Report = serde_json::from_value(job.progress.expect("result")).expect("report");
    assert_eq!(r.outcome, Phase2Outcome::AlreadyCompleted);
    assert_eq!(t.memories().len(), before.len());
    assert_eq!(llm.requests().len(), 1, "no second model call");
}

fn a_crash_after_extraction_resumes_from_the_saved_candidates(backend: Backend) {
    // The model would answer differently now (as the spec warns): the resumed Phase 2 must
    // merge what the first run saved, not ask again.
    let llm = LoopbackServer::start(|_| {
        answer(
            &json!({"memories": [{"category": "preferences", "key": "editor_choice",
                "fact": "Prefers Helix for coding", "evidence": ["q1"], "confidence": 0.5}]})
            .to_string(),
        )
    });
    let t = open(backend, Some(&llm), "");
    conversation_one(&t);
    let c = t.engine.sessions().commit(&u(SESSION)).expect("commit");
    // What a first run that died at `session.phase2.after_extract` leaves on the archive
    // (the binary's crash test kills a process there): its validated candidates, saved.
    let saved = json!([
        {"category": "preferences", "key": "editor", "fact": "The user writes code in the Helix editor",
         "evidence": ["q1"], "confidence": 0.9},
        {"category": "profile", "key": "home_city", "fact": "The user lives in Lyon",
         "evidence": ["q2"], "confidence": 0.8}
    ]);
    let mut meta = ce_core::Meta::new();
    meta.insert(archive_meta::EXTRACTION.into(), "extracted".into());
    meta.insert(archive_meta::CANDIDATES.into(), saved);
    t.engine
        .put(
            &u(&format!("{SESSION}/archives/000001")),
            ce_store::PutRequest {
                mode: ce_store::PutMode::Merge,
                meta,
                ..ce_store::PutRequest::default()
            },
        )
        .expect("saved state");
    t.engine.run_due_jobs().expect("jobs");
    let job = t
        .engine
        .job(c.job_id.as_deref().expect("job"))
        .expect("job");
    let r: Phase2Report = serde_json::from_value(job.progress.expect("result")).expect("report");
    assert_eq!(
        r.calls, 0,
        "the saved candidates were merged, no model call"
    );
    assert!(llm.requests().is_empty());
    let m = t.memories();
    let keys: Vec<&String> = m.keys().collect();
    assert_eq!(
        keys,
        [
            &format!("{MEMORIES}/preferences/editor"),
            &format!("{MEMORIES}/profile/home_city")
        ]
    );
}

fn an_answer_failing_the_schema_is_retried_then_fails_storing_nothing(backend: Backend) {
    let llm = LoopbackServer::start(|_| answer("Sure! The user likes Helix."));
    let t = open(backend, Some(&llm), "[jobs]\nmax_retries = 0\n");
    conversation_one(&t);
    let c = t.engine.sessions().commit(&u(SESSION)).expect("commit");
    t.engine.run_due_jobs().expect("jobs");
    let job = t
        .engine
        .job(c.job_id.as_deref().expect("job"))
        .expect("job");
    assert_eq!(job.state, JobState::Dead, "{job:?}");
    let err = job.last_error.clone().unwrap_or_default();
    assert!(err.contains("did not match the schema"), "{err}");
    assert_eq!(llm.requests().len(), 3, "sessions.extraction_attempts = 3");
    // The correction request quotes the reason.
    let third = &llm.requests()[2].body["messages"];
    assert!(
        third.to_string().contains("That answer is invalid"),
        "{third}"
    );
    assert!(t.memories().is_empty());
    let archive = t.node(&format!("{SESSION}/archives/000001"));
    assert_eq!(archive.meta[archive_meta::STATE], "ready");
    assert_eq!(archive.meta[archive_meta::EXTRACTION], "pending");
}

fn without_an_llm_nothing_is_extracted_and_the_diff_says_so(backend: Backend) {
    let t = open(backend, None, "");
    conversation_one(&t);
    let c = t.engine.sessions().commit(&u(SESSION)).expect("commit");
    assert!(c.extraction.starts_with("off"), "{}", c.extraction);
    let r = {
        t.engine.run_due_jobs().expect("jobs");
        let job = t
            .engine
            .job(c.job_id.as_deref().expect("job"))
            .expect("job");
        serde_json::from_value::<Phase2Report>(job.progress.expect("result")).expect("report")
    };
    assert_eq!(r.outcome, Phase2Outcome::Completed);
    assert!(r.note.as_deref().unwrap_or("").contains("no LLM"), "{r:?}");
    assert!(t.memories().is_empty());
    let diff = t.node(&format!("{SESSION}/memory_diffs/000001"));
    assert!(
        diff.layers.abstract_text.contains("extraction is off"),
        "{}",
        diff.layers.abstract_text
    );
    t.engine
        .drain(&|_: &ce_server::status::DrainProgress| {})
        .expect("drain");
    let archive = t.node(&format!("{SESSION}/archives/000001"));
    assert_eq!(archive.meta[archive_meta::EXTRACTION], "off");
    assert!(
        !archive.layers.abstract_text.is_empty(),
        "summarised anyway"
    );
}

fn appends_are_idempotent_per_id_and_commits_keep_the_last_messages(backend: Backend) {
    let t = open(backend, None, "[sessions]\nkeep_last = 2\n");
    let s = t.engine.sessions();
    s.create(&u(SESSION), None).expect("new");
    let e = s.create(&u(SESSION), None).expect_err("exists");
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    for (i, text) in ["one", "two", "three", "four", "five"].iter().enumerate() {
        t.add(&format!("x{i}"), Role::User, text);
    }
    // A retry: nothing new.
    let again = s
        .add(AddMessage {
            uri: u(SESSION),
            role: Role::User,
            content: "one".into(),
            id: Some("x0".into()),
            time_ms: None,
            parts: None,
        })
        .expect("retry");
    assert!(!again.created);
    assert_eq!(again.seq, 1);
    let clash = s
        .add(AddMessage {
            uri: u(SESSION),
            role: Role::User,
            content: "not one".into(),
            id: Some("x0".into()),
            time_ms: None,
            parts: None,
        })
        .expect_err("clash");
    assert_eq!(clash.code(), ErrorCode::AlreadyExists);
    // Generated ids continue the sequence.
    let gen_id = s
        .add(AddMessage {
            uri: u(SESSION),
            role: Role::Assistant,
            content: "six".into(),
            id: None,
            time_ms: None,
            parts: Some(json!({"tool_calls": []})),
        })
        .expect("generated");
    assert_eq!((gen_id.id.as_str(), gen_id.seq), ("m000006", 6));
    let c = s.commit(&u(SESSION)).expect("commit");
    assert_eq!((c.archived, c.kept), (4, 2));
    let view = s.show(&u(SESSION)).expect("show");
    let live: Vec<&str> = view.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(live, ["x4", "m000006"]);
    assert_eq!(view.messages[1].parts, Some(json!({"tool_calls": []})));
    // Nothing beyond the policy: skipped, no job.
    let skipped = s.commit(&u(SESSION)).expect("commit");
    assert!(skipped.job_id.is_none());
    assert_eq!(skipped.archived, 0);
    // Bad input is typed and harms nothing.
    for (uri, role, content, id) in [
        ("ctx://acme/resources/x", Role::User, "hi", None),
        (SESSION, Role::User, "  ", None),
        (SESSION, Role::User, "hi", Some("a/b")),
        (
            "ctx://acme/users/alice/sessions/none",
            Role::User,
            "hi",
            None,
        ),
    ] {
        let e = s
            .add(AddMessage {
                uri: u(uri),
                role,
                content: content.into(),
                id: id.map(str::to_owned),
                time_ms: None,
                parts: None,
            })
            .expect_err(uri);
        assert!(
            matches!(
                e.code(),
                ErrorCode::InvalidField | ErrorCode::InvalidUri | ErrorCode::NotFound
            ),
            "{e}"
        );
    }
    assert_eq!(s.show(&u(SESSION)).expect("show").messages.len(), 2);
    let listed = s.ls(Some(&u("ctx://acme/users/alice"))).expect("ls");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].appended, 6);
    assert_eq!(s.ls(None).expect("ls all").len(), 1);
}

fn search_ranks_a_superseded_memory_after_its_successor(backend: Backend) {
    let llm = LoopbackServer::start(editor_and_city);
    let t = open(backend, Some(&llm), "");
    conversation_one(&t);
    t.commit();
    t.add("q4", Role::User, "I switched to Zed last week.");
    t.commit();
    t.engine
        .drain(&|_: &ce_server::status::DrainProgress| {})
        .expect("drain");
    let mut req = ce_retrieval::SearchRequest::new("user writes code editor");
    req.mode = Some(ce_retrieval::SearchMode::Keyword);
    let hits = t.engine.search(&req).expect("search").hits;
    let pos = |s: &str| hits.iter().position(|h| h.uri.as_str().ends_with(s));
    let (new, old) = (pos("/editor-2"), pos("/preferences/editor"));
    assert!(new.is_some(), "{hits:?}");
    if let Some(old) = old {
        assert!(new < Some(old), "superseded ranked first: {hits:?}");
    }
}

fn a_retried_append_of_an_archived_message_is_recognised(backend: Backend) {
    let t = open(backend, None, "");
    let s = t.engine.sessions();
    s.create(&u(SESSION), None).expect("new");
    t.add("q1", Role::User, "I write all my code in Helix.");
    t.add("q2", Role::User, "  I live in Lyon.  ");
    let add = |id: &str, content: &str| {
        s.add(AddMessage {
            uri: u(SESSION),
            role: Role::User,
            content: content.into(),
            id: Some(id.into()),
            time_ms: None,
            parts: None,
        })
    };
    s.commit(&u(SESSION)).expect("commit");
    // The client retries after the commit archived its message: recognised, not appended.
    let again = add("q2", "  I live in Lyon.  ").expect("retry");
    assert!(!again.created, "{again:?}");
    assert_eq!(again.seq, 2);
    assert_eq!(
        again.archive.as_ref().map(ce_core::CtxUri::as_str),
        Some(format!("{SESSION}/archives/000001").as_str())
    );
    // The same id with other content is a conflict, as for a live message.
    let clash = add("q1", "I write all my code in Vim.").expect_err("clash");
    assert_eq!(clash.code(), ErrorCode::AlreadyExists, "{clash}");
    let view = s.show(&u(SESSION)).expect("show");
    assert!(
        view.messages.is_empty(),
        "nothing appended: {:?}",
        view.messages
    );
    assert_eq!(view.next_seq, 3);
    // Older than the newest RETRY_ARCHIVES archives, an id is no longer looked for.
    for i in 0..ce_session::layout::RETRY_ARCHIVES {
        t.add(&format!("later{i}"), Role::User, "more");
        s.commit(&u(SESSION)).expect("commit");
        let r = add("q1", "I write all my code in Helix.").expect("retry");
        let recognised = !r.created;
        let expected = i + 1 < ce_session::layout::RETRY_ARCHIVES;
        assert_eq!(recognised, expected, "after {} more archives: {r:?}", i + 1);
    }
}

/// The facts of the long conversation: (message id, what the user says, category, key, fact).
const LONG_FACTS: [(&str, &str, &str, &str, &str); 3] = [
    (
        "u1",
        "My sister Maria lives in Porto.",
        "profile",
        "sister",
        "The user's sister Maria lives in Porto",
    ),
    (
        "u2",
        "I deploy the billing service on Fridays.",
        "patterns",
        "deploy_day",
        "The user deploys the billing service on Fridays",
    ),
    (
        "u3",
        "Maria is still in Porto, she loves it.",
        "profile",
        "sister",
        "The user's sister Maria lives in Porto",
    ),
];

/// A conversation of 6 messages of about 420 characters: under `max_input_chars = 1000`
/// each is a window of its own (`window_chars(1000)` is 575).
fn long_conversation(t: &T) {
    t.engine.sessions().create(&u(SESSION), None).expect("new");
    let filler = "We talked about the weather and the release plans for a while. ".repeat(6);
    for (i, (id, says, ..)) in LONG_FACTS.iter().enumerate() {
        t.add(id, Role::User, &format!("{says} {filler}"));
        t.add(
            &format!("a{}", i + 1),
            Role::Assistant,
            &format!("Noted. {filler}"),
        );
    }
}

/// A model that extracts the facts of [`LONG_FACTS`] its window states, reusing the key of
/// a listed memory (as the prompt asks); it records what each call was shown.
fn windowed(r: &Recorded) -> Reply {
    let text = request_text(r);
    let (shown, conv) = text.split_once("Conversation:\n").unwrap_or(("", &text));
    let mut memories = Vec::new();
    for (id, says, category, key, fact) in LONG_FACTS {
        if !conv.contains(&format!("[{id}] user: {says}")) {
            continue;
        }
        let mut m = json!({"category": category, "key": key, "fact": fact,
                           "evidence": [id], "confidence": 0.9});
        if shown.contains(&format!("- {category}/{key}: ")) {
            m["change"] = json!("same");
        }
        memories.push(m);
    }
    answer(&json!({ "memories": memories }).to_string())
}

fn small_windows(c: &mut Config) {
    c.derive.llm.max_input_chars = 1000;
}

fn a_long_archive_is_extracted_in_windows_each_shown_the_earlier_ones(backend: Backend) {
    let llm = LoopbackServer::start(windowed);
    let t = open_tuned(backend, Some(&llm), "", small_windows);
    long_conversation(&t);
    let r = t.commit();
    assert_eq!(r.outcome, Phase2Outcome::Completed);
    assert_eq!(
        (
            r.windows.total,
            r.windows.extracted,
            r.windows.this_run,
            r.windows.left_out
        ),
        (6, 6, 6, 0),
        "{r:?}"
    );
    assert_eq!(r.calls, 6, "one call per window");
    assert_eq!(
        (r.tokens_in, r.tokens_out),
        (600, 120),
        "every call's usage"
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 6);
    for (k, req) in requests.iter().enumerate() {
        let input = request_text(req);
        assert!(
            input.contains(&format!("This is part {} of 6", k + 1)),
            "{input}"
        );
        assert!(
            input.chars().count() <= 1000,
            "within the input limit: {input}"
        );
    }
    // The window restating the sister (u3, the 5th) was shown the candidate of the 1st.
    let fifth = request_text(&requests[4]);
    assert!(
        fifth.contains("- profile/sister: The user's sister Maria lives in Porto"),
        "{fifth}"
    );
    // One memory per fact; the restatement's evidence joined the first.
    let m = t.memories();
    let keys: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            format!("{MEMORIES}/patterns/deploy_day"),
            format!("{MEMORIES}/profile/sister")
        ]
    );
    let sister = &m[&format!("{MEMORIES}/profile/sister")];
    let sources: Vec<&str> = sister.meta[memory_meta::SOURCE_MESSAGES]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let archive = format!("{SESSION}/archives/000001");
    assert_eq!(sources, [format!("{archive}#u1"), format!("{archive}#u3")]);
    let saved = t.node(&archive);
    assert_eq!(saved.meta[archive_meta::PROGRESS]["windows"], 6);
    assert_eq!(saved.meta[archive_meta::PROGRESS]["messages"], 6);
}

fn windows_beyond_the_cap_are_left_out_and_said_so(backend: Backend) {
    let llm = LoopbackServer::start(windowed);
    let t = open_tuned(
        backend,
        Some(&llm),
        "[sessions]\nmax_windows = 2\n",
        small_windows,
    );
    long_conversation(&t);
    let r = t.commit();
    assert_eq!(
        (
            r.windows.total,
            r.windows.extracted,
            r.windows.left_out,
            r.windows.left_out_messages
        ),
        (6, 2, 4, 4),
        "{r:?}"
    );
    assert_eq!(llm.requests().len(), 2, "sessions.max_windows = 2 calls");
    let note = r.note.clone().unwrap_or_default();
    assert!(
        note.contains("the 4 messages from u2 on were left out")
            && note.contains("sessions.max_windows = 2"),
        "{note}"
    );
    let diff = t.node(&format!("{SESSION}/memory_diffs/000001"));
    assert!(
        diff.layers.abstract_text.contains("Extraction was partial")
            && diff.layers.abstract_text.contains("left out"),
        "{}",
        diff.layers.abstract_text
    );
    let archive = t.node(&format!("{SESSION}/archives/000001"));
    let anote = archive.meta[archive_meta::EXTRACTION_NOTE]
        .as_str()
        .unwrap_or("");
    assert!(anote.contains("left out"), "{anote}");
    // Only the first window's fact.
    let keys: Vec<String> = t.memories().into_keys().collect();
    assert_eq!(keys, [format!("{MEMORIES}/profile/sister")]);
}

fn a_write_to_the_archive_between_windows_loses_no_window(backend: Backend) {
    // The derive consumer writes an archive's L0 / L1 while Phase 2 runs, which moves its
    // version under the saves of the windows: the save is repeated on the new version, so
    // the job completes in one run and no window is asked twice.
    let engine: Arc<std::sync::OnceLock<Arc<Engine>>> = Arc::new(std::sync::OnceLock::new());
    let e2 = engine.clone();
    let llm = LoopbackServer::start(move |r| {
        if let Some(e) = e2.get() {
            e.put(
                &u(&format!("{SESSION}/archives/000001")),
                ce_store::PutRequest {
                    mode: ce_store::PutMode::Merge,
                    abstract_text: Some(format!("summary {}", request_text(r).len())),
                    ..ce_store::PutRequest::default()
                },
            )
            .expect("a concurrent write");
        }
        windowed(r)
    });
    let t = open_tuned(backend, Some(&llm), "", small_windows);
    let _ = engine.set(t.engine.clone());
    long_conversation(&t);
    let r = t.commit();
    assert_eq!((r.windows.extracted, r.calls), (6, 6), "{r:?}");
    assert_eq!(llm.requests().len(), 6, "no window asked twice");
    assert_eq!(t.memories().len(), 2);
}

backend_tests!(
    a_scripted_conversation_yields_its_memories_and_diff,
    a_restated_fact_updates_and_a_contradiction_supersedes,
    a_rerun_adds_nothing,
    a_crash_after_extraction_resumes_from_the_saved_candidates,
    an_answer_failing_the_schema_is_retried_then_fails_storing_nothing,
    without_an_llm_nothing_is_extracted_and_the_diff_says_so,
    appends_are_idempotent_per_id_and_commits_keep_the_last_messages,
    search_ranks_a_superseded_memory_after_its_successor,
    a_retried_append_of_an_archived_message_is_recognised,
    a_long_archive_is_extracted_in_windows_each_shown_the_earlier_ones,
    windows_beyond_the_cap_are_left_out_and_said_so,
    a_write_to_the_archive_between_windows_loses_no_window,
);
