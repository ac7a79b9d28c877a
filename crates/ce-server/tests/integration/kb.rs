//! The ingestion workflow through the engine, on both store backends: a directory of real
//! fixture files (Markdown, HTML, PDF, code, and a corrupt PDF and a PNG that must fail
//! alone) becomes searchable chunks; re-adding and reindexing unchanged inputs append no
//! event; the spec's failure matrix — delete while indexing (the stale guard refuses the
//! commit, nothing resurrects), reindex refused while anything is active, a delete whose
//! job is gone finished by the recovery scan, a rerun of `index-documents` converging on the
//! same nodes, idempotency keys shared by repeated entries; URLs over a loopback server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ce_core::{Classify as _, Config, CtxUri, ErrorCode};
use ce_http::loopback::{LoopbackServer, Reply};
use ce_retrieval::{HierarchicalParams, HierarchicalRequest, SearchMode, SearchRequest};
use ce_server::kb::fingerprint::RACY_WINDOW;
use ce_server::kb::{AddResult, CreateBase, KbInput, KbJobs, KbSettings};
use ce_server::{Engine, EngineOptions};
use ce_store::{ItemKind, ItemStatus, JobFilter, JobState, KbItem, KbOp, WriteOp};
use ce_testkit::backends::{Backend, Place};

ce_testkit::backend_tests!(
    a_directory_of_real_files_becomes_searchable_chunks_and_a_resync_appends_nothing,
    a_resync_reads_only_the_files_that_changed_failed_or_lost_their_nodes,
    a_resync_of_an_unchanged_file_root_runs_no_index_job,
    delete_while_indexing_is_refused_by_the_stale_guard,
    reindex_is_refused_while_anything_in_the_subtree_is_active,
    the_recovery_scan_finishes_a_delete_whose_job_is_gone,
    a_deleting_item_vanishes_from_flat_and_hierarchical_search_at_once,
    the_status_report_counts_items_per_base_with_failures_and_active_jobs,
    a_rerun_of_index_documents_converges_on_the_same_nodes,
    urls_are_fetched_with_content_type_checks_and_failures_stay_per_item,
);

/// The parsers' fixtures (real files from real writers; ce-ingest/tests/fixtures).
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ce-ingest/tests/fixtures")
}

/// An engine on `place` (SQLite in its directory, or PostgreSQL in its database), hash
/// embedder, workers on demand.
struct Kb {
    engine: Engine,
    _dir: tempfile::TempDir,
    _place: Place,
}

fn open(backend: Backend) -> Kb {
    let place = backend.place();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::default();
    config.index.embedding.provider = "hash".into();
    config.jobs.max_retries = 2;
    if let Place::Db(db) = &place {
        config.store.url = db.url().to_owned();
    }
    let options = EngineOptions {
        workers: 1,
        run_workers: false,
        role: "test".into(),
        consumers: Vec::new(),
    };
    let engine = Engine::open_with(dir.path(), config, options).expect("engine");
    Kb {
        engine,
        _dir: dir,
        _place: place,
    }
}

fn create(e: &Engine, name: &str, max_tokens: usize) {
    e.kb_create(CreateBase {
        name: name.into(),
        account: Some("acct".into()),
        settings: Some(KbSettings {
            max_tokens,
            overlap_tokens: 16,
            min_tokens: 32,
        }),
        ..CreateBase::default()
    })
    .expect("create");
}

fn path(p: &Path) -> KbInput {
    KbInput {
        path: Some(p.display().to_string()),
        ..KbInput::default()
    }
}

/// Follows `j` to its end (jobs, drain, settle, here).
fn finish(e: &Engine, base: &str, j: &KbJobs) {
    let f = e
        .kb_follow(base, &j.roots, &j.jobs, &|_| {})
        .expect("follow");
    assert_eq!(f.waiting, None, "{f:?}");
    assert!(f.progress.finished, "{f:?}");
}

/// The work an add started, to follow.
fn started(a: &AddResult) -> KbJobs {
    KbJobs {
        roots: a.items.iter().map(|i| i.id.clone()).collect(),
        jobs: a.jobs.clone(),
    }
}

/// Sets `files`' modification time an hour back, then waits out the racy window of their
/// change time: their stats can vouch for their content from then on.
fn settle_stats(files: &[&Path]) {
    for f in files {
        std::fs::File::options()
            .write(true)
            .open(f)
            .and_then(|h| h.set_modified(SystemTime::now() - Duration::from_secs(3600)))
            .expect("set mtime");
    }
    std::thread::sleep(RACY_WINDOW + Duration::from_millis(200));
}

