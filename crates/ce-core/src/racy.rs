//! When a file's stat can stand for its content (git's "racily clean" rule), shared by the
//! two readers that skip unchanged files: `ce import`'s stat cache (docs/store.md) and the
//! knowledge-base re-sync's fingerprints (docs/ingestion.md, "Re-sync").
//!
//! A file system stamps a write with its clock at some granularity (a kernel tick on ext4,
//! XFS or btrfs; 2 s on FAT). A file written again within the same tick after it was read
//! keeps its times, so a stat taken then cannot tell the later write from the read one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long before a stat the file must have last changed (content or status) for that
/// stat to vouch for its content: above any file system's timestamp granularity (FAT's is
/// 2 s; ext4, XFS, btrfs, APFS and NTFS are finer).
pub const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Whether a stat taken at `taken_at_ns` of a file last modified at `mtime_ns` and changed
/// at `ctime_ns` (all ns since the Unix epoch) could miss a later write: the file changed
/// within [`RACY_WINDOW`] before it (or after, by the file system's clock). A tool that
/// sets the modification time back changes the change time, so that counts too.
pub fn is_racy(mtime_ns: i128, ctime_ns: i128, taken_at_ns: i128) -> bool {
    taken_at_ns - mtime_ns.max(ctime_ns) < RACY_WINDOW.as_nanos() as i128
}

/// Nanoseconds since the Unix epoch (negative before it), the unit of [`is_racy`].
pub fn ns_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(i128::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn only_a_change_older_than_the_window_is_settled() {
        assert!(!is_racy(997 * S, 997 * S, 1_000 * S), "3 s old");
        assert!(is_racy(999 * S, 999 * S, 1_000 * S), "1 s old");
        assert!(is_racy(1_005 * S, 1_005 * S, 1_000 * S), "in the future");
        assert!(
            is_racy(500 * S, 999 * S, 1_000 * S),
            "mtime set back: ctime is new"
        );
        let window = RACY_WINDOW.as_nanos() as i128;
        assert!(!is_racy(1_000 * S - window - 1, 0, 1_000 * S));
        assert!(is_racy(1_000 * S - window + 1, 0, 1_000 * S));
    }
}
