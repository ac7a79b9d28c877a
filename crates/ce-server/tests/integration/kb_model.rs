//! A model-based property test of the ingestion workflow's state machine, on both backends:
//! random sequences of add (good files, corrupt files, notes, directories), one round of
//! work (claim the due jobs, drain the outbox, settle), delete, reindex, a re-sync (the same
//! input added again: unchanged files skipped by their fingerprints), time passing (files
//! older than the racy window, so that their fingerprints count), a job lost (cancelled
//! — as a dead job or a crash that never acknowledges), a file gone from its source, and a
//! restart (engine reopened, recovery scan). After every step:
//!
//! - `KB1` no item is active without a durable job: idle / reading items hold a live
//!   `…:index` job, preparing ones a live `…:prepare` job, once the settle pass has run;
//! - `KB2` no node without an owner: every node below the base's root lies in the subtree of
//!   a (not yet removed) item's node — deletes never resurrect anything;
//! - `KB3` listings and status never show a deleting item;
//! - `KB4` a reindex is accepted exactly when every item of the subtree is terminal.
//!
//! At the end, work runs until quiet (with a recovery scan first): every item is terminal, an
//! item the model knows as good is completed, a corrupt one failed with `parse_error`, one
//! whose file is gone failed with `not_found`, deleted items are gone with their nodes, and
//! no job is left open. `CE_SEED` replays a run, `CE_PROPTEST_CASES` scales it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ce_core::{Config, CtxUri};
use ce_server::kb::{CreateBase, KbInput, KbSettings};
use ce_server::{Engine, EngineOptions};
use ce_store::kb::subtree_of;
use ce_store::{ItemStatus, JobFilter, JobState, KbItem};
use ce_testkit::backends::{Backend, Place};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

ce_testkit::backend_tests!(the_workflow_matches_its_model_after_every_step);

#[derive(Debug, Clone)]
enum Op {
    /// Adds a file (`true`: a good Markdown file, `false`: a corrupt PDF).
    AddFile(bool),
    /// Adds a note.
    AddNote,
    /// Adds a directory of `n` good files and one corrupt one, with a sub-directory.
    AddDir(u8),
    /// One round of work: the due jobs once, a drain, a settle.
    Work,
    /// Deletes the visible item at this index (modulo).
    Delete(usize),
    /// Reindexes the visible item at this index (modulo).
    Reindex(usize),
    /// Adds the input of the visible top-level item at this index (modulo) again.
    Resync(usize),
    /// Waits out the racy window: every file written so far gets (and keeps) a fingerprint.
    Age,
    /// Cancels the live job at this index (modulo).
    LoseJob(usize),
    /// Removes the source file of the file item at this index (modulo).
    RemoveSource(usize),
    /// Reopens the engine and runs the recovery scan.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<bool>().prop_map(Op::AddFile),
        1 => Just(Op::AddNote),
        1 => (0u8..3).prop_map(Op::AddDir),
        5 => Just(Op::Work),
        2 => any::<usize>().prop_map(Op::Delete),
        2 => any::<usize>().prop_map(Op::Reindex),
        2 => any::<usize>().prop_map(Op::Resync),
        1 => Just(Op::Age),
        1 => any::<usize>().prop_map(Op::LoseJob),
        1 => any::<usize>().prop_map(Op::RemoveSource),
        1 => Just(Op::Restart),
    ]
}

/// What the model expects of an item once its work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Completed,
    ParseError,
    NotFound,
    /// A job of it was lost: failed or completed, both are legitimate.
    Either,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ce-ingest/tests/fixtures")
}

struct World {
    place: Place,
    data: tempfile::TempDir,
    src: tempfile::TempDir,
    engine: Option<Engine>,
    files: u32,
    /// Expectations by source path (a re-expanded directory gives new item ids to the
    /// same files) and by note text.
    expect: BTreeMap<String, Expect>,
    /// Source paths deleted by the user (their items and nodes must go).
    deleted_nodes: Vec<CtxUri>,
}