/// How many `kb-index-documents` jobs exist: one per file read so far.
fn index_jobs(e: &Engine) -> usize {
    e.list_jobs(&JobFilter {
        job_type: Some("kb-index-documents".into()),
        limit: 1000,
        ..JobFilter::default()
    })
    .expect("jobs")
    .len()
}

fn items(e: &Engine, base: &str) -> Vec<KbItem> {
    e.kb_status(base, None).expect("status").items
}

fn by_source<'a>(items: &'a [KbItem], file: &str) -> &'a KbItem {
    items
        .iter()
        .find(|i| i.source.ends_with(file))
        .unwrap_or_else(|| panic!("no item for {file}: {items:#?}"))
}

fn event_count(e: &Engine) -> usize {
    // Every event has one delivery per configured consumer: one consumer's count is the
    // number of events.
    e.store()
        .stats()
        .expect("stats")
        .iter()
        .map(|s| (s.pending + s.claimed + s.retry_wait + s.done + s.dead) as usize)
        .max()
        .unwrap_or(0)
}

fn keyword(e: &Engine, q: &str) -> Vec<CtxUri> {
    let mut req = SearchRequest::new(q);
    req.mode = Some(SearchMode::Keyword);
    e.search(&req)
        .expect("search")
        .hits
        .into_iter()
        .map(|h| h.uri)
        .collect()
}

