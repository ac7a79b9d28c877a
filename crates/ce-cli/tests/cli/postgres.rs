//! The PostgreSQL backend through the real binary: `--store URL` (and `CE_STORE`) selects it
//! for every local command, `ce migrate` applies the schema once however many processes run
//! it, a bad URL is a typed error, and a write from one process wakes the workers of another
//! through `LISTEN ce_outbox`. Each test gets a fresh database (`ce_testkit::pg::TestDb`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use ce_testkit::pg::{Gate, TestDb};
use serde_json::Value;

use super::harness::{Ce, Server, eventually, success};

/// `ce --json --store URL ARGS` in `ce`'s data directory; asserts success.
fn pg(ce: &Ce, url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--store", url];
    all.extend_from_slice(args);
    ce.json(&all)
}

/// The stats row of `consumer` in an `outbox stats` answer.
fn stats_of<'a>(stats: &'a Value, consumer: &str) -> &'a Value {
    stats
        .as_array()
        .expect("stats array")
        .iter()
        .find(|s| s["consumer"] == consumer)
        .unwrap_or_else(|| panic!("no {consumer} in {stats}"))
}

#[test]
fn migrate_applies_the_schema_once_and_then_reports_it() {
    let db = TestDb::create("cli_migrate");
    let ce = Ce::new();
    let first = pg(&ce, db.url(), &["migrate"]);
    assert_eq!(first["backend"], "postgres", "{first}");
    assert_eq!(first["location"], db.url(), "{first}");
    assert_eq!(first["from"], 0, "{first}");
    let version = first["to"].as_i64().expect("to");
    assert!(version >= 1, "{first}");

    let second = pg(&ce, db.url(), &["migrate"]);
    assert_eq!(
        (second["from"].as_i64(), second["to"].as_i64()),
        (Some(version), Some(version))
    );
    let human = ce.ok(&["--store", db.url(), "migrate"]);
    assert!(
        human.contains("postgres") && human.contains("up to date"),
        "{human}"
    );
    // The store lives in the database: nothing was created in the data directory for it.
    assert!(!ce.data_dir().join("ce.db").exists());

    // Without --store: the embedded file, migrated when opened, reported the same way.
    let local = ce.json(&["migrate"]);
    assert_eq!(local["backend"], "sqlite", "{local}");
    assert_eq!(local["from"], 0, "{local}");
    let sqlite_version = local["to"].as_i64().expect("to");
    assert!(sqlite_version >= 1, "{local}");
    let again = ce.json(&["migrate"]);
    assert_eq!(
        (again["from"].as_i64(), again["to"].as_i64()),
        (Some(sqlite_version), Some(sqlite_version))
    );
}

#[test]
fn four_processes_migrating_at_once_all_succeed_with_one_schema() {
    let db = TestDb::create("cli_migrate_race");
    let ce = Ce::new();
    let children: Vec<_> = (0..4)
        .map(|_| {
            ce.command(&["--json", "--store", db.url(), "migrate"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("ce migrate starts")
        })
        .collect();
    let reports: Vec<Value> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("ce migrate runs");
            let text = success(&["migrate"], out);
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        })
        .collect();
    let version = reports[0]["to"].as_i64().expect("to");
    assert!(version >= 1, "{reports:?}");
    for r in &reports {
        assert_eq!(r["to"].as_i64(), Some(version), "{reports:?}");
        assert!(
            r["from"]
                .as_i64()
                .is_some_and(|f| (0..=version).contains(&f)),
            "{r}"
        );
    }
    // Each migration was recorded once.
    let mut client = ce_testkit::pg::connect(db.url());
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT version), max(version) FROM ce_schema_migrations",
            &[],
        )
        .expect("read migrations");
    let (rows, distinct, max): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((rows, distinct, max), (version, version, version));
    let after = pg(&ce, db.url(), &["migrate"]);
    assert_eq!(
        (after["from"].as_i64(), after["to"].as_i64()),
        (Some(version), Some(version))
    );
}