impl World {
    fn config(&self) -> Config {
        let mut config = Config::default();
        config.index.embedding.provider = "hash".into();
        config.jobs.max_retries = 1;
        if let Place::Db(db) = &self.place {
            config.store.url = db.url().to_owned();
        }
        config
    }

    fn open(&mut self) {
        self.engine = None;
        let options = EngineOptions {
            workers: 1,
            run_workers: false,
            role: "model".into(),
            consumers: Vec::new(),
        };
        self.engine =
            Some(Engine::open_with(self.data.path(), self.config(), options).expect("engine"));
    }

    fn e(&self) -> &Engine {
        self.engine.as_ref().expect("engine")
    }

    fn file(&mut self, good: bool, dir: &Path) -> PathBuf {
        self.files += 1;
        let (from, name) = if good {
            ("guide.md", format!("f{}.md", self.files))
        } else {
            ("corrupt.pdf", format!("f{}.pdf", self.files))
        };
        let to = dir.join(name);
        std::fs::copy(fixtures().join(from), &to).expect("copy");
        self.expect.insert(
            to.display().to_string(),
            if good {
                Expect::Completed
            } else {
                Expect::ParseError
            },
        );
        to
    }

    fn all(&self) -> Vec<KbItem> {
        self.e().store().kb_items("m").expect("items")
    }

    fn visible(&self) -> Vec<KbItem> {
        self.e().kb_status("m", None).expect("status").items
    }

    fn work(&self) {
        self.e().run_due_jobs().expect("jobs");
        // A drain applies the outbox; it also settles.
        let _ = self.e().drain(&|_| {});
        self.e().kb_settle().expect("settle");
    }
}

fn check(w: &World) -> Result<(), TestCaseError> {
    let e = w.e();
    e.kb_settle()
        .map_err(|x| TestCaseError::fail(x.to_string()))?;
    let all = w.all();
    // KB1
    for i in &all {
        let stage = match i.status {
            ItemStatus::Idle | ItemStatus::Reading => "index",
            ItemStatus::Preparing => "prepare",
            _ => continue,
        };
        let key = format!("kb:m:{}:{stage}", i.id);
        let live = e.store().jobs().live_job(&key).expect("live");
        prop_assert!(
            live.is_some(),
            "KB1: {} is {} without a live {key}",
            i.id,
            i.status.as_str()
        );
    }
    // KB2
    let root = e.store().kb_base("m").expect("base").root;
    let nodes = e.store().read_subtree(&root).unwrap_or_default();
    for n in nodes.into_iter().filter(|n| n.uri != root) {
        let owned = all.iter().any(|i| n.uri.is_within(&i.node_uri))
            || all.iter().any(|i| i.node_uri.is_within(&n.uri));
        prop_assert!(owned, "KB2: {} has no owner", n.uri);
    }
    for gone in &w.deleted_nodes {
        let owner = all
            .iter()
            .any(|i| gone.is_within(&i.node_uri) || i.node_uri == *gone);
        if !owner {
            let left = e.store().read_node(gone).expect("read");
            prop_assert!(left.is_none(), "KB2: deleted {gone} came back");
        }
    }
    // KB3
    for i in w.visible() {
        prop_assert!(
            i.status != ItemStatus::Deleting,
            "KB3: {} visible while deleting",
            i.id
        );
    }
    Ok(())
}