fn a_directory_of_real_files_becomes_searchable_chunks_and_a_resync_appends_nothing(
    backend: Backend,
) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "docs", 128);
    let src = tempfile::tempdir().expect("src");
    let sub = src.path().join("library");
    std::fs::create_dir(&sub).expect("mkdir");
    for f in [
        "guide.md",
        "article.html",
        "handbook.pdf",
        "corrupt.pdf",
        "figure.png",
    ] {
        std::fs::copy(fixtures().join(f), src.path().join(f)).expect("copy");
    }
    std::fs::copy(fixtures().join("sentences.rs"), sub.join("sentences.rs")).expect("copy");
    std::fs::write(src.path().join(".hidden"), "skipped").expect("hidden");

    let added = e.kb_add("docs", vec![path(src.path())]).expect("add");
    assert_eq!(added.items.len(), 1);
    assert_eq!(added.items[0].kind, ItemKind::Directory);
    assert_eq!(added.items[0].status, ItemStatus::Preparing);
    let j = KbJobs {
        roots: vec![added.items[0].id.clone()],
        jobs: added.jobs.clone(),
    };
    finish(e, "docs", &j);

    let all = items(e, "docs");
    assert_eq!(
        all.len(),
        1 + 5 + 1 + 1,
        "dir, 5 files, library and its file: {all:#?}"
    );
    let root = &all.iter().find(|i| i.parent_id.is_none()).expect("root");
    assert_eq!(root.status, ItemStatus::Completed);
    for ok in [
        "guide.md",
        "article.html",
        "handbook.pdf",
        "sentences.rs",
        "library",
    ] {
        assert_eq!(
            by_source(&all, ok).status,
            ItemStatus::Completed,
            "{ok}: {:?}",
            by_source(&all, ok).error
        );
    }
    let corrupt = by_source(&all, "corrupt.pdf");
    assert_eq!(corrupt.status, ItemStatus::Failed);
    assert_eq!(
        corrupt.error.as_ref().map(|e| e.code.as_str()),
        Some("parse_error")
    );
    let png = by_source(&all, "figure.png");
    assert_eq!(
        png.error.as_ref().map(|e| e.code.as_str()),
        Some("unsupported_format")
    );
    assert!(
        png.error
            .as_ref()
            .is_some_and(|e| e.message.contains("image/png") || e.message.contains(".png")),
        "{png:?}"
    );

    // The guide is long at 128 tokens: a document node and its chunks, with their meta.
    let guide = by_source(&all, "guide.md");
    let doc = e
        .store()
        .read_node(&guide.node_uri)
        .expect("read")
        .expect("doc node");
    assert!(
        doc.layers.content.is_empty(),
        "a split document's own L2 is empty"
    );
    let chunks = e.store().ls(&guide.node_uri).expect("chunks");
    assert!(chunks.len() > 1, "{chunks:?}");
    let first = e
        .store()
        .read_node(&chunks[0].uri)
        .expect("read")
        .expect("chunk");
    assert_eq!(first.uri.name(), "chunk-0000");
    let meta = &first.meta["kb_chunk"];
    assert_eq!(meta["index"], 0);
    assert!(meta["heading_path"].is_array(), "{meta}");
    assert_eq!(first.meta["kb"]["format"], "markdown");
    // The PDF's chunks carry their pages.
    let pdf = by_source(&all, "handbook.pdf");
    let pdf_chunks = e.store().ls(&pdf.node_uri).expect("pdf");
    let pdf_first = e
        .store()
        .read_node(
            &pdf_chunks
                .first()
                .map(|c| c.uri.clone())
                .unwrap_or(pdf.node_uri.clone()),
        )
        .expect("read")
        .expect("node");
    if !pdf_chunks.is_empty() {
        assert!(
            pdf_first.meta["kb_chunk"]["pages"].is_array(),
            "{:?}",
            pdf_first.meta
        );
    }
    // Code keeps its language.
    let code = by_source(&all, "sentences.rs");
    let code_node = e
        .store()
        .read_node(&code.node_uri)
        .expect("read")
        .expect("code");
    assert_eq!(code_node.meta["kb"]["language"], "rust");
    assert!(
        code.node_uri.as_str().ends_with("/library/sentences.rs"),
        "{}",
        code.node_uri
    );

    // Searchable: a phrase of the PDF's and one of the HTML page's text.
    let pdf_text = ce_ingest::parse(
        &std::fs::read(fixtures().join("handbook.pdf")).expect("pdf"),
        ce_ingest::Hint::file("handbook.pdf"),
    )
    .expect("parse");
    let word = pdf_text
        .text
        .split_whitespace()
        .find(|w| w.len() > 7 && w.chars().all(char::is_alphabetic))
        .expect("a word")
        .to_owned();
    let hits = keyword(e, &word);
    assert!(
        hits.iter().any(|u| u.is_within(&pdf.node_uri)),
        "{word}: {hits:?}"
    );

    // Reindexing the unchanged directory appends no event.
    let before = event_count(e);
    let r = e
        .kb_reindex_items("docs", std::slice::from_ref(&root.id))
        .expect("reindex");
    finish(e, "docs", &r);
    assert_eq!(
        event_count(e),
        before,
        "an unchanged re-sync appends no event"
    );
    let again = items(e, "docs");
    assert_eq!(again.len(), all.len());
    assert_eq!(by_source(&again, "guide.md").node_uri, guide.node_uri);

    // A file gone from the directory is removed on the next re-sync; the rest is kept.
    std::fs::remove_file(src.path().join("article.html")).expect("rm");
    let html_uri = by_source(&all, "article.html").node_uri.clone();
    let r = e
        .kb_reindex_items("docs", std::slice::from_ref(&root.id))
        .expect("reindex");
    finish(e, "docs", &r);
    assert!(
        e.store().read_node(&html_uri).expect("read").is_none(),
        "gone file removed"
    );
    assert!(
        e.store()
            .read_node(&guide.node_uri)
            .expect("read")
            .is_some()
    );
}