#[test]
fn node_and_outbox_commands_run_against_postgres() {
    let db = TestDb::create("cli_nodes");
    let url = db.url();
    let ce = Ce::new();
    let created = pg(
        &ce,
        url,
        &[
            "put",
            "ctx://acc/docs/a",
            "--content",
            "alpha",
            "--abstract",
            "A",
        ],
    );
    assert_eq!(created["version"], 1, "{created}");
    assert_eq!(created["changed"], true, "{created}");
    let cat = ce.ok(&["--store", url, "cat", "ctx://acc/docs/a"]);
    assert_eq!(cat.trim_end(), "alpha");
    let l0 = pg(&ce, url, &["cat", "ctx://acc/docs/a", "--level", "0"]);
    assert_eq!(l0["text"], "A", "{l0}");
    pg(&ce, url, &["put", "ctx://acc/docs/b", "--content", "beta"]);

    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|n| n["uri"].as_str().expect("uri").to_owned())
            .collect()
    };
    assert_eq!(names(&pg(&ce, url, &["ls"])), ["ctx://acc"]);
    assert_eq!(
        names(&pg(&ce, url, &["ls", "ctx://acc/docs"])),
        ["ctx://acc/docs/a", "ctx://acc/docs/b"]
    );

    // Another data directory (another host, as far as the store knows) sees the same nodes.
    let other = Ce::new();
    assert_eq!(
        names(&pg(&other, url, &["ls", "ctx://acc/docs"])),
        ["ctx://acc/docs/a", "ctx://acc/docs/b"]
    );
    // CE_STORE works like --store.
    let out = other
        .command(&["--json", "stat", "ctx://acc/docs/b"])
        .env("CE_STORE", url)
        .output()
        .expect("ce runs");
    let stat: Value = serde_json::from_str(&success(&["stat"], out)).expect("JSON");
    assert_eq!(stat["uri"], "ctx://acc/docs/b", "{stat}");

    let moved = pg(&ce, url, &["mv", "ctx://acc/docs/b", "ctx://acc/archive/b"]);
    assert_eq!(moved["uri"], "ctx://acc/archive/b", "{moved}");
    assert_eq!(
        ce.ok(&["--store", url, "cat", "ctx://acc/archive/b"])
            .trim_end(),
        "beta"
    );
    let gone = ce.fail(&["--store", url, "cat", "ctx://acc/docs/b"], 3);
    assert_eq!(gone.error["code"], "not_found");

    pg(&ce, url, &["rm", "ctx://acc/docs/a"]);
    let gone = ce.fail(&["--store", url, "stat", "ctx://acc/docs/a"], 3);
    assert_eq!(gone.error["code"], "not_found");
    let refused = ce.fail(&["--store", url, "rm", "ctx://acc/archive"], 4);
    assert_eq!(refused.error["code"], "not_empty");

    // Every write appended its events: puts (with the created ancestors), the move, the rm.
    let stats = pg(&ce, url, &["outbox", "stats"]);
    let vector = stats_of(&stats, "vector");
    let events =
        vector["pending"].as_u64().expect("pending") + vector["done"].as_u64().expect("done");
    let rows = pg(
        &ce,
        url,
        &["outbox", "list", "--consumer", "vector", "--limit", "1000"],
    );
    assert_eq!(
        rows.as_array().expect("rows").len() as u64,
        events,
        "{stats}"
    );
    let types: Vec<&str> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["event"]["event_type"].as_str().expect("type"))
        .collect();
    assert!(
        types.contains(&"MOVE_CONTEXT") && types.contains(&"DELETE_CONTEXT"),
        "{types:?}"
    );
    let first = rows[0]["event"]["event_id"].as_str().expect("event id");
    let shown = pg(&ce, url, &["outbox", "show", first]);
    assert_eq!(shown["event"]["event_id"], first, "{shown}");
    // None of it touched the embedded store.
    assert!(!ce.data_dir().join("ce.db").exists());
    assert!(!other.data_dir().join("ce.db").exists());
}