fn step(w: &mut World, op: &Op) -> Result<(), TestCaseError> {
    match op {
        Op::AddFile(good) => {
            let dir = w.src.path().to_owned();
            let f = w.file(*good, &dir);
            w.e()
                .kb_add(
                    "m",
                    vec![KbInput {
                        path: Some(f.display().to_string()),
                        ..KbInput::default()
                    }],
                )
                .expect("add");
        }
        Op::AddNote => {
            w.e()
                .kb_add(
                    "m",
                    vec![KbInput {
                        note: Some("Ship the release notes with the build.".into()),
                        ..KbInput::default()
                    }],
                )
                .expect("add");
        }
        Op::AddDir(n) => {
            w.files += 1;
            let dir = w.src.path().join(format!("d{}", w.files));
            let sub = dir.join("sub");
            std::fs::create_dir_all(&sub).expect("mkdir");
            for _ in 0..*n {
                w.file(true, &dir);
            }
            w.file(false, &dir);
            w.file(true, &sub);
            w.e()
                .kb_add(
                    "m",
                    vec![KbInput {
                        path: Some(dir.display().to_string()),
                        ..KbInput::default()
                    }],
                )
                .expect("add");
        }
        Op::Work => w.work(),
        Op::Delete(i) => {
            let visible = w.visible();
            if !visible.is_empty() {
                let item = &visible[i % visible.len()];
                w.e()
                    .kb_delete_items("m", std::slice::from_ref(&item.id))
                    .expect("delete");
                w.deleted_nodes.push(item.node_uri.clone());
            }
        }
        Op::Reindex(i) => {
            let all = w.all();
            let visible = w.visible();
            if !visible.is_empty() {
                let item = &visible[i % visible.len()];
                let terminal = subtree_of(&all, &item.id)
                    .iter()
                    .all(|x| x.status.is_terminal());
                let r = w.e().kb_reindex_items("m", std::slice::from_ref(&item.id));
                // KB4
                prop_assert_eq!(
                    r.is_ok(),
                    terminal,
                    "KB4: reindex of {} ({:?})",
                    item.id,
                    r.err().map(|e| e.to_string())
                );
            }
        }
        Op::Resync(i) => {
            let roots: Vec<KbItem> = w
                .visible()
                .into_iter()
                .filter(|x| x.parent_id.is_none())
                .collect();
            if !roots.is_empty() {
                let root = &roots[i % roots.len()];
                let input = match root.kind {
                    ce_store::ItemKind::Note => KbInput {
                        note: Some(root.source.clone()),
                        ..KbInput::default()
                    },
                    _ => KbInput {
                        path: Some(root.source.clone()),
                        ..KbInput::default()
                    },
                };
                let added = w.e().kb_add("m", vec![input]).expect("re-sync");
                prop_assert!(
                    added.items.iter().any(|x| x.id == root.id),
                    "a re-sync of {} made a new item: {:?}",
                    root.id,
                    added.items
                );
            }
        }
        Op::Age => std::thread::sleep(
            ce_server::kb::fingerprint::RACY_WINDOW + std::time::Duration::from_millis(100),
        ),
        Op::LoseJob(i) => {
            let live: Vec<_> = [JobState::Pending, JobState::Failed]
                .into_iter()
                .flat_map(|s| {
                    w.e()
                        .list_jobs(&JobFilter {
                            state: Some(s),
                            limit: 1000,
                            ..JobFilter::default()
                        })
                        .expect("jobs")
                })
                .collect();
            if !live.is_empty() {
                let job = &live[i % live.len()];
                w.e().cancel_job(&job.id).expect("cancel");
                // Its item (and a directory's whole subtree) may now end failed.
                let id = job.payload["item"].as_str().unwrap_or_default().to_owned();
                let all = w.all();
                for x in subtree_of(&all, &id) {
                    w.expect.insert(x.source.clone(), Expect::Either);
                }
                if let Some(item) = all.iter().find(|x| x.id == id) {
                    // A directory's later children come from the same source prefix.
                    let prefix = format!("{}/", item.source);
                    for (k, v) in w.expect.iter_mut() {
                        if k.starts_with(&prefix) {
                            *v = Expect::Either;
                        }
                    }
                }
            }
        }
        Op::RemoveSource(i) => {
            let files: Vec<String> = w
                .expect
                .iter()
                .filter(|(k, v)| {
                    k.starts_with('/') && **v != Expect::NotFound && Path::new(k).is_file()
                })
                .map(|(k, _)| k.clone())
                .collect();
            if !files.is_empty() {
                let f = files[i % files.len()].clone();
                std::fs::remove_file(&f).expect("rm");
                // An item not read yet fails `not_found`; one read already may have
                // completed (or failed corrupt), and fails on its next reindex.
                let unread = w
                    .all()
                    .iter()
                    .any(|x| x.source == f && x.status == ItemStatus::Idle)
                    && w.expect.get(&f) != Some(&Expect::Either);
                w.expect.insert(
                    f,
                    if unread {
                        Expect::NotFound
                    } else {
                        Expect::Either
                    },
                );
            }
        }
        Op::Restart => {
            w.open();
            w.e().kb_recover().expect("recover");
        }
    }
    check(w)
}