/// The skip decisions of a re-sync (docs/ingestion.md "Re-sync"): an unchanged completed file
/// is not read (no job, its row untouched); a failed one, one whose stat changed (even with
/// its size and modification time restored), one changed within the racy window, and one
/// whose node was removed are read; an explicit reindex reads them all, appending nothing.
fn a_resync_reads_only_the_files_that_changed_failed_or_lost_their_nodes(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "sync", 128);
    let src = tempfile::tempdir().expect("src");
    let sub = src.path().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    let (a, b, bad, c) = (
        src.path().join("a.md"),
        src.path().join("b.md"),
        src.path().join("bad.pdf"),
        sub.join("c.md"),
    );
    std::fs::copy(fixtures().join("guide.md"), &a).expect("copy");
    std::fs::write(&b, "The orchard ledger lists every pear tree.").expect("write");
    std::fs::copy(fixtures().join("corrupt.pdf"), &bad).expect("copy");
    std::fs::write(&c, "The cellar key hangs by the door.").expect("write");
    settle_stats(&[&a, &b, &bad, &c]);
    let resync = || {
        let added = e.kb_add("sync", vec![path(src.path())]).expect("add");
        finish(e, "sync", &started(&added));
    };
    resync();
    let first = items(e, "sync");
    for f in ["a.md", "b.md", "c.md"] {
        let i = by_source(&first, f);
        assert_eq!(i.status, ItemStatus::Completed, "{f}");
        assert!(i.fingerprint.is_some(), "{f}: {i:?}");
    }
    assert_eq!(by_source(&first, "bad.pdf").status, ItemStatus::Failed);
    assert_eq!(index_jobs(e), 4);

    // Unchanged: only the failed file is read again; the others keep their rows as they are.
    let events = event_count(e);
    resync();
    assert_eq!(index_jobs(e), 4 + 1, "only bad.pdf read");
    assert_eq!(event_count(e), events);
    let second = items(e, "sync");
    for f in ["a.md", "b.md", "c.md"] {
        assert_eq!(by_source(&second, f), by_source(&first, f), "{f} untouched");
    }
    assert_eq!(
        by_source(&second, "bad.pdf")
            .error
            .as_ref()
            .map(|x| x.code.as_str()),
        Some("parse_error")
    );

    // b rewritten with the same size and its modification time put back: the change time
    // (and the inode check's neighbours) still tell; it is read and its node follows.
    let mtime = std::fs::metadata(&b)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::write(&b, "The orchard ledger lists every plum tree.").expect("write");
    std::fs::File::options()
        .write(true)
        .open(&b)
        .and_then(|h| h.set_modified(mtime))
        .expect("restore mtime");
    std::thread::sleep(RACY_WINDOW + Duration::from_millis(200));
    resync();
    assert_eq!(index_jobs(e), 5 + 2, "b.md and bad.pdf read");
    let b_item = by_source(&items(e, "sync"), "b.md").clone();
    let b_node = e
        .store()
        .read_node(&b_item.node_uri)
        .expect("read")
        .expect("b");
    assert!(b_node.layers.content.contains("plum"), "{b_node:?}");
    assert_eq!(b_item.id, by_source(&first, "b.md").id, "the same item");

    // c changed just now: read, but its stat cannot vouch for it yet (no fingerprint), so
    // the next re-sync reads it again.
    std::fs::write(&c, "The cellar key hangs by the back door.").expect("write");
    resync();
    assert_eq!(index_jobs(e), 7 + 2, "c.md and bad.pdf read");
    assert_eq!(by_source(&items(e, "sync"), "c.md").fingerprint, None);
    settle_stats(&[&c]);
    resync();
    assert_eq!(
        index_jobs(e),
        9 + 2,
        "c.md (no fingerprint) and bad.pdf read"
    );
    assert!(by_source(&items(e, "sync"), "c.md").fingerprint.is_some());
    resync();
    assert_eq!(index_jobs(e), 11 + 1, "only bad.pdf read");

    // a's node removed behind the workflow's back: the re-sync writes it again.
    let a_item = by_source(&items(e, "sync"), "a.md").clone();
    e.rm(&a_item.node_uri, true, None, None).expect("rm");
    resync();
    assert_eq!(index_jobs(e), 12 + 2, "a.md and bad.pdf read");
    assert!(
        e.store()
            .read_node(&a_item.node_uri)
            .expect("read")
            .is_some()
    );

    // An explicit reindex reads every file again, and appends nothing for unchanged ones.
    let events = event_count(e);
    let root = items(e, "sync")
        .into_iter()
        .find(|i| i.parent_id.is_none())
        .expect("root");
    let r = e
        .kb_reindex_items("sync", std::slice::from_ref(&root.id))
        .expect("reindex");
    finish(e, "sync", &r);
    assert_eq!(index_jobs(e), 14 + 4, "every file read");
    assert_eq!(event_count(e), events);
    assert_eq!(items(e, "sync").len(), first.len());
}

