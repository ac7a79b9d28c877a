//! The filesystem and redis providers across processes: this test binary re-executed as
//! children (`mutex_child`, `holder_child`), which do nothing unless their environment says
//! so.
//!
//! - four processes × 50 critical sections on one path never overlap, and each sees a fence
//!   newer than the previous holder's;
//! - a holder killed with SIGKILL leaves its token, which goes stale: another process gets
//!   the lock within `expire` plus a margin, with a newer fence.
//!
//! Redis runs against `CE_REDIS_URL` (default `redis://127.0.0.1:6379`) in a fresh namespace
//! and fails, never skips, when the server is unreachable.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ce_lock::filesystem::FilesystemProvider;
use ce_lock::redis::RedisProvider;
use ce_lock::{LockManager, LockProvider, LockRequest, LockSettings};

use crate::suite::{critical_sections, read_state, uri, write_state};

const DIR_ENV: &str = "CE_LOCK_CHILD_DIR";
const ROLE_ENV: &str = "CE_LOCK_CHILD_ROLE";
/// `filesystem`, or the redis service namespace to use.
const PROVIDER_ENV: &str = "CE_LOCK_CHILD_PROVIDER";
const ITERATIONS: usize = 50;

fn child_role() -> Option<(String, std::path::PathBuf)> {
    let dir = std::env::var_os(DIR_ENV)?;
    let role = std::env::var(ROLE_ENV).ok()?;
    Some((role, dir.into()))
}

