//! Named crash points for the crash-sweep test (issue 5), compiled into debug builds only.
//!
//! `CE_FAILPOINT=<name>` aborts the process the first time execution passes the point
//! `<name>`; `CE_FAILPOINT=<name>:<n>` the n-th time. Abort is `std::process::abort`: no
//! unwinding, no destructors, no flush — the same as a `kill -9` at that line. Release builds
//! compile [`hit`] to nothing. Every point is listed in [`POINTS`] so that the sweep covers
//! each, and [`hit`] refuses (in debug builds) a name that is not listed.

/// The variable that arms one point.
pub const VAR: &str = "CE_FAILPOINT";

/// Every crash point, with where it sits.
pub const POINTS: &[(&str, &str)] = &[
    (
        "store.before_commit",
        "a source write's transaction is complete but not committed",
    ),
    (
        "store.after_commit",
        "a source write committed, before the caller hears of it",
    ),
    (
        "outbox.after_claim",
        "a claim committed, before the worker sees the events",
    ),
    (
        "worker.after_embed",
        "texts embedded, before the index write",
    ),
    (
        "worker.after_index_write",
        "the index written, before mark_done",
    ),
    ("worker.mid_ack", "part of a batch acknowledged"),
    (
        "worker.after_ack",
        "a batch acknowledged, before the next claim",
    ),
    (
        "vector.mid_snapshot",
        "the vector index snapshot written, before its rename",
    ),
    (
        "index.before_commit",
        "an embedded index write complete, before its commit",
    ),
    (
        "lock.after_acquire",
        "an rm / mv / import holds its lease, before it writes",
    ),
    (
        "lock.before_release",
        "an rm / mv wrote under its lease, before it releases it",
    ),
    (
        "lock.after_hand_off",
        "an import handed off its lease, before it commits",
    ),
    (
        "holds.after_adopt",
        "a hold keeper adopted a lease, before the hold ends",
    ),
    (
        "holds.before_end",
        "a hold's lease released, before the hold is ended",
    ),
    (
        "http.before_reply",
        "the server has an answer, before it is sent",
    ),
    (
        "session.phase1.after_lock",
        "a session commit holds the session's lock, before it reads and archives",
    ),
    (
        "session.phase2.between_windows",
        "phase 2 saved a window's candidates on the archive, before the next window's call",
    ),
    (
        "session.phase2.after_extract",
        "phase 2 saved the extracted candidates on the archive, before the merge",
    ),
    (
        "session.phase2.before_commit",
        "phase 2 planned the merge under the memories lock, before its transaction",
    ),
    (
        "reconcile.mid",
        "a reconcile compared an index, before it emits its events",
    ),
];

/// Passes the point `name`: aborts the process when `CE_FAILPOINT` arms it (debug builds).
#[inline]
pub fn hit(name: &'static str) {
    #[cfg(debug_assertions)]
    armed::hit(name);
    #[cfg(not(debug_assertions))]
    let _ = name;
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Armed {
        name: String,
        nth: u64,
        seen: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var(super::VAR).ok()?;
                let (name, nth) = match spec.split_once(':') {
                    Some((n, k)) => (n.to_owned(), k.parse().unwrap_or(1)),
                    None => (spec, 1),
                };
                Some(Armed {
                    name,
                    nth: nth.max(1),
                    seen: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub(super) fn hit(name: &'static str) {
        debug_assert!(
            super::POINTS.iter().any(|(p, _)| *p == name),
            "failpoint {name:?} is not listed in ce_core::failpoint::POINTS"
        );
        let Some(a) = armed() else { return };
        if a.name == name && a.seen.fetch_add(1, Ordering::SeqCst) + 1 == a.nth {
            eprintln!("failpoint {name}: aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_unique_and_described() {
        let mut names: Vec<&str> = POINTS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POINTS.len());
        assert!(POINTS.iter().all(|(n, d)| n.contains('.') && !d.is_empty()));
    }

    #[test]
    fn an_unarmed_point_passes() {
        // The test process has no CE_FAILPOINT; passing a point must not abort.
        hit("store.after_commit");
    }
}