/// A file added on its own: its re-sync (`kb add` again) checks the fingerprint in
/// `kb-reindex-subtree` and runs no index job when it is unchanged.
fn a_resync_of_an_unchanged_file_root_runs_no_index_job(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "one", 128);
    let src = tempfile::tempdir().expect("src");
    let f = src.path().join("memo.md");
    std::fs::write(&f, "Water the ferns on Fridays.").expect("write");
    settle_stats(&[&f]);
    let add = || {
        let added = e.kb_add("one", vec![path(&f)]).expect("add");
        finish(e, "one", &started(&added));
        added
    };
    let first = add();
    assert_eq!(index_jobs(e), 1);
    let again = add();
    assert_eq!(
        again.items[0].id, first.items[0].id,
        "a re-sync of the same item"
    );
    assert_eq!(index_jobs(e), 1, "unchanged: not read");
    let reindex = e
        .list_jobs(&JobFilter {
            job_type: Some("kb-reindex-subtree".into()),
            limit: 10,
            ..JobFilter::default()
        })
        .expect("jobs");
    assert_eq!(reindex.len(), 1);
    assert_eq!(
        reindex[0].progress.as_ref().map(|p| p["unchanged"].clone()),
        Some(serde_json::json!(first.items[0].id))
    );
    // Changed (another size): read.
    std::fs::write(&f, "Water the ferns on Fridays and Tuesdays.").expect("write");
    add();
    assert_eq!(index_jobs(e), 2);
}

fn delete_while_indexing_is_refused_by_the_stale_guard(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "web", 256);
    let page = std::fs::read_to_string(fixtures().join("article.html")).expect("html");
    let server = LoopbackServer::start(move |_| Reply {
        status: 200,
        headers: vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
        body: page.clone(),
        delay: Some(Duration::from_millis(1500)),
    });
    let url = format!("{}/blog/article.html", server.base_url());
    let added = e
        .kb_add(
            "web",
            vec![KbInput {
                url: Some(url),
                ..KbInput::default()
            }],
        )
        .expect("add");
    let item = added.items[0].clone();
    std::thread::scope(|s| {
        // The index job runs and waits for the slow page...
        let running = s.spawn(|| e.run_due_jobs());
        std::thread::sleep(Duration::from_millis(500));
        // ...while the user deletes the item: invisible at once.
        let d = e
            .kb_delete_items("web", std::slice::from_ref(&item.id))
            .expect("delete");
        assert_eq!(d.roots, std::slice::from_ref(&item.id));
        assert!(items(e, "web").is_empty(), "deleting items are invisible");
        running.join().expect("join").expect("jobs");
    });
    // The commit was refused: no node was ever written for the item.
    assert!(
        e.store().read_node(&item.node_uri).expect("read").is_none(),
        "no resurrection"
    );
    let jobs = e
        .list_jobs(&JobFilter {
            limit: 10,
            ..JobFilter::default()
        })
        .expect("jobs");
    let index = jobs
        .iter()
        .find(|j| j.job_type == "kb-index-documents")
        .expect("index job");
    assert_eq!(index.state, JobState::Completed);
    assert_eq!(
        index.progress.as_ref().map(|p| p["skipped"].clone()),
        Some("item deleting".into()),
        "{index:?}"
    );
    // The cleanup removes the rows.
    let j = KbJobs {
        roots: vec![item.id.clone()],
        jobs: Vec::new(),
    };
    finish(e, "web", &j);
    assert!(e.store().kb_items("web").expect("rows").is_empty());
}

fn reindex_is_refused_while_anything_in_the_subtree_is_active(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "docs", 256);
    let src = tempfile::tempdir().expect("src");
    std::fs::copy(fixtures().join("plain.txt"), src.path().join("plain.txt")).expect("copy");
    std::fs::copy(
        fixtures().join("notes-zh.md"),
        src.path().join("notes-zh.md"),
    )
    .expect("copy");
    let added = e.kb_add("docs", vec![path(src.path())]).expect("add");
    let root = added.items[0].id.clone();
    // Still preparing: the whole batch is refused, nothing is enqueued.
    let jobs_before = e
        .list_jobs(&JobFilter {
            limit: 100,
            ..JobFilter::default()
        })
        .expect("jobs")
        .len();
    let err = e
        .kb_reindex_items("docs", std::slice::from_ref(&root))
        .expect_err("active");
    assert_eq!(
        (err.code(), err.is_retryable()),
        (ErrorCode::StateTransition, false)
    );
    assert!(err.to_string().contains("preparing"), "{err}");
    assert_eq!(
        e.list_jobs(&JobFilter {
            limit: 100,
            ..JobFilter::default()
        })
        .expect("jobs")
        .len(),
        jobs_before
    );
    // Adding the same directory again while it is prepared is that item, with no new job.
    let second = e.kb_add("docs", vec![path(src.path())]).expect("add again");
    assert_eq!(second.items[0].id, root);
    assert!(second.jobs.is_empty(), "{second:?}");
    finish(
        e,
        "docs",
        &KbJobs {
            roots: vec![root.clone()],
            jobs: added.jobs,
        },
    );
    // Unknown ids refuse the batch too.
    let err = e
        .kb_reindex_items("docs", &[root.clone(), "ffff".into()])
        .expect_err("unknown");
    assert_eq!(err.code(), ErrorCode::NotFound);
    // Terminal now: accepted, and a second request shares the queued job (its key).
    let a = e
        .kb_reindex_items("docs", std::slice::from_ref(&root))
        .expect("reindex");
    let b = e
        .kb_reindex_items("docs", std::slice::from_ref(&root))
        .expect("again");
    assert_eq!(
        a.jobs, b.jobs,
        "kb:docs:{root}:reindex is held by the queued job"
    );
    let job = e.job(&a.jobs[0]).expect("job");
    assert_eq!(
        job.idempotency_key.as_deref(),
        Some(format!("kb:docs:{root}:reindex").as_str())
    );
    finish(e, "docs", &a);
    // A nested selection folds into its root.
    let child = items(e, "docs")
        .into_iter()
        .find(|i| i.parent_id.as_deref() == Some(root.as_str()))
        .expect("child");
    let folded = e
        .kb_reindex_items("docs", &[child.id.clone(), root.clone()])
        .expect("fold");
    assert_eq!(folded.roots, std::slice::from_ref(&root));
    finish(e, "docs", &folded);
}