fn redis_url() -> String {
    std::env::var("CE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The provider a process of the test uses: `filesystem`, or redis in namespace `service`.
fn open(dir: &Path, provider: &str) -> Arc<dyn LockProvider> {
    match provider {
        "filesystem" => {
            Arc::new(FilesystemProvider::open(&dir.join("locks")).expect("open lock dir"))
        }
        service => Arc::new(
            RedisProvider::connect(&redis_url(), service)
                .unwrap_or_else(|e| panic!("redis at {} unreachable: {e}", redis_url())),
        ),
    }
}

fn child_provider() -> String {
    std::env::var(PROVIDER_ENV).expect("provider of the child")
}

/// A fresh redis namespace for one test (deleted at its end).
fn redis_namespace() -> String {
    format!("ce-lock-mp-{}", uuid::Uuid::now_v7().simple())
}

fn delete_namespace(service: &str) {
    let Ok(mut con) = redis::Client::open(redis_url())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
    else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", ce_lock::redis::key_prefix(service)))
        .query(&mut con)
        .unwrap_or_default();
    if !keys.is_empty() {
        let _ = redis::cmd("DEL").arg(&keys).query::<i64>(&mut con);
    }
}

/// Child: 50 critical sections. A no-op in a normal test run.
#[test]
fn mutex_child() {
    let Some((role, dir)) = child_role() else {
        return;
    };
    assert_eq!(role, "mutex");
    critical_sections(
        open(&dir, &child_provider()),
        &dir.join("state"),
        ITERATIONS,
    );
    println!("\nDONE {ITERATIONS}");
}

#[test]
fn filesystem_processes_exclude_each_other() {
    processes_exclude_each_other("filesystem");
}

#[test]
fn redis_processes_exclude_each_other() {
    let service = redis_namespace();
    processes_exclude_each_other(&service);
    delete_namespace(&service);
}

fn processes_exclude_each_other(provider: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_state(&dir.path().join("state"), false, 0);
    let child = ce_testkit::test_name(module_path!(), "mutex_child");
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().expect("current exe"))
                .args(["--exact", &child, "--nocapture", "--test-threads=1"])
                .env(DIR_ENV, dir.path())
                .env(ROLE_ENV, "mutex")
                .env(PROVIDER_ENV, provider)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("child output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("DONE {ITERATIONS}")),
            "child failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (inside, last) = read_state(&dir.path().join("state"));
    assert!(!inside);
    assert!(last > 0);
}

const HOLDER_EXPIRE: Duration = Duration::from_secs(1);

/// Child: takes a TREE lock, reports it and holds it (renewing) until killed.
#[test]
fn holder_child() {
    let Some((role, dir)) = child_role() else {
        return;
    };
    assert_eq!(role, "holder");
    let m = LockManager::new(
        open(&dir, &child_provider()),
        LockSettings {
            expire: HOLDER_EXPIRE,
            wait: Duration::ZERO,
        },
    );
    let lease = m
        .acquire(&[LockRequest::tree(uri("ctx://k/docs"))])
        .expect("child acquires");
    let mut out = std::io::stdout();
    writeln!(
        out,
        "\nHELD {} {}",
        lease.owner(),
        lease.fences()[0].token.0
    )
    .and_then(|()| out.flush())
    .expect("report");
    loop {
        std::thread::sleep(Duration::from_secs(1));
        lease.check().expect("the child keeps its lease");
    }
}

/// Runs a holder child on `provider`, kills it with SIGKILL while it holds
/// `Tree(ctx://k/docs)`, and returns its owner id and fence.
fn kill_a_holder(dir: &Path, provider: &str) -> (String, u64) {
    let child = ce_testkit::test_name(module_path!(), "holder_child");
    let lines = ce_testkit::run_and_kill(
        &child,
        &[
            (DIR_ENV, dir.display().to_string()),
            (ROLE_ENV, "holder".to_owned()),
            (PROVIDER_ENV, provider.to_owned()),
        ],
        Duration::from_secs(4),
        &dir.join("child.log"),
    );
    let held = lines
        .iter()
        .find_map(|l| l.strip_prefix("HELD "))
        .unwrap_or_else(|| panic!("the child never reported its lock: {lines:?}"));
    let (owner, fence) = held.split_once(' ').expect("HELD owner fence");
    (owner.to_owned(), fence.parse().expect("fence"))
}

/// The dead holder's lock goes stale after `expire`; the wait bounds how long that may take.
fn taken_over(provider: Arc<dyn LockProvider>, fence: u64) {
    let margin = Duration::from_secs(10);
    let m = LockManager::new(
        provider,
        LockSettings {
            expire: HOLDER_EXPIRE,
            wait: HOLDER_EXPIRE + margin,
        },
    );
    let lease = m
        .acquire(&[LockRequest::exact(uri("ctx://k/docs/a.md"))])
        .expect("the dead holder's lock goes stale");
    assert!(lease.fences()[0].token.0 > fence);
}

#[test]
fn a_killed_redis_holder_loses_the_lock_after_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = redis_namespace();
    let (owner, fence) = kill_a_holder(dir.path(), &service);
    // The SIGKILL left the token in place.
    let mut con = redis::Client::open(redis_url())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("redis");
    let key = format!(
        "{}scope:account:k:tokens",
        ce_lock::redis::key_prefix(&service)
    );
    let left: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("ctx://k/docs")
        .query(&mut con)
        .expect("HGET");
    assert!(
        left.as_deref()
            .is_some_and(|t| t.starts_with(&format!("{owner}:"))),
        "token left by the killed child: {left:?}"
    );
    taken_over(open(dir.path(), &service), fence);
    delete_namespace(&service);
}

#[test]
fn a_killed_holder_loses_the_lock_after_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (owner, fence) = kill_a_holder(dir.path(), "filesystem");
    // The SIGKILL left the token in place.
    let provider = FilesystemProvider::open(&dir.path().join("locks")).expect("open");
    let loc = provider.location(&LockRequest::tree(uri("ctx://k/docs")));
    let token = std::fs::read_to_string(&loc).expect("token left by the killed child");
    assert!(token.starts_with(&format!("{owner}:")), "{token}");
    taken_over(Arc::new(provider), fence);
    assert!(
        !std::fs::read_to_string(&loc).is_ok_and(|t| t.starts_with(&format!("{owner}:"))),
        "the stale token was removed"
    );
}