fn finish(w: &mut World) -> Result<(), TestCaseError> {
    w.e().kb_recover().expect("recover");
    // Until every job ended and every item is terminal: a job refused as busy (a directory
    // whose entry is being reindexed) runs again after its backoff, seconds later — a
    // deadline, not a count of rounds, which a fast machine runs through before it is due.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        w.work();
        let open: usize = [
            JobState::Pending,
            JobState::Delayed,
            JobState::Running,
            JobState::Failed,
        ]
        .into_iter()
        .map(|s| {
            w.e()
                .list_jobs(&JobFilter {
                    state: Some(s),
                    limit: 1000,
                    ..JobFilter::default()
                })
                .expect("jobs")
                .len()
        })
        .sum();
        let all = w.all();
        if open == 0 && all.iter().all(|i| i.status.is_terminal()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    check(w)?;
    let all = w.all();
    for i in &all {
        prop_assert!(
            i.status.is_terminal(),
            "{} still {}",
            i.id,
            i.status.as_str()
        );
        let want = if i.kind == ce_store::ItemKind::File {
            w.expect.get(&i.source).copied().unwrap_or(Expect::Either)
        } else {
            Expect::Either
        };
        let got = (i.status, i.error.as_ref().map(|e| e.code.as_str()));
        match want {
            Expect::Completed => {
                prop_assert_eq!(got, (ItemStatus::Completed, None), "{}", i.source)
            }
            Expect::ParseError => prop_assert_eq!(
                got,
                (ItemStatus::Failed, Some("parse_error")),
                "{}",
                i.source
            ),
            Expect::NotFound => {
                prop_assert_eq!(got, (ItemStatus::Failed, Some("not_found")), "{}", i.source)
            }
            Expect::Either => {}
        }
        if i.status == ItemStatus::Completed && i.kind != ce_store::ItemKind::Directory {
            prop_assert!(
                w.e()
                    .store()
                    .read_node(&i.node_uri)
                    .expect("read")
                    .is_some(),
                "{} completed without its node",
                i.id
            );
        }
    }
    Ok(())
}

fn the_workflow_matches_its_model_after_every_step(backend: Backend) {
    let seed = ce_testkit::seed("kb_model");
    let cases = ce_core::test_cases(if backend == Backend::Postgres { 3 } else { 6 });
    let mut runner = ce_testkit::seeded_runner(seed, cases, 20);
    let result = runner.run(&proptest::collection::vec(op(), 1..25), |ops| {
        let mut w = World {
            place: backend.place(),
            data: tempfile::tempdir().expect("data"),
            src: tempfile::tempdir().expect("src"),
            engine: None,
            files: 0,
            expect: BTreeMap::new(),
            deleted_nodes: Vec::new(),
        };
        w.open();
        w.e()
            .kb_create(CreateBase {
                name: "m".into(),
                account: Some("acct".into()),
                settings: Some(KbSettings {
                    max_tokens: 128,
                    overlap_tokens: 16,
                    min_tokens: 32,
                }),
                ..CreateBase::default()
            })
            .expect("create");
        for op in &ops {
            step(&mut w, op)?;
        }
        finish(&mut w)
    });
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
}