fn the_recovery_scan_finishes_a_delete_whose_job_is_gone(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "notes", 256);
    let added = e
        .kb_add(
            "notes",
            vec![KbInput {
                note: Some("Remember the quarterly planning meeting on Friday.".into()),
                ..KbInput::default()
            }],
        )
        .expect("add");
    let item = added.items[0].clone();
    finish(
        e,
        "notes",
        &KbJobs {
            roots: vec![item.id.clone()],
            jobs: added.jobs,
        },
    );
    assert!(e.store().read_node(&item.node_uri).expect("read").is_some());
    assert_eq!(
        keyword(e, "quarterly planning"),
        std::slice::from_ref(&item.node_uri)
    );
    let d = e
        .kb_delete_items("notes", std::slice::from_ref(&item.id))
        .expect("delete");
    // The cleanup job is lost (here: cancelled before it ran, as a dead job would be).
    // Invisible to search at once, while its nodes still wait for the cleanup.
    assert!(keyword(e, "quarterly planning").is_empty());
    e.cancel_job(&d.jobs[0]).expect("cancel");
    assert_eq!(
        e.store().kb_item("notes", &item.id).expect("row").status,
        ItemStatus::Deleting
    );
    assert!(items(e, "notes").is_empty(), "invisible meanwhile");
    // Start-up recovery: one job re-enqueued, a second scan finds it live.
    assert_eq!(e.kb_recover().expect("recover"), 1);
    assert_eq!(e.kb_recover().expect("again"), 0);
    finish(
        e,
        "notes",
        &KbJobs {
            roots: vec![item.id.clone()],
            jobs: Vec::new(),
        },
    );
    assert!(e.store().kb_items("notes").expect("rows").is_empty());
    assert!(e.store().read_node(&item.node_uri).expect("read").is_none());
    // Removing the base removes its root too.
    let r = e.kb_remove("notes").expect("rm");
    finish(e, "notes", &r);
    assert!(e.kb_bases().expect("bases").is_empty());
}

/// The URIs hierarchical search finds for `q` below `subtree`.
fn hierarchical(e: &Engine, q: &str, subtree: &CtxUri) -> Vec<CtxUri> {
    let mut search = SearchRequest::new(q);
    search.filter.subtree = Some(subtree.clone());
    let req = HierarchicalRequest {
        search,
        params: HierarchicalParams::default(),
    };
    e.hierarchical(&req)
        .expect("hierarchical search")
        .hits
        .into_iter()
        .map(|h| h.uri)
        .collect()
}

