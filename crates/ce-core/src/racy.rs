//! When a file's stat can stand for its content (git's "racily clean" rule), shared by the
//! two readers that skip unchanged files: `ce import`'s stat cache (docs/store.md) and the
//! knowledge-base re-sync's fingerprints (docs/ingestion.md, "Re-sync").
//!
//! A file system stamps a write with its clock at some granularity (a kernel tick on ext4,
//! XFS or btrfs; 2 s on FAT). A file written again within the same tick after it was read
//! keeps its times, so a stat taken then cannot tell the later write from the read one.

use std::fs::Metadata;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long before a stat the file must have last changed (content or status) for that
/// stat to vouch for its content: above any file system's timestamp granularity (FAT's is
/// 2 s; ext4, XFS, btrfs, APFS and NTFS are finer). A window of a kernel tick would do on a
/// local file system; 2 s also absorbs a network file system's server clock running behind
/// this host's (its times are the server's, the moment compared with them is ours).
pub const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Whether a stat taken at `taken_at_ns` of a file last modified at `mtime_ns` and changed
/// at `ctime_ns` (all ns since the Unix epoch) could miss a later write: the file changed
/// within [`RACY_WINDOW`] before it (or after, by the file system's clock). A tool that
/// sets the modification time back changes the change time, so that counts too.
fn is_racy(mtime_ns: i128, ctime_ns: i128, taken_at_ns: i128) -> bool {
    taken_at_ns - mtime_ns.max(ctime_ns) < RACY_WINDOW.as_nanos() as i128
}

/// What a file's stat says about its content without reading it (the check git and rsync
/// make): equal stats of one path, settled before the earlier one was taken
/// ([`FileStat::settled_before`]), mean the same content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStat {
    /// Its inode (Unix; 0 elsewhere): a file replaced by another (a rename over it) has
    /// another one.
    pub ino: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Its modification time, in ns since the Unix epoch (negative before it; saturated at
    /// the ends of `i64`, the years 1677 and 2262).
    pub mtime_ns: i64,
    /// Its status change time (Unix; 0 elsewhere): changes with any write, and when a tool
    /// sets the modification time back.
    pub ctime_ns: i64,
}

impl FileStat {
    /// The stat of `meta` (of whatever it was taken of: a symlink's target through
    /// `std::fs::metadata`, the link through `symlink_metadata`).
    pub fn of(meta: &Metadata) -> FileStat {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            FileStat::unix(
                meta.ino(),
                meta.len(),
                (meta.mtime(), meta.mtime_nsec()),
                (meta.ctime(), meta.ctime_nsec()),
            )
        }
        #[cfg(not(unix))]
        {
            let mtime = meta.modified().map_or(0, ns_since_epoch);
            FileStat {
                ino: 0,
                size: meta.len(),
                mtime_ns: mtime.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                ctime_ns: 0,
            }
        }
    }

    /// The stat of a Unix `stat` record: inode, size, and modification and change times as
    /// (seconds, nanoseconds) since the epoch.
    pub fn unix(ino: u64, size: u64, mtime: (i64, i64), ctime: (i64, i64)) -> FileStat {
        let ns = |(s, n): (i64, i64)| s.saturating_mul(1_000_000_000).saturating_add(n);
        FileStat {
            ino,
            size,
            mtime_ns: ns(mtime),
            ctime_ns: ns(ctime),
        }
    }

    /// Whether any change made after `taken_at_ns` (ns since the epoch) would show in these
    /// times: they lie before it by more than [`RACY_WINDOW`].
    pub fn settled_before(&self, taken_at_ns: i128) -> bool {
        !is_racy(self.mtime_ns.into(), self.ctime_ns.into(), taken_at_ns)
    }
}

/// Nanoseconds since the Unix epoch (negative before it), the unit of [`FileStat::settled_before`].
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

    #[test]
    fn a_stat_is_settled_by_both_its_times_and_saturates_at_the_ends() {
        let s = FileStat::unix(7, 10, (997, 0), (997, 5));
        assert_eq!((s.mtime_ns, s.ctime_ns), (997_000_000_000, 997_000_000_005));
        assert!(s.settled_before(1_000 * S));
        assert!(!s.settled_before(998 * S));
        let set_back = FileStat::unix(7, 10, (500, 0), (999, 0));
        assert!(!set_back.settled_before(1_000 * S), "ctime is new");
        let far = FileStat::unix(1, 1, (i64::MAX / 2, 0), (i64::MIN / 2, 0));
        assert_eq!((far.mtime_ns, far.ctime_ns), (i64::MAX, i64::MIN));
    }

    #[cfg(unix)]
    #[test]
    fn a_files_metadata_gives_its_stat() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = std::env::temp_dir().join(format!("ce-racy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        std::fs::write(&path, b"twelve bytes").expect("write");
        let meta = std::fs::metadata(&path).expect("stat");
        let s = FileStat::of(&meta);
        assert_eq!((s.ino, s.size), (meta.ino(), 12));
        assert_eq!(
            i128::from(s.mtime_ns),
            ns_since_epoch(meta.modified().expect("mtime"))
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