#[test]
fn a_bad_store_url_is_a_typed_error_that_names_it() {
    let ce = Ce::new();
    // Not a PostgreSQL URL: bad configuration (exit 2), the key named, the password not.
    let f = ce.fail(&["--store", "mysql://root:hunter2@db/ce", "ls"], 2);
    assert_eq!(f.error["code"], "invalid_config", "{:?}", f.error);
    let msg = f.error["message"].as_str().expect("message");
    assert!(
        msg.contains("store.url") && !msg.contains("hunter2"),
        "{msg}"
    );
    let f = ce.fail(&["--store", "postgres://u@h:notaport/x", "migrate"], 2);
    assert_eq!(f.error["code"], "invalid_config", "{:?}", f.error);
    // The same in the configuration file.
    ce.write_config("[store]\nurl = \"sqlite:///tmp/x.db\"\n");
    let f = ce.fail(&["put", "ctx://acc/a", "--content", "x"], 2);
    assert!(
        f.error["message"]
            .as_str()
            .expect("message")
            .contains("store.url"),
        "{:?}",
        f.error
    );
    std::fs::remove_file(ce.data_dir().join("ce.toml")).expect("rm ce.toml");
    // A server that does not answer: unavailable (exit 6, retryable), naming where.
    let t0 = Instant::now();
    let f = ce.fail(
        &[
            "--store",
            "postgres://postgres:pw@127.0.0.1:1/nowhere",
            "ls",
        ],
        6,
    );
    assert_eq!(f.error["code"], "unavailable", "{:?}", f.error);
    assert_eq!(f.error["retryable"], true, "{:?}", f.error);
    let msg = f.error["message"].as_str().expect("message");
    assert!(
        msg.contains("127.0.0.1:1") && !msg.contains(":pw@"),
        "{msg}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    // A database or role the server does not know: bad configuration again, named.
    let missing = ce_testkit::pg::with_database(&ce_testkit::pg::admin_url(), "ce_no_such_db");
    let f = ce.fail(&["--store", &missing, "ls"], 2);
    assert_eq!(f.error["code"], "invalid_config", "{:?}", f.error);
    let msg = f.error["message"].as_str().expect("message");
    assert!(
        msg.contains("store.url") && msg.contains("ce_no_such_db"),
        "{msg}"
    );
    // Human output names the code too.
    let out = ce.run(&["--store", "mysql://db/ce", "ls"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[invalid_config]") && stderr.contains("store.url"),
        "{stderr}"
    );
    // A refused URL never created the embedded store.
    assert!(!ce.data_dir().join("ce.db").exists());
}

/// A `search_path` (set through the URL's `options`) naming a schema that does not exist is
/// a bad `store.url` naming the schema, not an internal error with a raw SQLSTATE; the same
/// URL works once the schema exists.
#[test]
fn a_search_path_naming_a_missing_schema_is_a_config_error() {
    let db = TestDb::create("cli_search_path");
    let ce = Ce::new();
    let sep = if db.url().contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-csearch_path%3Dce_no_such_schema", db.url());
    let f = ce.fail(&["--store", &url, "ls"], 2);
    assert_eq!(f.error["code"], "invalid_config", "{:?}", f.error);
    assert_eq!(f.error["retryable"], false, "{:?}", f.error);
    let msg = f.error["message"].as_str().expect("message");
    assert!(
        msg.contains("store.url") && msg.contains("ce_no_such_schema"),
        "{msg}"
    );
    let mut admin = ce_testkit::pg::connect(db.url());
    admin
        .batch_execute("CREATE SCHEMA ce_no_such_schema")
        .expect("create schema");
    drop(admin);
    assert_eq!(pg(&ce, &url, &["ls"]), serde_json::json!([]));
}

#[test]
fn workers_and_status_use_the_postgres_store() {
    let db = TestDb::create("cli_worker");
    let url = db.url();
    let ce = Ce::hash("[index.outbox]\nconsumers = [\"keyword\"]\n");
    pg(
        &ce,
        url,
        &[
            "put",
            "ctx://acc/notes/n1",
            "--content",
            "the quick brown fox",
        ],
    );
    pg(
        &ce,
        url,
        &["put", "ctx://acc/notes/n2", "--content", "lazy dogs sleep"],
    );
    let drained = pg(&ce, url, &["worker", "--once"]);
    assert!(
        drained["progress"]["succeeded"]
            .as_u64()
            .is_some_and(|n| n >= 2),
        "{drained}"
    );
    let stats = pg(&ce, url, &["outbox", "stats"]);
    let keyword = stats_of(&stats, "keyword");
    assert_eq!(
        (keyword["pending"].as_u64(), keyword["claimed"].as_u64()),
        (Some(0), Some(0)),
        "{stats}"
    );
    let hits = pg(&ce, url, &["search", "fox", "--mode", "keyword"]);
    let uris: Vec<&str> = hits["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| h["uri"].as_str().expect("uri"))
        .collect();
    assert_eq!(uris, ["ctx://acc/notes/n1"], "{hits}");
    let status = pg(&ce, url, &["status"]);
    assert_eq!(status["store_backend"], "postgres", "{status}");
    assert_eq!(status["store_location"], url, "{status}");
}

/// `ce worker` and `ce serve` started while their database refuses connections (a restart:
/// the gate closes every connection at once) wait for it, saying why in their log, and run
/// once it is back; a one-shot command fails at once instead (above: unavailable, exit 6).
#[test]
fn daemons_started_while_the_database_is_down_wait_for_it() {
    let db = TestDb::create("cli_start_down");
    let ce = Ce::hash("[index.outbox]\nconsumers = [\"keyword\"]\n");
    pg(
        &ce,
        db.url(),
        &["put", "ctx://acc/notes/n1", "--content", "waiting worker"],
    );
    let waiting = "the store is unavailable: starting again";

    let gate = Gate::start(db.url(), false);
    let gated = gate.url(db.url());
    let log_path = ce.data_dir().join("worker.log");
    let log = std::fs::File::create(&log_path).expect("worker log");
    let mut worker = ce
        .command(&["--store", &gated, "worker", "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ce worker starts");
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let warned = eventually(Duration::from_secs(20), || {
        read_log().contains(waiting).then_some(())
    });
    assert!(warned.is_some(), "no warning while down:\n{}", read_log());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        worker.try_wait().expect("wait").is_none(),
        "the worker exited while the database was down:\n{}",
        read_log()
    );
    gate.open();
    let keyword_open = || {
        let stats = pg(&ce, db.url(), &["outbox", "stats"]);
        let k = stats_of(&stats, "keyword");
        k["pending"].as_u64().unwrap_or(1)
            + k["claimed"].as_u64().unwrap_or(1)
            + k["retry_wait"].as_u64().unwrap_or(1)
    };
    let drained = eventually(Duration::from_secs(60), || {
        (keyword_open() == 0).then_some(())
    });
    assert!(drained.is_some(), "not drained once up:\n{}", read_log());
    assert!(worker.try_wait().expect("wait").is_none(), "{}", read_log());
    let _ = worker.kill();
    let _ = worker.wait();

    // The server: it binds only once its engine is open.
    let gate = Gate::start(db.url(), false);
    let gated = gate.url(db.url());
    let server = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            gate.open();
        });
        ce.serve(&["--store", &gated, "--workers", "1"])
    });
    assert!(server.log().contains(waiting), "{}", server.log());
    let (status, body) = server.post(
        "/v1/search",
        &serde_json::json!({"query": "waiting", "mode": "keyword"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"][0]["uri"], "ctx://acc/notes/n1", "{body}");
    let (code, _) = server.stop();
    assert_eq!(code, Some(0));
}

/// A write committed by one process wakes the workers of a `ce serve` in another at once,
/// through `LISTEN ce_outbox`: the server polls only every 60 s here.
#[test]
fn a_commit_in_another_process_wakes_the_server_workers() {
    let db = TestDb::create("cli_listen");
    let url = db.url();
    let ce = Ce::hash(
        "[index.outbox]\nconsumers = [\"keyword\"]\n[index.worker]\npoll_interval_ms = 60000\n",
    );
    pg(&ce, url, &["migrate"]);
    let server = ce.serve(&["--store", url, "--workers", "1"]);
    let lag = |server: &Server| -> Option<u64> {
        let (_, s) = server.get("/v1/status");
        s["consumers"]
            .as_array()?
            .iter()
            .find(|c| c["consumer"] == "keyword")?["lag_events"]
            .as_u64()
    };
    // Let the workers go idle (their first round finds nothing), then write elsewhere.
    assert_eq!(
        eventually(Duration::from_secs(10), || lag(&server).filter(|l| *l == 0)),
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(300));
    let other = Ce::hash("[index.outbox]\nconsumers = [\"keyword\"]\n");
    let t0 = Instant::now();
    pg(
        &other,
        url,
        &[
            "put",
            "ctx://acc/notes/hint",
            "--content",
            "woken by a notification",
        ],
    );
    let drained = eventually(Duration::from_secs(20), || lag(&server).filter(|l| *l == 0));
    assert_eq!(drained, Some(0), "{}", server.log());
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "indexed after {:?}: the poll, not the hint\n{}",
        t0.elapsed(),
        server.log()
    );
    let (status, body) = server.post(
        "/v1/search",
        &serde_json::json!({"query": "notification", "mode": "keyword"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"][0]["uri"], "ctx://acc/notes/hint", "{body}");
    assert!(
        server.metric("ce_outbox_notifications_total", &[]) >= 1.0,
        "{}",
        server.text("/metrics").1
    );
    let (code, _) = server.stop();
    assert_eq!(code, Some(0));
}

/// `destination = "pgvector"` without a URL of its own takes `--store`'s; without either it
/// is a configuration error naming `index.vector.pgvector_url`.
#[test]
fn a_pgvector_destination_takes_its_url_from_the_store() {
    let db = TestDb::create("cli_pgvector_url");
    let ce = Ce::new();
    ce.write_config("[index.vector]\ndestination = \"pgvector\"\n");
    let f = ce.fail(&["ls"], 2);
    assert_eq!(f.error["code"], "invalid_config", "{:?}", f.error);
    let msg = f.error["message"].as_str().expect("message");
    assert!(msg.contains("index.vector.pgvector_url"), "{msg}");
    // Node commands need only the store.
    let listed = pg(&ce, db.url(), &["ls"]);
    assert_eq!(listed, serde_json::json!([]));
}

/// With `destination = "pgvector"` the vector index is shared: two `ce worker --consumer
/// vector` processes on one data directory run at once (no embedded index, no LOCK), and a
/// third process searches what they wrote.
#[test]
fn pgvector_vector_workers_share_one_index() {
    let db = TestDb::create("cli_pgvector");
    let vectors = ce_testkit::pgvector::test_db("cli_pgvector");
    let ce = Ce::hash(&format!(
        "[index.outbox]\nconsumers = [\"vector\", \"keyword\"]\n\
         [index.vector]\ndestination = \"pgvector\"\npgvector_url = \"{}\"\n",
        vectors.url()
    ));
    let url = db.url();
    for (i, text) in [
        "dark mode in the terminal",
        "refunds within thirty days",
        "quarterly planning",
    ]
    .iter()
    .enumerate()
    {
        pg(
            &ce,
            url,
            &["put", &format!("ctx://acc/notes/n{i}"), "--content", text],
        );
    }
    let workers: Vec<_> = (0..2)
        .map(|_| {
            ce.command(&[
                "--json",
                "--store",
                url,
                "worker",
                "--once",
                "--consumer",
                "vector",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ce worker starts")
        })
        .collect();
    let mut indexed = 0;
    for w in workers {
        let text = success(&["worker"], w.wait_with_output().expect("ce worker runs"));
        let report: Value = serde_json::from_str(&text).expect("JSON");
        indexed += report["progress"]["succeeded"].as_u64().expect("succeeded");
    }
    // The account and the parent container come with the three leaves.
    assert!(indexed >= 3, "{indexed}");
    let stats = pg(&ce, url, &["outbox", "stats"]);
    let vector = stats_of(&stats, "vector");
    assert_eq!(
        (vector["pending"].as_u64(), vector["claimed"].as_u64()),
        (Some(0), Some(0)),
        "{stats}"
    );
    // The keyword consumer was not served, so its index was not even opened.
    assert_eq!(stats_of(&stats, "keyword")["done"], 0, "{stats}");
    assert!(
        !ce.data_dir().join("vector").exists(),
        "an embedded vector index was created"
    );
    assert!(
        !ce.data_dir().join("keyword").exists(),
        "the keyword index was opened"
    );

    let hits = pg(
        &ce,
        url,
        &[
            "search",
            "refunds thirty days",
            "--mode",
            "vector",
            "--min-score",
            "0.3",
        ],
    );
    assert_eq!(hits["hits"][0]["uri"], "ctx://acc/notes/n1", "{hits}");
    let status = pg(&ce, url, &["status"]);
    assert_eq!(status["vector_destination"], "pgvector", "{status}");
    assert!(
        status["index_records"].as_u64().is_some_and(|n| n >= 3),
        "{status}"
    );
}

/// Two data directories on one PostgreSQL store: the first to consume the embedded keyword
/// consumer owns it; a `ce worker --consumer keyword` from the second is refused before it
/// claims anything, naming both instances and the fixes; the pgvector vector consumer (a
/// shared destination) works from both; `ce reindex --take-over` moves the consumer to the
/// second, whose index is then complete, and the first is refused in turn.
#[test]
fn an_embedded_consumer_is_owned_by_one_data_directory() {
    let db = TestDb::create("cli_owner");
    let vectors = ce_testkit::pgvector::test_db("cli_owner");
    let config = format!(
        "[index.outbox]\nconsumers = [\"vector\", \"keyword\"]\n\
         [index.vector]\ndestination = \"pgvector\"\npgvector_url = \"{}\"\n",
        vectors.url()
    );
    let (a, b) = (Ce::hash(&config), Ce::hash(&config));
    let url = db.url();
    let put = |i: usize| {
        pg(
            &a,
            url,
            &[
                "put",
                &format!("ctx://acc/notes/n{i}"),
                "--content",
                &format!("note number {i} about owners"),
            ],
        )
    };
    for i in 0..3 {
        put(i);
    }
    pg(&a, url, &["worker", "--once", "--consumer", "keyword"]);
    for i in 3..5 {
        put(i);
    }
    let refused = b.fail(
        &["--store", url, "worker", "--once", "--consumer", "keyword"],
        2,
    );
    assert_eq!(
        refused.error["code"], "invalid_config",
        "{:?}",
        refused.error
    );
    assert_eq!(refused.error["retryable"], false, "{:?}", refused.error);
    let msg = refused.error["message"].as_str().expect("message");
    for part in [
        "\"keyword\"",
        a.data_dir().to_str().expect("utf-8"),
        b.data_dir().to_str().expect("utf-8"),
        "pgvector",
        "--take-over",
    ] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
    let stats = pg(&a, url, &["outbox", "stats"]);
    assert_eq!(
        stats_of(&stats, "keyword")["pending"],
        2,
        "the refused worker claimed: {stats}"
    );

    // The shared destination has no owner: vector workers run from both data directories.
    pg(&a, url, &["worker", "--once", "--consumer", "vector"]);
    put(5);
    pg(&b, url, &["worker", "--once", "--consumer", "vector"]);
    let stats = pg(&b, url, &["outbox", "stats"]);
    assert_eq!(stats_of(&stats, "vector")["pending"], 0, "{stats}");

    // The second takes the consumer over and rebuilds its index from the source.
    pg(
        &b,
        url,
        &["reindex", "--consumer", "keyword", "--take-over"],
    );
    let hits = pg(
        &b,
        url,
        &["search", "note number 4 about owners", "--mode", "keyword"],
    );
    let found: Vec<&str> = hits["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["uri"].as_str())
        .collect();
    for i in 0..6 {
        let u = format!("ctx://acc/notes/n{i}");
        assert!(found.contains(&u.as_str()), "{u} missing from {hits}");
    }
    let refused = a.fail(
        &["--store", url, "worker", "--once", "--consumer", "keyword"],
        2,
    );
    let msg = refused.error["message"].as_str().expect("message");
    assert!(
        msg.contains(b.data_dir().to_str().expect("utf-8")),
        "the owner is now the second: {msg}"
    );
}