fn a_deleting_item_vanishes_from_flat_and_hierarchical_search_at_once(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "notes", 256);
    let note = |text: &str, name: &str| KbInput {
        note: Some(text.into()),
        name: Some(name.into()),
        ..KbInput::default()
    };
    let added = e
        .kb_add(
            "notes",
            vec![
                note(
                    "Narwhal tusks are long spiral teeth of the arctic whale.",
                    "narwhal",
                ),
                note(
                    "Walrus tusks are long ivory teeth of the arctic walrus.",
                    "walrus",
                ),
            ],
        )
        .expect("add");
    let roots: Vec<String> = added.items.iter().map(|i| i.id.clone()).collect();
    finish(
        e,
        "notes",
        &KbJobs {
            roots,
            jobs: added.jobs,
        },
    );
    let (narwhal, walrus) = (&added.items[0], &added.items[1]);
    let base = e.store().kb_base("notes").expect("base").root;
    let found = hierarchical(e, "arctic tusks teeth", &base);
    for i in [narwhal, walrus] {
        assert!(
            found.iter().any(|u| u.is_within(&i.node_uri)),
            "{} before the delete: {found:?}",
            i.node_uri
        );
    }
    // Marked deleting; its cleanup job has not run (no runner here): the nodes are still in
    // the source and the indexes, and neither search may show them.
    let d = e
        .kb_delete_items("notes", std::slice::from_ref(&narwhal.id))
        .expect("delete");
    assert_eq!(
        e.store().kb_item("notes", &narwhal.id).expect("row").status,
        ItemStatus::Deleting
    );
    assert!(
        e.store()
            .read_node(&narwhal.node_uri)
            .expect("read")
            .is_some()
    );
    let found = hierarchical(e, "arctic tusks teeth", &base);
    assert!(
        !found.iter().any(|u| u.is_within(&narwhal.node_uri)),
        "a deleting item in hierarchical search: {found:?}"
    );
    assert!(
        found.iter().any(|u| u.is_within(&walrus.node_uri)),
        "the other item stays: {found:?}"
    );
    assert!(
        !keyword(e, "narwhal tusks")
            .iter()
            .any(|u| u.is_within(&narwhal.node_uri))
    );
    finish(
        e,
        "notes",
        &KbJobs {
            roots: vec![narwhal.id.clone()],
            jobs: d.jobs,
        },
    );
    assert!(
        e.store()
            .read_node(&narwhal.node_uri)
            .expect("read")
            .is_none()
    );
}

fn the_status_report_counts_items_per_base_with_failures_and_active_jobs(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    let report = || e.status().expect("status").kb;
    assert!(report().bases.is_empty());
    create(e, "notes", 256);
    create(e, "empty", 256);
    let missing = kb._dir.path().join("no-such-file.md");
    let added = e
        .kb_add(
            "notes",
            vec![
                KbInput {
                    note: Some("Tapirs forage along the riverbank at night.".into()),
                    ..KbInput::default()
                },
                path(&missing),
            ],
        )
        .expect("add");
    let r = report();
    assert_eq!(
        r.bases.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
        ["empty", "notes"]
    );
    assert!(r.bases[0].counts.values().all(|&n| n == 0));
    assert_eq!(r.bases[1].counts[&ItemStatus::Idle], 2, "{r:?}");
    assert_eq!(r.active_jobs[ce_server::kb::INDEX_JOB], 2, "{r:?}");
    assert_eq!(r.active_jobs[ce_server::kb::DELETE_JOB], 0);
    finish(
        e,
        "notes",
        &KbJobs {
            roots: added.items.iter().map(|i| i.id.clone()).collect(),
            jobs: added.jobs,
        },
    );
    let r = report();
    let notes = &r.bases[1];
    assert_eq!(notes.counts[&ItemStatus::Completed], 1, "{r:?}");
    assert_eq!(notes.counts[&ItemStatus::Failed], 1, "{r:?}");
    assert_eq!(notes.recent_failures.len(), 1, "{r:?}");
    let failed = &notes.recent_failures[0];
    assert_eq!(failed.id, added.items[1].id);
    assert_eq!(failed.node_uri, added.items[1].node_uri);
    assert!(
        failed.error.message.contains("no-such-file.md"),
        "{failed:?}"
    );
    assert!(r.active_jobs.values().all(|&n| n == 0), "{r:?}");
    // The JSON of `GET /v1/status` / `ce status --json` carries it under `kb`.
    let json = serde_json::to_value(e.status().expect("status")).expect("json");
    assert_eq!(json["kb"]["bases"][1]["counts"]["failed"], 1, "{json}");
    assert_eq!(
        json["kb"]["bases"][1]["recent_failures"][0]["error"]["code"],
        failed.error.code.as_str()
    );
}

fn a_rerun_of_index_documents_converges_on_the_same_nodes(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "docs", 128);
    let file = fixtures().join("guide.md");
    let added = e.kb_add("docs", vec![path(&file)]).expect("add");
    let item = added.items[0].clone();
    finish(
        e,
        "docs",
        &KbJobs {
            roots: vec![item.id.clone()],
            jobs: added.jobs,
        },
    );
    let nodes = e.store().read_subtree(&item.node_uri).expect("nodes");
    let before = event_count(e);
    // As after a crash mid-run: the item back in `reading` and its job run again.
    let base = e.store().kb_base("docs").expect("base");
    e.kb_write(
        &base,
        vec![WriteOp::Kb(KbOp::SetStatus {
            base: "docs".into(),
            item: item.id.clone(),
            status: ItemStatus::Reading,
            error: None,
        })],
    )
    .expect("reset");
    let spec =
        ce_server::kb::KbJob::of("docs", Some(&item.id)).spec(ce_server::kb::Stage::Index, None);
    let rerun = e.enqueue_job(spec).expect("enqueue");
    assert!(rerun.created);
    finish(
        e,
        "docs",
        &KbJobs {
            roots: vec![item.id.clone()],
            jobs: vec![rerun.job.id.clone()],
        },
    );
    assert_eq!(
        e.store().read_subtree(&item.node_uri).expect("nodes"),
        nodes,
        "same nodes, no duplicates"
    );
    assert_eq!(event_count(e), before, "nothing changed: no event");
    assert_eq!(
        e.store().kb_item("docs", &item.id).expect("item").status,
        ItemStatus::Completed
    );
    // Re-adding the unchanged file is a re-sync of its item: a reindex, and no event.
    let again = e.kb_add("docs", vec![path(&file)]).expect("add again");
    assert_eq!(again.items[0].id, item.id);
    assert_eq!(again.jobs.len(), 1, "{again:?}");
    finish(
        e,
        "docs",
        &KbJobs {
            roots: vec![item.id.clone()],
            jobs: again.jobs.clone(),
        },
    );
    assert_eq!(
        event_count(e),
        before,
        "re-adding an unchanged input appends no event"
    );
    // Another file of the same name is another item, named guide_1.md.
    let other = tempfile::tempdir().expect("other");
    std::fs::copy(&file, other.path().join("guide.md")).expect("copy");
    let second = e
        .kb_add("docs", vec![path(&other.path().join("guide.md"))])
        .expect("add other");
    assert_eq!(second.items[0].node_uri.name(), "guide_1.md");
}

fn urls_are_fetched_with_content_type_checks_and_failures_stay_per_item(backend: Backend) {
    let kb = open(backend);
    let e = &kb.engine;
    create(e, "web", 256);
    let page = std::fs::read_to_string(fixtures().join("article.html")).expect("html");
    let server = Arc::new(LoopbackServer::start(move |r| match r.path.as_str() {
        "/article.html" => Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
            body: page.clone(),
            delay: None,
        },
        "/image.png" => Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "image/png".into())],
            body: "not really".into(),
            delay: None,
        },
        _ => Reply::error(404, "no such page"),
    }));
    let url = |p: &str| KbInput {
        url: Some(format!("{}{p}", server.base_url())),
        ..KbInput::default()
    };
    let added = e
        .kb_add(
            "web",
            vec![url("/article.html"), url("/image.png"), url("/missing")],
        )
        .expect("add");
    let roots: Vec<String> = added.items.iter().map(|i| i.id.clone()).collect();
    finish(
        e,
        "web",
        &KbJobs {
            roots,
            jobs: added.jobs,
        },
    );
    let all = items(e, "web");
    let status = |suffix: &str| {
        let i = by_source(&all, suffix);
        (i.status, i.error.as_ref().map(|e| e.code.clone()))
    };
    assert_eq!(status("/article.html"), (ItemStatus::Completed, None));
    assert_eq!(
        status("/image.png"),
        (ItemStatus::Failed, Some("unsupported_format".into()))
    );
    assert_eq!(
        status("/missing"),
        (ItemStatus::Failed, Some("not_found".into()))
    );
    let article = by_source(&all, "/article.html");
    let node = e
        .store()
        .read_node(&article.node_uri)
        .expect("read")
        .expect("node");
    assert_eq!(node.meta["kb"]["format"], "html");
    // The PNG's body was never read: refused on its content type.
    let requests = server.requests();
    assert_eq!(
        requests.iter().filter(|r| r.path == "/image.png").count(),
        1
    );
}
